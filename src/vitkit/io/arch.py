"""The architecture of foreign weights: a ViTConfig from what they show and what is known besides.

Each format's ``infer`` reads from the weights (and HF's config.json) what is visible there: width,
depth, patch size, channels, class and register tokens, classes, pooling, qkv bias, qk-norm,
LayerScale, and heads where the format stores them (HF config, JAX (D, H, hd) kernels); the image
size is read from a learned position table's length. What the weights do not show is taken, in this
order of precedence, from ``--set KEY=VALUE`` overrides, a named vitkit model (``--model NAME``),
then defaults that are reported as assumed. ``arch_config`` merges these into one ViTConfig.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..core.errors import CheckpointError, ConfigError
from ..core.strict import parse_override, to_hw
from ..model.config import ViTConfig
from ..model.variants import SIZES, get_config

# Fields that name the network's structure: a named model (--model) must agree with the weights on them.
STRUCTURAL = ("embed_dim", "depth", "patch_size", "in_chans", "mlp_ratio")


def mlp_ratio_for(hidden: int, dim: int) -> float:
    """The float ratio r with int(dim * r) == hidden (so that ViTConfig.mlp_hidden gives back ``hidden``)."""
    r = hidden / dim
    while int(dim * r) < hidden:  # e.g. 6144 / 1408 * 1408 = 6143.999...
        r = math.nextafter(r, math.inf)
    return r


def heads_from_width(dim: int) -> int | None:
    """Heads of the named size with this width (variants.SIZES), else width / 64, else None."""
    for width, _, heads, _ in SIZES.values():
        if width == dim:
            return heads
    return dim // 64 if dim % 64 == 0 else None


def parse_overrides(items: Sequence[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``["key=value", ...]`` (values read as JSON where they parse) or a dict -> checked ViTConfig fields."""
    if not items:
        return {}
    if isinstance(items, Mapping):
        out = dict(items)
    else:
        out = {}
        for text in items:
            keys, value = parse_override(text)
            if len(keys) != 1:
                raise ConfigError(f"--set {text!r}: expected a ViTConfig field, e.g. global_pool=avg")
            out[keys[0]] = value
    fields = {f.name for f in dataclasses.fields(ViTConfig)}
    unknown = sorted(set(out) - fields)
    if unknown:
        raise ConfigError(f"--set {unknown[0]}: not a ViTConfig field; fields: {', '.join(sorted(fields))}")
    return out


# ------------------------------------------------------------------------------------ resolution
def arch_config(
    seen: Mapping[str, Any],
    guessed: Mapping[str, Any],
    source: str,
    *,
    pos_len: int | None = None,
    model_name: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[ViTConfig, dict[str, Any]]:
    """Merge what the weights show (``seen``), a named model, overrides and defaults (``guessed``).

    Precedence: overrides > seen > named model > guessed. ``pos_len`` is the length of a learned
    position table; the image size and whether it holds slots for the prefix tokens are read from it. Returns the
    config and the guessed fields that were used (to report as assumptions).
    """
    overrides = dict(overrides or {})
    named = _named_fields(model_name, seen, overrides, source)
    data = _merge(seen, guessed, named, overrides)
    if pos_len is not None and "img_size" not in seen:
        table = _PosTable.of(pos_len, data, seen, overrides)
        hw, no_embed_class = _size_from_table(table, overrides, named, source)
        data["img_size"] = list(hw)
        data["no_embed_class"] = no_embed_class and table.prefix > 0
    elif "img_size" not in data:
        data["img_size"] = _named_size(named, source)
    if data.get("num_heads") is None:
        raise CheckpointError(
            f"{source}: the number of heads is not visible in the weights and width {data.get('embed_dim')} "
            f"is no multiple of 64; pass --set num_heads=N or --model NAME"
        )
    assumed = {k: v for k, v in guessed.items() if k not in seen and k not in named and k not in overrides}
    try:
        cfg = ViTConfig.from_dict(data, where="config")
    except ConfigError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return cfg, assumed


def _named_fields(model_name: str | None, seen: Mapping, overrides: Mapping, source: str) -> dict[str, Any]:
    """The named model's config fields ({} without one), after checking it agrees with the weights.

    Every structural field the weights show must match the named model's, unless an override sets it.
    """
    if not model_name:
        return {}
    named = get_config(model_name).to_dict()
    for f in STRUCTURAL:
        if f not in seen or f in overrides:
            continue
        a, b = seen[f], named[f]
        if f == "mlp_ratio":  # compare the MLP widths the ratios make
            a, b = int(seen["embed_dim"] * a), int(named["embed_dim"] * b)
        if a != b:
            label = "MLP width" if f == "mlp_ratio" else f
            raise CheckpointError(f"{source}: the weights have {label} {a} but model {model_name!r} has {b}")
    return named


def _merge(seen: Mapping, guessed: Mapping, named: Mapping, overrides: Mapping) -> dict[str, Any]:
    """Fields by precedence (overrides > seen > named > guessed), the image size left open unless shown."""
    data = {**guessed, **named, **seen, **overrides}
    if seen.get("layer_scale") and named.get("layer_scale") and "layer_scale" not in overrides:
        data["layer_scale"] = named["layer_scale"]  # the weights show LayerScale is on, not its initial value
    if "img_size" not in seen and "img_size" not in overrides:
        data.pop("img_size", None)  # a named model's size only fills in when the weights leave it open
    return data


def _named_size(named: Mapping, source: str) -> Any:
    """The image size of weights without a learned position table: only a named model can tell it."""
    if "img_size" in named:
        return named["img_size"]
    raise CheckpointError(
        f"{source}: the image size is not visible in the weights (no learned position table); "
        f"pass --set img_size=N or --model NAME"
    )


@dataclass(frozen=True)
class _PosTable:
    """A learned position table of ``length`` positions: which image sizes fill it, and how.

    A table holds one position per patch, plus a slot for each prefix token (the class token, the
    registers) unless it skips them (``no_embed_class``). ``options`` are the no_embed_class values
    still open: the one the weights or overrides fix, else both where there are prefix tokens to skip.
    """

    length: int
    patch: int
    prefix: int  # the class token (1 or 0) and the registers
    options: tuple[bool, ...]
    registers: int = 0

    @classmethod
    def of(cls, length: int, data: Mapping, seen: Mapping, overrides: Mapping) -> _PosTable:
        registers = int(data.get("reg_tokens", 0))
        prefix = (1 if data.get("class_token", True) else 0) + registers
        if "no_embed_class" in overrides or "no_embed_class" in seen:
            options = (bool(overrides.get("no_embed_class", seen.get("no_embed_class"))),)
        else:
            options = (False, True) if prefix else (False,)
        return cls(length, data.get("patch_size", 16), prefix, options, registers)

    def patches(self, hw: tuple[int, int]) -> int:
        return (hw[0] // self.patch) * (hw[1] // self.patch)

    def slots(self) -> str:
        """The prefix slots a table may hold beside the patches, in words."""
        if not self.registers:
            return f"+{self.prefix} class slot"
        tokens = "class and register tokens" if self.prefix > self.registers else "register tokens"
        return f"+{self.prefix} slots for the {tokens}"

    def fit(self, hw: tuple[int, int]) -> bool | None:
        """The no_embed_class value under which an image of size ``hw`` fills the table, or None."""
        for no_embed_class in self.options:
            if self.length == self.patches(hw) + (0 if no_embed_class else self.prefix):
                return no_embed_class
        return None

    def square(self) -> tuple[tuple[int, int], bool] | None:
        """(the square image size, no_embed_class) whose patch grid fills the table, or None."""
        for no_embed_class in self.options:
            n = self.length - (0 if no_embed_class else self.prefix)
            side = math.isqrt(max(n, 0))
            if n > 0 and side * side == n:
                return (side * self.patch, side * self.patch), no_embed_class
        return None


def _size_from_table(
    table: _PosTable, overrides: Mapping, named: Mapping, source: str
) -> tuple[tuple[int, int], bool]:
    """(H, W) and no_embed_class for a position table: an overridden size must fill it; else the
    square grid it holds, else a named model's size where that fills it."""
    if "img_size" in overrides:
        hw = to_hw(overrides["img_size"], "img_size")
        no_embed_class = table.fit(hw)
        if no_embed_class is None:
            raise CheckpointError(
                f"{source}: the position table has {table.length} positions but img_size {hw[0]}x{hw[1]} with "
                f"patch {table.patch} makes {table.patches(hw)} patches ({table.slots()})"
            )
        return hw, no_embed_class
    found = table.square()
    if found is None and "img_size" in named:
        hw = to_hw(named["img_size"], "img_size")
        no_embed_class = table.fit(hw)
        found = None if no_embed_class is None else (hw, no_embed_class)
    if found is None:
        raise CheckpointError(
            f"{source}: the position table's {table.length} positions are no square grid; "
            f"pass the image size (--set img_size=[H,W])"
        )
    return found
