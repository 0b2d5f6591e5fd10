"""Key tables: how a vitkit state dict is made from another library's tensors, with hard checks.

Every format (``timm.py``, ``hf.py``, ``jax.py``) has an explicit key table that says, for each
vitkit parameter, which source tensors make it and how: ``{vitkit key: (source keys, function)}``.
``assemble`` applies a table: every vitkit parameter must be found, every source tensor must be used,
every shape must fit; otherwise one CheckpointError lists what is missing, unexpected and mis-shaped.

The helpers here are shared by the formats and know none of them: the expected keys and shapes of a
config, building the model from an assembled state dict, the position table in the layout timm and
HF store, and refusing a model a format cannot hold.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..core.errors import CheckpointError
from ..model.config import ViTConfig
from .checkpoint import load_weights, model_from_state, raise_misfit

# A rule makes one vitkit tensor from source tensors: (source keys, function of those tensors).
Rule = tuple[tuple[str, ...], Callable[..., torch.Tensor]]


def same(t: torch.Tensor) -> torch.Tensor:
    """The rule function of a tensor that is taken as it is."""
    return t


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
        t = _apply(fn, tensors)
        if t is None or tuple(t.shape) != tuple(shape):
            got = ", ".join(f"{k} {tuple(s.shape)}" for k, s in zip(keys, tensors))
            bad.append(f"{got} -> {key} {tuple(shape)}")
            continue
        out[key] = t.contiguous()
    unexpected = [k for k in src if k not in used]
    raise_misfit(source, "model", missing, unexpected, bad, limit=6)
    return out


def _apply(fn: Callable[..., torch.Tensor], tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """``fn(*tensors)``, or None where the tensors cannot take the rule's reshape (a misfit, reported)."""
    try:
        return fn(*tensors)
    except (RuntimeError, ValueError, IndexError):
        return None


def expected_state(cfg: ViTConfig) -> dict[str, torch.Size]:
    """The vitkit state dict's keys and shapes for ``cfg`` (built on the meta device: no memory)."""
    from ..model.vit import VisionTransformer

    with torch.device("meta"):
        model = VisionTransformer(cfg)
    return {k: v.shape for k, v in model.state_dict().items()}


def build(cfg: ViTConfig, state: Mapping[str, torch.Tensor], source: str, model=None):
    """A VisionTransformer holding ``state`` (checked key by key), in eval mode, float32 on the CPU.

    With ``model`` given, the weights are loaded into it instead (its config must fit them).
    """
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    if model is not None:
        load_weights(model, state, source)
        return model
    return model_from_state(cfg, state, source).eval()


def learned_pos_table(model) -> torch.Tensor | None:
    """The position embedding as one learned table with a slot for every token, class token included.

    vitkit adds fixed tables (sin-cos, or none) on the fly, and a big_vision-style table skips the
    class token; timm's and HF's standard layout has (1, prefix + N, D) added after the class token is
    prepended. A class slot of zeros gives exactly what vitkit computes. None without a class slot
    to fill and nothing to add.
    """
    from ..model.layers import sincos_1d, sincos_2d

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
