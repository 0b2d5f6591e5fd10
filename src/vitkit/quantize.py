"""int8 dynamic quantization of a model's Linear layers, for inference on the CPU.

``quantize_int8(model)`` returns a copy of the model whose ``nn.Linear`` layers are ``Int8Linear``:
each weight is stored as int8 with one scale per output channel (symmetric, scale = max |w| / 127),
packed once for the CPU's int8 matrix kernels (fbgemm on x86, qnnpack on ARM); the activations are
quantized on the fly, per batch, by the kernel itself (``torch.ops.quantized.linear_dynamic``), and
the output is float32. Everything else (patch embedding, norms, attention's softmax, GELU) stays in
float32, and so does the first encoder block (``float_blocks``): its input, the patch embedding plus the
positions, has the widest spread of values, and one activation scale per batch for all of it (what the
dynamic kernel uses) costs the most there. On a CIFAR-10 model (a conv tokenizer, 4 blocks of width
128), int8 agreed with float32 on the top-1 of 99.38% of a 5,000-image validation carve with every
block quantized and 99.86% with the first kept in float32 (benchmarks/path_agreement.py). About 80% of
a ViT's time is in its Linear layers, which is where int8 pays.

This is what ``torch.ao.quantization.quantize_dynamic`` does, written against the kernels rather than
that API (deprecated in recent torch), and with per-channel weight scales (quantize_dynamic's default
is one scale per tensor), which keep the logits closer to float32's.

The quantized model is for inference only: its weights are no parameters, it has no gradients, and it
cannot be saved as a vitkit checkpoint (quantize the float model again after loading it).
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from .errors import ConfigError


def int8_available() -> bool:
    """True when this torch build has the CPU int8 Linear kernels (fbgemm or qnnpack)."""
    engines = getattr(torch.backends.quantized, "supported_engines", [])
    has_ops = hasattr(torch.ops.quantized, "linear_dynamic") and hasattr(torch.ops.quantized, "linear_prepack")
    return has_ops and any(e in engines for e in ("fbgemm", "x86", "qnnpack", "onednn"))


class Int8Linear(nn.Module):
    """A frozen ``nn.Linear`` with int8 per-channel weights and dynamically quantized activations."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float().cpu()
        scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()  # one scale per output channel
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        bias = linear.bias.detach().float().cpu() if linear.bias is not None else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized-tensor constructors announce their move to torchao
            qweight = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # reduce_range: 7-bit activations, which x86's int8 multiply-add needs to never saturate
        return torch.ops.quantized.linear_dynamic(x.float(), self._packed, True)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel weights"


def quantize_int8(model: nn.Module, float_blocks: int = 1) -> nn.Module:
    """A copy of ``model`` (float32, eval mode, on the CPU) with every ``nn.Linear`` an ``Int8Linear``,
    except in its first ``float_blocks`` encoder blocks (``model.blocks``; the module docstring says why).

    The model given is left as it was. Raises ConfigError when this torch build has no int8 kernels.
    """
    if not int8_available():
        raise ConfigError("int8: this torch build has no CPU int8 Linear kernels (fbgemm / qnnpack)")
    if float_blocks < 0:
        raise ConfigError(f"float_blocks: must be >= 0, got {float_blocks}")
    q = copy.deepcopy(model).float().cpu().eval()
    blocks = list(getattr(q, "blocks", []))[:float_blocks]
    kept = {id(m) for b in blocks for m in b.modules()}
    for parent in list(q.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and id(child) not in kept:  # subclasses may compute something else
                setattr(parent, name, Int8Linear(child))
    for p in q.parameters():
        p.requires_grad_(False)
    return q


__all__ = ["Int8Linear", "quantize_int8", "int8_available"]
