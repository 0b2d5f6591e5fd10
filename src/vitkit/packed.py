"""bf16 inference on a CPU with the weights cast once and laid out ahead for oneDNN's matrix kernels.

Under autocast every forward casts each Linear's fp32 weight to bf16 and each fp32 activation back and
forth, and oneDNN reorders each weight into its blocked layout (AMX tiles) on every call. ``Bf16Inference``
does the weights' part once: a copy of the model whose Linear layers hold their weight already cast and
reordered (``PackedLinear``, oneDNN's ``_reorder_linear_weight`` / ``_linear_pointwise``, the kernels
torch.compile's CPU backend uses for frozen weights), run under autocast as before, so that the logits are
autocast's own. ``vitkit.fastpath`` decides where it pays (``packed_pays``).

Casting the whole model to bf16 as well (the residual stream and LayerNorm in bf16) ran faster still
(ViT-S/16 at batch 16: 1.24x autocast against 1.15x, one noisy run), but on a CIFAR-10 model it agreed
with fp32 on the top-1 of 99.50% of a validation carve against autocast's 99.78%
(benchmarks/path_agreement.py), so the residual stream stays float32.

For inference only: the packed weights have no gradient and are not parameters (``state_dict`` of the
copy holds the other weights only); the original model is left as it was.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def onednn_bf16_available() -> bool:
    """True where this torch build can run oneDNN's bf16 Linear with a packed weight on this CPU."""
    try:
        mkldnn = torch.ops.mkldnn
        return bool(torch.backends.mkldnn.is_available() and mkldnn._is_mkldnn_bf16_supported()
                    and hasattr(mkldnn, "_reorder_linear_weight") and hasattr(mkldnn, "_linear_pointwise"))
    except (AttributeError, RuntimeError):
        return False


class PackedLinear(nn.Module):
    """A Linear for inference: its weight cast to ``dtype`` once and reordered into oneDNN's layout
    (for any number of rows: no batch size is fixed); its input is cast to ``dtype``."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.in_features, self.out_features, self.dtype = linear.in_features, linear.out_features, dtype
        weight = linear.weight.detach().to(dtype)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)  # a plain attribute: opaque layout
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"PackedLinear: input has {x.shape[-1]} features in its last dim, "
                             f"expected {self.in_features} (shape {tuple(x.shape)})")
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}, packed"


def pack_linears(module: nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    """Replace every nn.Linear inside ``module`` (in place) by a ``PackedLinear``; how many were."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:  # subclasses (e.g. quantized or LoRA layers) may compute otherwise
                setattr(parent, name, PackedLinear(child, dtype))
                count += 1
    return count


class Bf16Inference(nn.Module):
    """``model`` for CPU inference in bf16: a copy, eval mode, its Linear weights cast to bf16 and packed
    once (``PackedLinear``), run under bf16 autocast. Everything else is as autocast runs it (the residual
    stream, LayerNorm and a conv stem's BatchNorm in float32, the whitening stem's conv in float32, the
    other products in bf16), so the logits are autocast's. Takes the usual float input and returns
    float32 logits; ``cfg`` and ``preprocess`` are the model's."""

    def __init__(self, model: nn.Module):
        super().__init__()
        if not onednn_bf16_available():
            raise RuntimeError("bf16 packed inference needs a torch build with oneDNN and a CPU with bf16 support")
        self.cfg = getattr(model, "cfg", None)
        self.preprocess = getattr(model, "preprocess", None)
        self.net = copy.deepcopy(model).eval().requires_grad_(False)
        self.linears = pack_linears(self.net)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return self.net(x).float()
