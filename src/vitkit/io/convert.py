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

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..core.errors import CheckpointError, ConfigError
from ..model.config import ViTConfig
from ..model.vit import count_params
from .arch import parse_overrides
from .atomic import removed_if_left_empty
from .checkpoint import (
    CONFIG,
    FILE_NAMES,
    WEIGHTS,
    checkpoint_files,
    config_file,
    json_object_or_empty,
    load,
    resolve_checkpoint,
    save,
)
from .hf import read_hf, write_hf
from .hub import hub_hint, resolve_weights
from .jax import read_jax
from .preprocess import apply_preprocess, split_overrides
from .timm import TIMM_SUFFIXES, is_timm_config, read_timm, save_timm, check_timm_config, to_timm, write_timm_config

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
    """The weights and, beside them, their preprocessing as timm states it (``write_timm_config``)."""
    check_timm_config(dest)  # a file of the user's in its place: refused before the weights are written
    return [str(save_timm(model, dest)), str(write_timm_config(model, dest))]


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


HF_CONFIG, HF_WEIGHTS = "config.json", "model.safetensors"  # an HF model directory's (vitkit's have own names)

# what each format's weights come in, by the container (see detect_format)
CONTAINERS = {
    "vitkit": "a vitkit checkpoint or run directory (vitkit.json beside vitkit.safetensors)",
    "hf": "an HF model directory (config.json with model_type 'vit')",
    "jax": "a JAX .npz file",
    "timm": "a timm .pth, .pt, .bin or .safetensors file",
}


def detect_format(src: str | os.PathLike) -> str:
    """The format of the weights at ``src``, told by the container: a directory whose config.json has a
    ``model_type`` is Hugging Face's, one whose config.json has an ``architecture`` is a timm Hub
    repository's (timm), any other directory with vitkit.json or vitkit.safetensors (or the config.json and
    model.safetensors of a checkpoint written before them) or with a best/ or last/ checkpoint (a run) is
    vitkit's; an .npz file is JAX's, a .pth, .pt, .bin or .safetensors file is timm's, except a file of an
    HF model, a timm Hub folder or a vitkit checkpoint, which is that directory's format. A Hub name
    (``hub.resolve_weights``) is the format of the folder it is downloaded to.

    Only the container is looked at: whether its content is good is for the format's reader to say.
    A path that is none of these is a CheckpointError naming it and the accepted forms.
    """
    p = Path(resolve_weights(src))
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or directory{hub_hint(src)}")
    if p.is_file() and p.name in (HF_WEIGHTS, HF_CONFIG) and _folder_format(p.parent):
        return _folder_format(p.parent)  # a file of an HF or timm folder, as resolve_checkpoint takes a checkpoint's
    if p.is_dir():
        if _folder_format(p):
            return _folder_format(p)
        try:
            resolve_checkpoint(p)
            return "vitkit"
        except CheckpointError:
            pass
    elif p.suffix.lower() == ".npz":
        return "jax"
    elif p.name in FILE_NAMES and checkpoint_files(p.parent)[1].is_file() and \
            json_object_or_empty(config_file(p.parent)).get("format") == "vitkit":
        return "vitkit"
    elif p.suffix.lower() in TIMM_SUFFIXES:
        return "timm"
    raise CheckpointError(f"{p}: not a weights container vitkit knows; expected {', '.join(CONTAINERS.values())}")


def _folder_format(folder: Path) -> str | None:
    """'hf' or 'timm' for a folder whose config.json is Hugging Face's or a timm Hub repository's, else None."""
    obj = json_object_or_empty(folder / HF_CONFIG)
    return "hf" if "model_type" in obj else "timm" if is_timm_config(obj) else None


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
    """(model, info) from ``src`` (a path, or a Hub name: ``hub.resolve_weights``) in ``src_format``
    ('vitkit', 'timm', 'hf' or 'jax'; None: told by the container, ``detect_format``). ``overrides``:
    ViTConfig fields, and Preprocess fields as ``preprocess.KEY``. info: {"source", "format", "assumed":
    the ViTConfig fields neither the weights nor ``model_name`` / ``overrides`` gave, filled in with
    defaults; "preprocess_assumed": the same for the preprocessing (as ``preprocess.KEY``);
    "preprocess_from": where the preprocessing was read}."""
    overrides, pre_overrides = split_overrides(overrides)
    overrides = parse_overrides(overrides)
    local = resolve_weights(src)
    if isinstance(local, (str, os.PathLike)) and not os.path.lexists(local) and hub_hint(src):
        raise CheckpointError(f"{local}: no such file or directory{hub_hint(src)}")
    src_format = src_format or detect_format(local)
    model, info = _reader(src_format, "source format")(local, model_name=model_name, overrides=overrides)
    model.preprocess = apply_preprocess(model.preprocess, pre_overrides).for_channels(model.cfg.in_chans)
    pre_assumed = {k: v for k, v in info.get("preprocess_assumed", {}).items()
                   if k.removeprefix("preprocess.") not in pre_overrides}
    pre_from = info.get("preprocess_from", "the checkpoint" if src_format == "vitkit" else "vitkit's defaults")
    if pre_overrides:
        pre_from += "; " + ", ".join(f"preprocess.{k}" for k in pre_overrides) + " overridden"
    return model, {**info, "format": src_format, "preprocess_assumed": pre_assumed, "preprocess_from": pre_from}


def load_any(src, device="cpu"):
    """A model in eval mode on ``device`` from weights in any format (a path or a Hub name), as the tools
    run it: a vitkit checkpoint or run directory through ``checkpoint.load`` (its errors for a path that is
    no weights), other formats through ``read``."""
    local = resolve_weights(src)
    try:
        fmt = detect_format(local)
    except CheckpointError:
        fmt = "vitkit"  # checkpoint.load says what is wrong with it
    if fmt == "vitkit":
        return load(local, device=device)
    return read(local, fmt)[0].to(device).eval()


def describe(report: Mapping[str, Any], hint: str = "--set KEY=VALUE") -> list[str]:
    """What a read found, as `vitkit convert` and `vitkit finetune` print it: the source and its format,
    the architecture, the fields that were assumed (``hint`` says how to change them), the preprocessing
    and where it came from, and its fields that were assumed. ``report`` holds "src", "from" (the
    format), "config" (ViTConfig as a dict), "params", "assumed", and where known "preprocess" (Preprocess
    as a dict), "preprocess_from" and "preprocess_assumed"."""
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
    pre = report.get("preprocess")
    if pre and len(report.get("preprocess_assumed") or {}) < len(pre):  # not all of it assumed (listed below)
        lines.append(f"preprocess: mean {pre['mean']}, std {pre['std']}, crop_pct {pre['crop_pct']}, "
                     f"{pre['interpolation']}, resize {pre['resize']} (from {report.get('preprocess_from')})")
    if report.get("preprocess_assumed"):
        items = ", ".join(f"{k}={v}" for k, v in report["preprocess_assumed"].items())
        lines.append(f"preprocessing not in the source, assumed: {items} (change with --set preprocess.KEY=VALUE)")
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
    force: bool = False,
) -> dict:
    """Read ``src`` in one format and write ``dest`` in another; returns a report (JSON-ready dict).

    A destination folder (a timm file's: the folder it goes in) that holds a checkpoint or a training run
    is refused (``check_destination``) unless ``force``: the files written would replace the checkpoint, or
    become what a tool loads from the run in place of its best/.

    ``img_size`` converts at another resolution: learned position embeddings are resampled
    (``interpolation``, default bicubic without antialias, as HF; timm uses antialias=True). Where that is
    the size a timm tag is evaluated at (its ``test_input_size``), its ``test_crop_pct`` becomes crop_pct,
    unless ``overrides`` set preprocess.crop_pct.
    """
    _reader(src_format, "--from")
    _writer(dest_format, "--to")
    folder = Path(dest).parent if dest_format == "timm" else Path(dest)  # the folder the files go to
    if not force:
        check_destination(folder)
    model, info = read(src, src_format, model_name=model_name, overrides=overrides)
    resampled = None
    if img_size is not None:
        old = model.cfg.img_size
        model.resample_to(img_size, mode=interpolation, antialias=antialias)
        resampled = {"from": list(old), "to": list(model.cfg.img_size), "interpolation": interpolation,
                     "antialias": antialias}
        model.preprocess = _test_crop(model.preprocess, info.get("test"), model.cfg.img_size, overrides)
    with removed_if_left_empty(folder):
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
        "preprocess": model.preprocess.to_dict(),
        "preprocess_from": info.get("preprocess_from"),
        "preprocess_assumed": info.get("preprocess_assumed", {}),
        "resampled": resampled,
        "files": files,
    }


def check_destination(folder: Path) -> None:
    """A CheckpointError when ``folder`` holds a training run (best/ or last/ checkpoints) or the files of a
    checkpoint (vitkit's, an older one's or an HF model's, or a run's config.json), naming what is there."""
    what = _occupant(folder) if folder.is_dir() else None
    if what:
        raise CheckpointError(f"{folder}: holds {what}, which the conversion would replace or shadow; choose "
                              "another destination, or give --force to write there")


def _occupant(folder: Path) -> str | None:
    """What of a checkpoint's or a training run's ``folder`` holds, in words; None where nothing."""
    for sub in ("best", "last", ".best.old", ".last.old"):
        if config_file(folder / sub):
            return f"a training run ({sub}/ holds a checkpoint)"
    for name in FILE_NAMES:
        if os.path.lexists(folder / name):
            mine = name in (CONFIG, WEIGHTS)
            return f"{'a vitkit checkpoint' if mine else 'a run config, an HF model or an old checkpoint'} ({name})"
    return None


def _test_crop(pre, test: dict | None, img_size, overrides) -> Any:
    """``pre`` with a timm tag's test_crop_pct where the model now has its test_input_size (and no
    preprocess.crop_pct override says otherwise)."""
    if not test or tuple(test["img_size"]) != tuple(img_size) or "crop_pct" in split_overrides(overrides)[1]:
        return pre
    return dataclasses.replace(pre, crop_pct=test["crop_pct"])


__all__ = [
    "check_destination",
    "CONTAINERS",
    "load_any",
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
