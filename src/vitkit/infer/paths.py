"""The path a tool or a training run takes on this hardware, and running a model on it: the hardware's
features (``detect_hardware``, over ``core.hardware`` and the kernels' own probes), the precision and
its autocast, the path of ``fastpath.choose_path`` (``inference_path``, ``training_path``), the model as
that path runs it (``apply_path``), and the logits with test-time flips and shifts (``model_logits``).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch
from torch import nn

from ..core.errors import ConfigError
from ..core.hardware import cpu_bf16_kind
from .fastpath import ENGINES, FastPath, Hardware, Work, auto_precision, choose_path, vit_flops
from .onnxrt import OrtModel, onnxruntime_available
from .packed import Bf16Inference, onednn_bf16_available
from .quantize import onednn_int8_problem, quantize_int8


def detect_hardware(device: torch.device) -> Hardware:
    """What ``device`` can do, as ``vitkit.infer.fastpath``'s rules read it."""
    if device.type == "cpu":
        kind = cpu_bf16_kind()
        return Hardware("cpu", cpu_bf16_kind=kind, onednn_bf16=kind != "none" and onednn_bf16_available(),
                        onednn_int8=not onednn_int8_problem(), onednn_int8_why=onednn_int8_problem(),
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
    """``model`` as ``path`` runs it: on ONNX Runtime (``vitkit.infer.onnxrt.OrtModel``, exported in memory and
    checked against eager on its first batch), an int8 copy (``vitkit.infer.quantize``), conv weights
    channels-last (in place), compiled; for packed bf16, a bf16 copy with packed Linear weights
    (``vitkit.infer.packed.Bf16Inference``). Autocast for bf16 is the caller's (``autocast``)."""
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


def check_tta_shift(shift: int, size: tuple[int, int]) -> None:
    """A ConfigError unless ``shift`` px moves an input of ``size`` (H, W) and leaves some of it: 1 to
    min(H, W) - 1 (reflection takes no more)."""
    h, w = size
    if not 0 < shift < min(h, w):
        raise ConfigError(f"tta_shift: must be between 1 and {min(h, w) - 1} px for {h}x{w} inputs, got {shift}")


def shifted_views(x: torch.Tensor, shift: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (B, C, H, W) moved ``shift`` px down-right and ``shift`` px up-left, the edges filled by
    reflection: the translated views of test-time augmentation."""
    h, w = x.shape[-2:]
    check_tta_shift(shift, (h, w))
    padded = torch.nn.functional.pad(x, (shift, shift, shift, shift), mode="reflect")
    return padded[..., :h, :w], padded[..., 2 * shift:2 * shift + h, 2 * shift:2 * shift + w]


def model_logits(model: nn.Module, x: torch.Tensor, tta: bool = False, shift: int = 0,
                 flip: bool = True) -> torch.Tensor:
    """The model's logits for the input batch ``x`` (B, C, H, W). ``tta``: test-time views, by default flip
    augmentation, the mean of the logits of each image and of its left-right mirror (two forward passes).
    ``shift`` (with ``tta``): also two copies of the batch moved ``shift`` px diagonally (``shifted_views``), each
    flip-averaged too; the result is half the flip average of ``x`` and a quarter of each copy's (six forward
    passes, the weights of airbench's mirror-and-translate evaluation). ``flip`` False: no mirror images (for data
    whose mirror images change class), so ``x`` alone, or with ``shift`` its copies at the same weights (three)."""
    if not tta:
        return model(x)
    logits = (model(x) + model(x.flip(-1))) / 2 if flip else model(x)
    if shift:
        a, b = shifted_views(x, shift)
        logits = logits / 2 + (model_logits(model, a, True, 0, flip) + model_logits(model, b, True, 0, flip)) / 4
    return logits


__all__ = ["detect_hardware", "pick_precision", "inference_path", "training_path", "apply_path", "path_taken",
           "autocast", "model_logits", "shifted_views", "check_tta_shift"]
