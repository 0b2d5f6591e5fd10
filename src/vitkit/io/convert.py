"""Weight conversion between vitkit and timm, Hugging Face and the original JAX checkpoints.

The front end: one table of formats (``FORMATS``), each with the function that reads it and the one
that writes it. The formats themselves live below: ``timm.py``, ``hf.py`` and ``jax.py`` hold each
format's key table and layout, built on ``keys.py`` (applying a key table with hard checks) and
``arch.py`` (the ViTConfig of foreign weights: what they show, then --set, --model and defaults).

    model = from_timm("vit.pth")                 # or from_hf("dir/"), from_jax("ViT-B_16.npz")
    sd = to_timm(model); to_hf(model, "hf_dir/")
    convert("ViT-B_16.npz", "ckpt/", src_format="jax")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..config import ViTConfig
from ..errors import ConfigError
from ..runtime import count_params
from .arch import parse_overrides
from .checkpoint import CONFIG, WEIGHTS, load, resolve_checkpoint, save
from .hf import read_hf, write_hf
from .jax import read_jax
from .timm import read_timm, save_timm, to_timm

# (src, *, model_name, overrides) -> (model, info: {"source", "assumed", ...})
Reader = Callable[..., tuple[Any, dict]]
# (model, dest) -> the files written
Writer = Callable[[Any, Path], list[str]]


# ---------------------------------------------------------------------------------- the formats
def _read_vitkit(src, *, model_name=None, overrides=None) -> tuple[Any, dict]:
    """A vitkit checkpoint carries its own config: --model and --set have nothing to fill in."""
    if model_name or overrides:
        raise ConfigError("--model and --set describe foreign weights; a vitkit checkpoint has its config")
    model = load(src)
    return model, {"source": str(resolve_checkpoint(src)), "assumed": {}}


def _write_vitkit(model, dest: Path) -> list[str]:
    save(model, dest)
    return [str(dest / WEIGHTS), str(dest / CONFIG)]


def _write_timm(model, dest: Path) -> list[str]:
    return [str(save_timm(model, dest))]


def _write_hf(model, dest: Path) -> list[str]:
    return [str(p) for p in write_hf(model, dest, return_files=True)]


@dataclass(frozen=True)
class Format:
    """A weight format: how to read it and how to write it (None where vitkit only goes one way)."""

    name: str
    read: Reader | None
    write: Writer | None


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("vitkit", _read_vitkit, _write_vitkit),
    Format("timm", read_timm, _write_timm),
    Format("hf", read_hf, _write_hf),
    Format("jax", read_jax, None),
)}
FORMATS_IN = tuple(name for name, f in FORMATS.items() if f.read is not None)
FORMATS_OUT = tuple(name for name, f in FORMATS.items() if f.write is not None)


def _reader(name: str, label: str) -> Reader:
    """The reader of format ``name``; an unknown or write-only one is a ConfigError naming ``label``."""
    fmt = FORMATS.get(name)
    if fmt is None or fmt.read is None:
        raise ConfigError(f"{label} {name!r}: expected one of {', '.join(FORMATS_IN)}")
    return fmt.read


def _writer(name: str, label: str) -> Writer:
    """The writer of format ``name``; an unknown or read-only one is a ConfigError naming ``label``."""
    fmt = FORMATS.get(name)
    if fmt is None or fmt.write is None:
        raise ConfigError(f"{label} {name!r}: expected one of {', '.join(FORMATS_OUT)}")
    return fmt.write


# ----------------------------------------------------------------------------------- public API
def from_timm(src, cfg: ViTConfig | None = None, model=None, *, model_name=None, overrides=None):
    """A VisionTransformer from a timm state dict (a dict, or a .pth / .safetensors file)."""
    return read_timm(src, cfg=cfg, model=model, model_name=model_name, overrides=overrides)[0]


def from_hf(path, cfg: ViTConfig | None = None, model=None, *, model_name=None, overrides=None):
    """A VisionTransformer from a Hugging Face ViTForImageClassification / ViTModel directory."""
    return read_hf(path, cfg=cfg, model=model, model_name=model_name, overrides=overrides)[0]


def to_hf(model, path) -> Path:
    """Write a directory that transformers' ViTForImageClassification (or ViTModel) loads, offline."""
    return write_hf(model, path)


def from_jax(path, cfg: ViTConfig | None = None, model=None, *, model_name=None, overrides=None):
    """A VisionTransformer from an original JAX .npz checkpoint (vit_jax or big_vision naming)."""
    return read_jax(path, cfg=cfg, model=model, model_name=model_name, overrides=overrides)[0]


def read(src, src_format: str, *, model_name=None, overrides=None):
    """(model, info) from ``src`` in ``src_format`` ('vitkit', 'timm', 'hf' or 'jax')."""
    overrides = parse_overrides(overrides)
    return _reader(src_format, "source format")(src, model_name=model_name, overrides=overrides)


def write(model, dest, dest_format: str) -> list[str]:
    """Write ``model`` to ``dest`` in ``dest_format``; returns the files written."""
    return _writer(dest_format, "destination format")(model, Path(dest))


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
    _reader(src_format, "--from")
    _writer(dest_format, "--to")
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
    "FORMATS",
    "Format",
    "convert",
    "from_hf",
    "from_jax",
    "from_timm",
    "read",
    "to_hf",
    "to_timm",
    "write",
]
