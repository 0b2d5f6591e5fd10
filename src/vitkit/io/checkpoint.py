"""The canonical checkpoint: a directory with vitkit.safetensors and vitkit.json.

vitkit.json holds {"format": "vitkit", "format_version": 1, "model": ViTConfig, "preprocess":
Preprocess, "labels": [class names] or null}. Both files have names of their own so that no other
library takes the folder for one of its own: transformers' ``from_pretrained`` reads a folder's
config.json and model.safetensors, and given vitkit's it built a default ViT-B and loaded none of the
weights into it, with no error; now it finds neither and says so. Checkpoints written before, as
config.json + model.safetensors, are still read (``checkpoint_files``); saving into such a folder
replaces them. Loading never executes code from a file: weights come from safetensors, or from
torch.load(weights_only=True) for .pth files of other libraries.
"""

from __future__ import annotations

import errno
import json
import os
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import torch

from ..core.errors import CheckpointError, ConfigError, VitkitWarning
from ..core.strict import parse_json, read_json_object
from ..model.config import Preprocess, ViTConfig
from .atomic import atomic_write_bytes, atomic_write_text

WEIGHTS = "vitkit.safetensors"  # the checkpoint's weights, as written
CONFIG = "vitkit.json"  # the checkpoint's config, as written
LEGACY_CONFIG, LEGACY_WEIGHTS = "config.json", "model.safetensors"  # their names before, still read
FILE_NAMES = (CONFIG, WEIGHTS, LEGACY_CONFIG, LEGACY_WEIGHTS)
FORMAT_VERSION = 1


# ------------------------------------------------------------------------------------------- save
def checkpoint_config(model) -> dict:
    return {
        "format": "vitkit",
        "format_version": FORMAT_VERSION,
        "model": model.cfg.to_dict(),
        "preprocess": model.preprocess.to_dict(),
        "labels": list(model.labels) if model.labels is not None else None,
    }


def save(model, path: str | os.PathLike, extra: Mapping | None = None,
         weights: Mapping[str, torch.Tensor] | None = None) -> Path:
    """Write ``model`` to directory ``path`` (created if needed) as vitkit.safetensors + vitkit.json.

    Each file is written atomically; a checkpoint vitkit wrote there under the old names (config.json +
    model.safetensors) goes. ``extra`` adds keys to vitkit.json (e.g. training provenance).
    ``weights``: the tensors to write in place of ``model.state_dict()`` (the full weights of a model
    whose own tensors are shards).
    """
    from safetensors.torch import save as st_save

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path}: exists and is not a directory")
    model = unwrap(model)
    tensors = model.state_dict() if weights is None else weights
    state = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    cfg = checkpoint_config(model)
    if extra:
        cfg.update(extra)
    atomic_write_bytes(path / WEIGHTS, st_save(state, metadata={"format": "pt"}))
    atomic_write_text(path / CONFIG, json.dumps(cfg, indent=2) + "\n")
    if json_object_or_empty(path / LEGACY_CONFIG).get("format") == "vitkit":
        for old in (LEGACY_CONFIG, LEGACY_WEIGHTS):  # the old copy: other libraries would take the folder for theirs
            (path / old).unlink(missing_ok=True)
    return path


def json_object_or_empty(file: Path | None) -> dict:
    """``file`` as a JSON object; {} when it is None, missing or no JSON object (its reader reports that)."""
    if file is None:
        return {}
    try:
        obj = parse_json(file.read_text(encoding="utf-8"))  # nesting bounded
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def checkpoint_files(ckpt_dir: str | os.PathLike) -> tuple[Path, Path]:
    """(config, weights) of checkpoint directory ``ckpt_dir``: vitkit.json and vitkit.safetensors, or
    config.json and model.safetensors in a checkpoint written before, where neither new file is there.
    The files need not exist."""
    d = Path(ckpt_dir)
    if not (d / CONFIG).is_file() and not (d / WEIGHTS).is_file() and \
            ((d / LEGACY_CONFIG).is_file() or (d / LEGACY_WEIGHTS).is_file()):
        return d / LEGACY_CONFIG, d / LEGACY_WEIGHTS
    return d / CONFIG, d / WEIGHTS


def config_file(ckpt_dir: str | os.PathLike) -> Path | None:
    """The config of checkpoint directory ``ckpt_dir`` (``checkpoint_files``), or None if it has none."""
    file = checkpoint_files(ckpt_dir)[0]
    return file if file.is_file() else None


def unwrap(model):
    """The plain module under DDP / torch.compile wrappers (no 'module.' or '_orig_mod.' prefixes)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        else:
            return model


# ------------------------------------------------------------------------------------------- load
def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint directory that ``path`` names: a checkpoint directory, one of its files, or a
    training run directory (its best checkpoint, else its last)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise CheckpointError(f"{p}: no such file or directory")
    if p.is_file() and p.name in FILE_NAMES:
        p = p.parent
    if p.is_dir():
        if checkpoint_files(p)[1].is_file():
            return p
        # a run directory holds its own config.json (the run's settings) beside best/ and last/; a run
        # killed between the two renames of a checkpoint swap holds only .best.old / .last.old
        for sub in ("best", ".best.old", "last", ".last.old"):
            if config_file(p / sub):
                return p / sub
        if config_file(p):
            return p
        raise CheckpointError(f"{p}: not a vitkit checkpoint (no {CONFIG} and {WEIGHTS}, nor a run directory)")
    raise CheckpointError(
        f"{p}: not a vitkit checkpoint directory; convert other formats with `vitkit convert {p} OUT --from ...`"
    )


def read_config(ckpt_dir: Path) -> tuple[ViTConfig, Preprocess, list[str] | None, dict]:
    file = checkpoint_files(ckpt_dir)[0]
    if not file.is_file():
        raise CheckpointError(f"{file}: missing (a vitkit checkpoint holds {CONFIG} beside {WEIGHTS})")
    raw = read_json_object(file, CheckpointError)
    if not isinstance(raw.get("model"), dict):
        raise CheckpointError(f"{file}: expected a JSON object with a 'model' table")
    if raw.get("format", "vitkit") != "vitkit":
        raise CheckpointError(f"{file}: format {raw.get('format')!r} is not 'vitkit'")
    try:
        cfg = ViTConfig.from_dict(raw["model"], where="model")
        pre = Preprocess.from_dict(raw.get("preprocess") or {}, where="preprocess").for_channels(cfg.in_chans)
    except ConfigError as e:
        raise CheckpointError(f"{file}: {e}") from None
    labels = raw.get("labels")
    if labels is not None:
        if not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
            raise CheckpointError(f"{file}: 'labels' must be a list of strings or null")
        if cfg.num_classes and len(labels) != cfg.num_classes:
            raise CheckpointError(f"{file}: {len(labels)} labels for a head of {cfg.num_classes} classes")
    return cfg, pre, labels, raw


def _absent(file: Path) -> str:
    """Why ``file`` is no regular file to read: missing, a symbolic link loop or a broken link, or what it is."""
    try:
        os.stat(file)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop"
        return f"a broken symbolic link (to {os.readlink(file)})" if file.is_symlink() else "missing"
    return "a directory" if file.is_dir() else "not a regular file"


def read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise CheckpointError(f"{file}: {_absent(file)}")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{file}: not a readable safetensors file ({msg})") from None


def load_state_dict_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors from a .safetensors, .pth/.pt/.bin (torch.load with weights_only=True) or .npz file.

    Pickles that would run code are refused; nested {'state_dict': ...} / {'model': ...} are unwrapped.
    """
    import pickle

    path = Path(path)
    if not path.is_file():
        why = _absent(path)
        raise CheckpointError(f"{path}: {'no such file' if why == 'missing' else why}")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return read_safetensors(path)
    if suffix == ".npz":
        import numpy as np

        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: torch.from_numpy(np.asarray(z[k]).copy()) for k in z.files}
        except (ValueError, OSError, EOFError) as e:
            raise CheckpointError(f"{path}: not a readable .npz file ({str(e).splitlines()[0]})") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's remarks on pickle protocols are not the user's business
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path}: refused to load: not a plain weights file ({_unpickler_detail(e)}); "
            "vitkit only reads tensors from pickles, never code"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, AttributeError, KeyError, IndexError, TypeError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({type(e).__name__}: {msg[:160]})") from None
    for key in ("state_dict", "model", "model_state_dict", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a state dict)")
    return obj


def _unpickler_detail(e: Exception) -> str:
    """The part of torch's weights-only refusal that says what was refused (not its advice to disable it)."""
    import re

    m = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
    if m:
        return f"it imports {m.group(1)}"
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("Unsupported", "Trying to", "Can only", "Unsupported global")) or "GLOBAL" in ln:
            return ln[:160]
    for i, ln in enumerate(lines):
        if ln.endswith("WeightsUnpickler error:") and i + 1 < len(lines):
            return lines[i + 1][:160]
    return "it holds objects other than tensors"


def check_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise CheckpointError listing the missing, unexpected and mis-shaped keys, if any."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} != {tuple(own[k].shape)}"
        for k in own
        if k in state and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    raise_misfit(source, "config", missing, unexpected, shapes, limit=8)
    check_values(own, state, source)


def check_values(own: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor], source: str) -> None:
    """Weights that the model holds as floats must be floats (int8 or bool weights are a CheckpointError
    naming the tensor), and a BatchNorm's running variance must be >= 0 (a negative one makes NaN
    outputs; a CheckpointError); NaN or infinite values, as the model will hold them (a float64 beyond
    float32's range is infinite there; float8 is read as float32), are a warning naming the first such
    tensor: the model loads, and its outputs will not be finite."""
    nonfinite = []
    for k, v in state.items():
        if not own[k].is_floating_point():
            continue
        if not v.is_floating_point():
            raise CheckpointError(f"{source}: tensor {k} is {str(v.dtype).removeprefix('torch.')}, not floating "
                                  "point; a model's weights are floats")
        held = v.detach().to("cpu", own[k].dtype)
        if not bool(torch.isfinite(held).all()):
            nonfinite.append(k)
        if k.endswith("running_var") and bool((held < 0).any()):
            raise CheckpointError(f"{source}: tensor {k} holds negative values (min {float(held.min()):.3g}); a "
                                  "BatchNorm's running variance is >= 0")
    if nonfinite:
        more = f" and {len(nonfinite) - 1} more" if len(nonfinite) > 1 else ""
        warnings.warn(f"{source}: tensor {nonfinite[0]}{more} holds NaN or infinite values; the model's outputs "
                      "will not be finite", VitkitWarning, stacklevel=2)


def raise_misfit(
    source: str, target: str, missing: Sequence[str], unexpected: Sequence[str], misshaped: Sequence[str], limit: int
) -> None:
    """Raise one CheckpointError listing the first ``limit`` keys of each kind of misfit, if there are any.

    ``SOURCE: weights do not fit the TARGET; missing: a, b (+N more); unexpected: ...; mis-shaped: ...``
    """
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
        if items:
            more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
            parts.append(f"{label}: {', '.join(items[:limit])}{more}")
    if parts:
        raise CheckpointError(f"{source}: weights do not fit the {target}; " + "; ".join(parts))


def model_from_state(cfg: ViTConfig, state: Mapping[str, torch.Tensor], source: str):
    """A VisionTransformer for ``cfg`` on the CPU holding ``state`` (checked key by key first).

    The model is built on the meta device, so no memory goes to weights that are replaced at once.
    """
    from ..model.vit import VisionTransformer

    with torch.device("meta"):
        model = VisionTransformer(cfg)
    check_state_dict(model, state, source)
    model = model.to_empty(device="cpu")
    model.load_state_dict(state, strict=True)
    return model


def load_weights(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Load a state dict after checking every key and shape (see ``check_state_dict``)."""
    check_state_dict(model, state, source)
    own = model.state_dict()
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)


def load(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """A ready model in eval mode from a checkpoint directory (or a run directory: its best checkpoint).

    The model takes float images (B, C, H, W), normalised as ``model.preprocess`` says, and returns
    logits; ``model.labels`` holds the class names when the checkpoint has them.
    """
    ckpt = resolve_checkpoint(path)
    cfg, pre, labels, _ = read_config(ckpt)
    weights = checkpoint_files(ckpt)[1]
    model = model_from_state(cfg, read_safetensors(weights), str(weights))
    model.preprocess = pre.for_channels(cfg.in_chans)
    model.labels = labels
    return model.to(device).eval()
