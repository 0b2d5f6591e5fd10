"""Weight conversion between vitkit and timm, Hugging Face and the original JAX checkpoints.

The front end: one table of formats (``FORMATS``), each with the function that reads it and the one
that writes it. The formats themselves live below: ``timm.py``, ``hf.py`` and ``jax.py`` hold each
format's key table and layout, built on ``keys.py`` (applying a key table with hard checks) and
``arch.py`` (the ViTConfig of foreign weights: what they show, then --set, --model and defaults).

    model = from_timm("vit.pth")                 # or from_hf("dir/"), from_jax("ViT-B_16.npz")
    sd = to_timm(model); to_hf(model, "hf_dir/")
    convert("ViT-B_16.npz", "ckpt/", src_format="jax")
    detect_format("vit.pth")                     # 'timm': the container tells the format
    model, info = read("ViT-B_16.npz")           # the format detected; info["assumed"]: what was filled in
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.errors import CheckpointError, ConfigError
from ..core.strict import parse_json
from ..model.config import ViTConfig
from ..model.vit import count_params
from .arch import parse_overrides
from .checkpoint import CONFIG, WEIGHTS, load, resolve_checkpoint, save
from .hf import read_hf, write_hf
from .jax import read_jax
from .timm import TIMM_SUFFIXES, read_timm, save_timm, to_timm

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


# what each format's weights come in, by the container (see detect_format)
CONTAINERS = {
    "vitkit": "a vitkit checkpoint or run directory (vitkit's config.json)",
    "hf": "an HF model directory (config.json with model_type 'vit')",
    "jax": "a JAX .npz file",
    "timm": "a timm .pth, .pt, .bin or .safetensors file",
}


def detect_format(src: str | os.PathLike) -> str:
    """The format of the weights at ``src``, told by the container: a directory whose config.json has a
    ``model_type`` is Hugging Face's, any other directory with a config.json or model.safetensors (a
    checkpoint) or with a best/ or last/ checkpoint (a run) is vitkit's; an .npz file is JAX's, a .pth,
    .pt, .bin or .safetensors file is timm's, except the model.safetensors (or config.json) of an HF model
    or of a vitkit checkpoint, which is that directory's format.

    Only the container is looked at: whether its content is good is for the format's reader to say.
    A path that is none of these is a CheckpointError naming it and the accepted forms.
    """
    p = Path(src)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or directory")
    if p.is_file() and p.name in (WEIGHTS, CONFIG) and "model_type" in _json_object(p.parent / CONFIG):
        return "hf"  # a file of an HF model directory, as resolve_checkpoint takes one of a checkpoint's
    if p.is_dir():
        if "model_type" in _json_object(p / CONFIG):
            return "hf"
        try:
            resolve_checkpoint(p)
            return "vitkit"
        except CheckpointError:
            pass
    elif p.suffix.lower() == ".npz":
        return "jax"
    elif p.name in (WEIGHTS, CONFIG) and (p.parent / WEIGHTS).is_file() and \
            _json_object(p.parent / CONFIG).get("format") == "vitkit":
        return "vitkit"
    elif p.suffix.lower() in TIMM_SUFFIXES:
        return "timm"
    raise CheckpointError(f"{p}: not a weights container vitkit knows; expected {', '.join(CONTAINERS.values())}")


def _json_object(file: Path) -> dict:
    """``file`` as a JSON object; {} when it is missing or is no JSON object (its reader reports that)."""
    try:
        obj = parse_json(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


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


def read(src, src_format: str | None = None, *, model_name=None, overrides=None):
    """(model, info) from ``src`` in ``src_format`` ('vitkit', 'timm', 'hf' or 'jax'; None: told by the
    container, ``detect_format``). info: {"source", "format", "assumed": the fields neither the weights
    nor ``model_name`` / ``overrides`` gave, filled in with defaults}."""
    overrides = parse_overrides(overrides)
    src_format = src_format or detect_format(src)
    model, info = _reader(src_format, "source format")(src, model_name=model_name, overrides=overrides)
    return model, {**info, "format": src_format}


def describe(report: Mapping[str, Any], hint: str = "--set KEY=VALUE") -> list[str]:
    """What a read found, as `vitkit convert` and `vitkit finetune` print it: the source and its format,
    the architecture, and the fields that were assumed (``hint`` says how to change them). ``report``
    holds "src", "from" (the format), "config" (ViTConfig as a dict), "params" and "assumed"."""
    c = report["config"]
    img = "x".join(map(str, c["img_size"]))
    lines = [
        f"read {report['from']}: {report['src']}",
        f"model: width {c['embed_dim']}, depth {c['depth']}, heads {c['num_heads']}, patch {c['patch_size']}, "
        f"image {img}, classes {c['num_classes']}, pool {c['global_pool']}, {report['params'] / 1e6:.2f}M parameters",
    ]
    if report["assumed"]:
        items = ", ".join(f"{k}={v}" for k, v in report["assumed"].items())
        lines.append(f"not in the weights, assumed: {items} (change with {hint})")
    return lines


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
    "CONTAINERS",
    "FORMATS",
    "Format",
    "detect_format",
    "convert",
    "describe",
    "from_hf",
    "from_jax",
    "from_timm",
    "read",
    "to_hf",
    "to_timm",
    "write",
]
