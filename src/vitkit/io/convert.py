"""Weight conversion between vitkit and timm, Hugging Face and the original JAX checkpoints.

Every format has an explicit key table (``timm.py``, ``hf.py``, ``jax.py``) that says, for each vitkit
parameter, which source tensors make it and how. ``assemble`` applies a table with hard checks: every
vitkit parameter must be found, every source tensor must be used, every shape must fit; otherwise one
CheckpointError lists what is missing, unexpected and mis-shaped.

The architecture is read from the weights (and HF's config.json) where it is visible: width, depth,
patch size, channels, image size (from the position table's grid), class token, classes, pooling,
qkv bias, LayerScale, and heads where the format stores them (HF config, JAX (D, H, hd) kernels).
What the weights do not show is taken, in this order of precedence, from ``--set KEY=VALUE``
overrides, a named vitkit model (``--model NAME``), then defaults that are reported as assumed.

    model = from_timm("vit.pth")                 # or from_hf("dir/"), from_jax("ViT-B_16.npz")
    sd = to_timm(model); to_hf(model, "hf_dir/")
    convert("ViT-B_16.npz", "ckpt/", src_format="jax")
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ..config import ViTConfig
from ..errors import CheckpointError, ConfigError

FORMATS_IN = ("vitkit", "timm", "hf", "jax")
FORMATS_OUT = ("vitkit", "timm", "hf")

# A rule makes one vitkit tensor from source tensors: (source keys, function of those tensors).
Rule = tuple[tuple[str, ...], Callable[..., torch.Tensor]]

# Fields that name the network's structure: a named model (--model) must agree with the weights on them.
STRUCTURAL = ("embed_dim", "depth", "patch_size", "in_chans", "mlp_ratio")


def same(t: torch.Tensor) -> torch.Tensor:
    return t


# ------------------------------------------------------------------------------------ key tables
def _listing(label: str, items: Sequence[str], limit: int = 6) -> str:
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return f"{label}: {', '.join(items[:limit])}{more}"


def assemble(
    expected: Mapping[str, torch.Size],
    table: Mapping[str, Rule],
    src: Mapping[str, torch.Tensor],
    source: str,
) -> dict[str, torch.Tensor]:
    """Build the vitkit state dict ``expected`` (key -> shape) from ``src`` by ``table``.

    Raises one CheckpointError naming every missing source key, every source key that no rule used,
    and every tensor whose shape does not fit (source shapes -> the vitkit shape it should make).
    """
    out: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    bad: list[str] = []
    used: set[str] = set()
    for key, shape in expected.items():
        if key not in table:
            missing.append(f"(nothing in this format holds {key})")
            continue
        keys, fn = table[key]
        absent = [k for k in keys if k not in src]
        if absent:
            missing.extend(k for k in absent if k not in missing)
            continue
        used.update(keys)
        tensors = [src[k] for k in keys]
        try:
            t = fn(*tensors)
        except (RuntimeError, ValueError, IndexError):
            t = None
        if t is None or tuple(t.shape) != tuple(shape):
            got = ", ".join(f"{k} {tuple(s.shape)}" for k, s in zip(keys, tensors))
            bad.append(f"{got} -> {key} {tuple(shape)}")
            continue
        out[key] = t.contiguous()
    unexpected = [k for k in src if k not in used]
    if missing or unexpected or bad:
        parts = [
            _listing(label, items)
            for label, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", bad))
            if items
        ]
        raise CheckpointError(f"{source}: weights do not fit the model; " + "; ".join(parts))
    return out


# ------------------------------------------------------------------------------ config resolution
def mlp_ratio_for(hidden: int, dim: int) -> float:
    """The float ratio r with int(dim * r) == hidden (so that ViTConfig.mlp_hidden gives back ``hidden``)."""
    r = hidden / dim
    while int(dim * r) < hidden:  # e.g. 6144 / 1408 * 1408 = 6143.999...
        r = math.nextafter(r, math.inf)
    return r


def heads_from_width(dim: int) -> int | None:
    """Heads of the named size with this width (variants.SIZES), else width / 64, else None."""
    from ..variants import SIZES

    for width, _, heads, _ in SIZES.values():
        if width == dim:
            return heads
    return dim // 64 if dim % 64 == 0 else None


def parse_overrides(items: Sequence[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """``["key=value", ...]`` (values read as JSON where they parse) or a dict -> checked ViTConfig fields."""
    import dataclasses

    from ..strict import parse_override

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


def resolve_config(
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
    position table; the image size and whether it holds a class slot are read from it. Returns the
    config and the guessed fields that were used (to report as assumptions).
    """
    from ..variants import get_config

    overrides = dict(overrides or {})
    named: dict[str, Any] = {}
    if model_name:
        named = get_config(model_name).to_dict()
        for f in STRUCTURAL:
            if f not in seen or f in overrides:
                continue
            a, b = seen[f], named[f]
            if f == "mlp_ratio":
                a, b = int(seen["embed_dim"] * a), int(named["embed_dim"] * b)
            if a != b:
                label = "MLP width" if f == "mlp_ratio" else f
                raise CheckpointError(f"{source}: the weights have {label} {a} but model {model_name!r} has {b}")
    data = {**guessed, **named, **seen, **overrides}
    if seen.get("layer_scale") and named.get("layer_scale") and "layer_scale" not in overrides:
        data["layer_scale"] = named["layer_scale"]  # the weights show LayerScale is on, not its initial value
    if "img_size" not in seen and "img_size" not in overrides:
        data.pop("img_size", None)  # a named model's size only fills in when the weights leave it open

    if pos_len is not None and "img_size" not in seen:
        P = data.get("patch_size", 16)
        prefix = 1 if data.get("class_token", True) else 0
        if "no_embed_class" in overrides or "no_embed_class" in seen:
            options = [bool(overrides.get("no_embed_class", seen.get("no_embed_class")))]
        else:
            options = [False, True] if prefix else [False]

        def fits(hw) -> bool | None:
            n = (hw[0] // P) * (hw[1] // P)
            for nec in options:
                if pos_len == n + (0 if nec else prefix):
                    return nec
            return None

        if "img_size" in overrides:
            hw = _pair(overrides["img_size"])
            nec = fits(hw)
            if nec is None:
                n = (hw[0] // P) * (hw[1] // P)
                raise CheckpointError(
                    f"{source}: the position table has {pos_len} positions but img_size {hw[0]}x{hw[1]} with "
                    f"patch {P} makes {n} patches (+{prefix} class slot)"
                )
        else:
            hw = nec = None
            for option in options:
                n = pos_len - (0 if option else prefix)
                side = math.isqrt(max(n, 0))
                if n > 0 and side * side == n:
                    hw, nec = (side * P, side * P), option
                    break
            if hw is None and "img_size" in named and fits(_pair(named["img_size"])) is not None:
                hw = _pair(named["img_size"])
                nec = fits(hw)
            if hw is None:
                raise CheckpointError(
                    f"{source}: the position table's {pos_len} positions are no square grid; "
                    f"pass the image size (--set img_size=[H,W])"
                )
        data["img_size"] = list(hw)
        data["no_embed_class"] = bool(nec) and prefix == 1
    elif "img_size" not in data:
        if "img_size" in named:
            data["img_size"] = named["img_size"]
        else:
            raise CheckpointError(
                f"{source}: the image size is not visible in the weights (no learned position table); "
                f"pass --set img_size=N or --model NAME"
            )
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


def _pair(v) -> tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return v, v
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return int(v[0]), int(v[1])
    raise ConfigError(f"img_size: expected N or [H, W], got {v!r}")


# ----------------------------------------------------------------------------------- building
def expected_state(cfg: ViTConfig) -> dict[str, torch.Size]:
    """The vitkit state dict's keys and shapes for ``cfg`` (built on the meta device: no memory)."""
    from ..model import VisionTransformer

    with torch.device("meta"):
        model = VisionTransformer(cfg)
    return {k: v.shape for k, v in model.state_dict().items()}


def build(cfg: ViTConfig, state: Mapping[str, torch.Tensor], source: str, model=None):
    """A VisionTransformer holding ``state`` (checked key by key), in eval mode, float32 on the CPU.

    With ``model`` given, the weights are loaded into it instead (its config must fit them).
    """
    from ..model import VisionTransformer
    from .checkpoint import check_state_dict

    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    if model is not None:
        check_state_dict(model, state, source)
        own = model.state_dict()
        model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)
        return model
    with torch.device("meta"):
        model = VisionTransformer(cfg)
    check_state_dict(model, state, source)
    model = model.to_empty(device="cpu")
    model.load_state_dict(state, strict=True)
    return model.eval()


def learned_pos_table(model) -> torch.Tensor | None:
    """The position embedding as one learned table with a slot for every token, class token included.

    vitkit adds fixed tables (sin-cos, or none) on the fly, and a big_vision-style table skips the
    class token; timm's and HF's standard layout has (1, prefix + N, D) added after the class token is
    prepended. A class slot of zeros gives exactly what vitkit computes. None without a class slot
    to fill and nothing to add.
    """
    from ..layers import sincos_1d, sincos_2d

    cfg = model.cfg
    D, prefix = cfg.embed_dim, cfg.num_prefix_tokens
    zeros = torch.zeros(1, prefix, D)
    if cfg.pos_embed == "learn":
        pe = model.pos_embed.detach().float().cpu()
        if cfg.no_embed_class and prefix:
            pe = torch.cat([zeros, pe], dim=1)
        return pe
    if cfg.pos_embed == "sincos2d":
        return torch.cat([zeros, sincos_2d(cfg.grid_size, D)[None]], dim=1)
    if cfg.pos_embed == "sincos1d":
        return sincos_1d(prefix + cfg.num_patches, D)[None]
    return torch.zeros(1, prefix + cfg.num_patches, D)


def refuse(model, target: str, what: dict[str, bool]) -> None:
    """Raise CheckpointError naming every feature of ``model`` that ``target`` cannot hold."""
    found = [name for name, cannot in what.items() if cannot]
    if found:
        raise CheckpointError(f"{target} cannot hold this model: {'; '.join(found)}")


# ----------------------------------------------------------------------------------- public API
def from_timm(src, cfg: ViTConfig | None = None, model=None, *, model_name=None, overrides=None):
    """A VisionTransformer from a timm state dict (a dict, or a .pth / .safetensors file)."""
    from .timm import read_timm

    return read_timm(src, cfg=cfg, model=model, model_name=model_name, overrides=overrides)[0]


def to_timm(model) -> dict[str, torch.Tensor]:
    """The model's weights as a timm VisionTransformer state dict (see ``timm.timm_model_kwargs``)."""
    from .timm import to_timm as _to_timm

    return _to_timm(model)


def from_hf(path, cfg: ViTConfig | None = None, model=None, *, model_name=None, overrides=None):
    """A VisionTransformer from a Hugging Face ViTForImageClassification / ViTModel directory."""
    from .hf import read_hf

    return read_hf(path, cfg=cfg, model=model, model_name=model_name, overrides=overrides)[0]


def to_hf(model, path) -> Path:
    """Write a directory that transformers' ViTForImageClassification (or ViTModel) loads, offline."""
    from .hf import write_hf

    return write_hf(model, path)


def from_jax(path, cfg: ViTConfig | None = None, model=None, *, model_name=None, overrides=None):
    """A VisionTransformer from an original JAX .npz checkpoint (vit_jax or big_vision naming)."""
    from .jax import read_jax

    return read_jax(path, cfg=cfg, model=model, model_name=model_name, overrides=overrides)[0]


def read(src, src_format: str, *, model_name=None, overrides=None):
    """(model, info) from ``src`` in ``src_format`` ('vitkit', 'timm', 'hf' or 'jax')."""
    overrides = parse_overrides(overrides)
    if src_format == "vitkit":
        from .checkpoint import load, resolve_checkpoint

        if model_name or overrides:
            raise ConfigError("--model and --set describe foreign weights; a vitkit checkpoint has its config")
        model = load(src)
        return model, {"source": str(resolve_checkpoint(src)), "assumed": {}}
    kw = dict(model_name=model_name, overrides=overrides)
    if src_format == "timm":
        from .timm import read_timm

        return read_timm(src, **kw)
    if src_format == "hf":
        from .hf import read_hf

        return read_hf(src, **kw)
    if src_format == "jax":
        from .jax import read_jax

        return read_jax(src, **kw)
    raise ConfigError(f"source format {src_format!r}: expected one of {', '.join(FORMATS_IN)}")


def write(model, dest, dest_format: str) -> list[str]:
    """Write ``model`` to ``dest`` in ``dest_format``; returns the files written."""
    dest = Path(dest)
    if dest_format == "vitkit":
        from .checkpoint import CONFIG, WEIGHTS, save

        save(model, dest)
        return [str(dest / WEIGHTS), str(dest / CONFIG)]
    if dest_format == "timm":
        from .timm import save_timm

        save_timm(model, dest)
        return [str(dest)]
    if dest_format == "hf":
        from .hf import write_hf

        return [str(p) for p in write_hf(model, dest, return_files=True)]
    raise ConfigError(f"destination format {dest_format!r}: expected one of {', '.join(FORMATS_OUT)}")


def convert(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    src_format: str = "vitkit",
    dest_format: str = "vitkit",
    *,
    model_name: str | None = None,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    img_size: int | tuple[int, int] | None = None,
    interpolation: str = "bicubic",
    antialias: bool = False,
) -> dict:
    """Read ``src`` in one format and write ``dest`` in another; returns a report (JSON-ready dict).

    ``img_size`` converts at another resolution: learned position embeddings are resampled
    (``interpolation``, default bicubic without antialias, as HF; timm uses antialias=True).
    """
    from ..runtime import count_params

    if src_format not in FORMATS_IN:
        raise ConfigError(f"--from {src_format!r}: expected one of {', '.join(FORMATS_IN)}")
    if dest_format not in FORMATS_OUT:
        raise ConfigError(f"--to {dest_format!r}: expected one of {', '.join(FORMATS_OUT)}")
    model, info = read(src, src_format, model_name=model_name, overrides=overrides)
    resampled = None
    if img_size is not None:
        old = model.cfg.img_size
        model.resample_to(img_size, mode=interpolation, antialias=antialias)
        resampled = {"from": list(old), "to": list(model.cfg.img_size), "interpolation": interpolation,
                     "antialias": antialias}
    files = write(model, dest, dest_format)
    return {
        "src": str(src),
        "dest": str(dest),
        "from": src_format,
        "to": dest_format,
        "params": count_params(model),
        "tensors": len(model.state_dict()),
        "config": model.cfg.to_dict(),
        "assumed": info.get("assumed", {}),
        "resampled": resampled,
        "files": files,
    }


__all__ = [
    "assemble",
    "build",
    "convert",
    "from_hf",
    "from_jax",
    "from_timm",
    "parse_overrides",
    "resolve_config",
    "to_hf",
    "to_timm",
]
