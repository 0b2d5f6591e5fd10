"""Runtime choices in one place: the device, the precision, the CPUs, parameter counts, and the model
a tool runs.

Image sizes are parsed by ``vitkit.strict.to_hw`` (torch-free, so that the config can use it).

Every tool and the trainer ask these functions, so a device is named, checked and refused in one
wording everywhere, and what the hardware can do is detected at run time, never assumed. The tools
(predict, evaluate, explain, export, bench) get their model from ``load_model``: a module as given or a
checkpoint, in eval mode on a checked device.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace

import torch
from torch import nn

from .cpu import cpu_bf16_kind, cpu_has_fast_bf16
from .errors import ConfigError
from .fastpath import ENGINES, FastPath, Hardware, Work, auto_precision, choose_path, vit_flops
from .onnxrt import OrtModel, onnxruntime_available
from .packed import Bf16Inference, onednn_bf16_available
from .quantize import onednn_int8_available, quantize_int8


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(name: str | torch.device = "auto", *, local_rank: int = 0, what: str = "device") -> torch.device:
    """``name`` as an available torch.device; a malformed or unavailable one is a one-line ConfigError.

    'auto' is CUDA (this process's local GPU, ``local_rank``), else MPS, else the CPU. A bare 'cuda'
    is also this process's local GPU. ``what`` names the argument in the error ('device', '--device').
    """
    if isinstance(name, str) and name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{what}: {str(name)!r} is not a device (auto, cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{what}: {str(name)!r} was asked for but no CUDA GPU is available")
        count = torch.cuda.device_count()
        if dev.index is None:
            return torch.device("cuda", local_rank % count)
        if dev.index >= count:
            raise ConfigError(f"{what}: {str(name)!r}: this machine has {count} CUDA GPU(s)")
    elif dev.type == "mps" and not _mps_available():
        raise ConfigError(f"{what}: {str(name)!r} was asked for but MPS is not available")
    return dev


def detect_hardware(device: torch.device) -> Hardware:
    """What ``device`` can do, as ``vitkit.fastpath``'s rules read it."""
    if device.type == "cpu":
        kind = cpu_bf16_kind()
        return Hardware("cpu", cpu_bf16_kind=kind, onednn_bf16=kind != "none" and onednn_bf16_available(),
                        onednn_int8=onednn_int8_available(),
                        threads=torch.get_num_threads(), onnxruntime=onnxruntime_available())
    if device.type == "cuda":
        return Hardware("cuda", cuda_bf16=torch.cuda.is_bf16_supported())
    return Hardware(device.type)


def pick_precision(name: str, device: torch.device, flops_per_image: float | None = None) -> str:
    """'auto' -> what ``fastpath.auto_precision`` picks for ``device`` and a model of ``flops_per_image``
    forward FLOPs (None: by the hardware alone): bf16 (fp16 on a GPU without it) where the hardware does
    bf16 fast and the model is large enough for it to pay, fp32 otherwise. A name is checked and kept."""
    if name == "auto":
        return auto_precision(detect_hardware(device), flops_per_image)[0]
    if name == "fp16" and device.type != "cuda":
        raise ConfigError(f"precision: 'fp16' needs a CUDA device (with a gradient scaler); on {device.type} use bf16 or fp32")
    return name


def autocast(device: torch.device, precision: str):
    """The autocast context for ``precision`` ('fp32' is no autocast at all, nor 'int8': its weights are)."""
    if precision in ("fp32", "int8"):
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def inference_path(model: nn.Module, device: torch.device, precision: str = "auto", images: int = 0,
                   engine: str = "auto", batch: int = 0, compile: bool | None = None) -> FastPath:
    """The path a tool runs ``model`` on ``device`` for ``images`` images in batches of ``batch``
    (``fastpath.choose_path``): ``precision`` 'auto', 'fp32', 'bf16' or 'int8' (opt-in: CPU only);
    ``engine`` 'auto', 'torch' or 'onnxruntime' (fp32 on a CPU); ``compile`` None (where it pays) or forced."""
    if precision not in ("auto", "fp32", "bf16", "int8"):
        raise ConfigError(f"--precision: {precision!r} is not one of auto, fp32, bf16, int8")
    if engine not in ENGINES:
        raise ConfigError(f"--engine: {engine!r} is not one of {', '.join(ENGINES)}")
    cfg = model.cfg
    work = Work("infer", vit_flops(cfg), images, conv_stem=cfg.stem == "conv", batch=batch)
    return choose_path(detect_hardware(device), work, precision, compile, engine=engine)


def training_path(cfg, device: torch.device, precision: str = "auto", compile: bool = False,
                  channels_last: bool | None = None, images: int = 0, sharded: bool = False) -> FastPath:
    """The path a training run of the model ``cfg`` (a ViTConfig) takes on ``device`` over ``images``
    images (``fastpath.choose_path``): ``precision`` 'auto' or a name (checked by ``pick_precision``),
    ``compile`` as asked, ``channels_last`` None (auto: where it pays) or forced; ``sharded``: FSDP."""
    if precision != "auto":
        pick_precision(precision, device)
    work = Work("train", vit_flops(cfg), images, conv_stem=cfg.stem == "conv", sharded=sharded)
    return choose_path(detect_hardware(device), work, precision, compile, channels_last)


def apply_path(model: nn.Module, path: FastPath) -> nn.Module:
    """``model`` as ``path`` runs it: on ONNX Runtime (``vitkit.onnxrt.OrtModel``, exported in memory and
    checked against eager on its first batch), an int8 copy (``vitkit.quantize``), conv weights
    channels-last (in place), compiled; for packed bf16, a bf16 copy with packed Linear weights
    (``vitkit.packed.Bf16Inference``). Autocast for bf16 is the caller's (``autocast``)."""
    if path.engine == "onnxruntime":
        return OrtModel(model, strict=path.engine_asked)
    if path.precision == "int8":
        model = quantize_int8(model, kernel=path.int8_kernel or None)
    if path.packed:
        model = Bf16Inference(model, path.stream)
    if path.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return torch.compile(model) if path.compile else model


def path_taken(path: FastPath, net: nn.Module) -> str:
    """The path a tool ran, in words: ``path.describe()``; where ONNX Runtime fell back to torch
    (``OrtModel.fallback``), the eager path and why; where the packed copy runs another stream than the path
    names (``Bf16Inference.stream``: float32 for blocks of another kind), that stream and why."""
    fallback = getattr(net, "fallback", None)
    if fallback is not None:
        return FastPath(path.precision, why=path.why + (f"onnxruntime: {fallback}",)).describe()
    stream = getattr(net, "stream", path.stream)
    if stream != path.stream:
        kept = f"{stream} residual stream: the model has blocks of another kind than the plain pre-LN one"
        return replace(path, stream=stream, why=path.why + (kept,)).describe()
    return path.describe()


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# glibc's mallopt parameters, and the size below which freed memory stays in the process (both ways)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Have glibc's allocator keep freed memory for reuse: blocks up to ``KEEP_FREED_BYTES`` come from
    the heap rather than from fresh mappings, and the heap is not trimmed below that. By default glibc
    maps large blocks afresh and returns them when freed, so every forward pays page faults and zeroing
    for the same few activation sizes again. Measured on a 2-core CPU (benchmarks/allocator.py): fp32
    inference at batch 16 1.25x (ViT-Ti/16) and 1.15x (ViT-S/16), a training step 1.09-1.11x, peak RSS
    2-3% higher. It acts on the whole process, so the command line calls it, not the library. True
    where it applied (glibc); False elsewhere."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - a libc without mallopt
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, KEEP_FREED_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))


def count_params(model: nn.Module, trainable: bool = False) -> int:
    """The number of parameters of ``model`` (only those that require gradients with ``trainable``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)


def model_logits(model: nn.Module, x: torch.Tensor, tta: bool = False) -> torch.Tensor:
    """The model's logits for the input batch ``x`` (B, C, H, W). ``tta``: test-time flip augmentation,
    the mean of the logits of each image and of its left-right mirror (two forward passes)."""
    logits = model(x)
    if tta:
        logits = (logits + model(x.flip(-1))) / 2
    return logits


def load_model(model_or_path, device: str | torch.device = "cpu") -> nn.Module:
    """The model a tool runs, in eval mode on ``device`` (checked as '--device'): a module as given, or
    the model of a checkpoint or run directory (its best checkpoint)."""
    device = resolve_device(device, what="--device")
    if isinstance(model_or_path, nn.Module):
        return model_or_path.to(device).eval()
    from .io.checkpoint import load  # the checkpoint reader (and the model) only when a tool loads one

    return load(model_or_path, device=device)


def label_names(model: nn.Module) -> list[str]:
    """Class names of the model's head: its labels, else the class indices as strings."""
    n = model.cfg.num_classes
    return list(model.labels) if model.labels is not None else [str(i) for i in range(n)]


__all__ = ["resolve_device", "cpu_has_fast_bf16", "detect_hardware", "pick_precision", "inference_path", "training_path",
           "apply_path", "path_taken", "autocast", "usable_cpus", "keep_freed_memory", "count_params", "model_logits",
           "load_model", "label_names"]
