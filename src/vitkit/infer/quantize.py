"""int8 dynamic quantization of a model's Linear layers, for inference on the CPU.

``quantize_int8(model)`` returns a copy of the model whose ``nn.Linear`` layers are ``Int8Linear``:
each weight is stored as int8 with one scale per output channel (symmetric, scale = max |w| / 127),
packed once for the CPU's int8 matrix kernels; the activations are quantized on the fly, one scale and
zero point per call (over the whole batch), and the output is float32. Everything else (patch
embedding, norms, attention's softmax) stays in float32, and so does the first encoder block
(``float_blocks``): its input, the patch embedding plus the positions, has the widest spread of values,
and one activation scale per batch for all of it costs the most there (measured with
benchmarks/path_agreement.py; the figures: docs/performance.md, "int8 keeps the first block in
float32"). About 80% of a ViT's time is in its Linear layers, which is where int8 pays.

Two kernels, the same weights (``KERNELS``):

- ``onednn``: oneDNN's int8 matrix product (``torch.ops.onednn.qlinear_pointwise``, the kernel
  torch.compile's x86 backend lowers int8 Linear layers to), on plain uint8 / int8 tensors. The
  activations use all 8 bits (asymmetric, uint8), and an MLP's activation (GELU, ReLU) runs inside the
  kernel, on its int32 sums dequantized, instead of as a pass of its own. Used where
  ``vitkit.infer.fastpath.INT8_ONEDNN_MEASURED`` has it faster than fbgemm (a CPU with AMX, its int8
  tile multiply, at the sizes and batches measured).
- ``fbgemm`` (``qnnpack`` on ARM): torch's quantized engine (``torch.ops.quantized.linear_dynamic``),
  which quantizes the activations itself, to 7 bits (``reduce_range``): x86's int8 multiply-add without
  VNNI saturates at 16 bits otherwise.

``vitkit.infer.fastpath`` picks the kernel (``int8_kernel``: oneDNN where it was measured to pay); ``kernel=``
forces one. Both are ``torch.ao.quantization.quantize_dynamic``'s computation, written against the
kernels rather than that API (deprecated in recent torch), with per-channel weight scales (its default
is one scale per tensor), which keep the logits closer to float32's.

The quantized model is for inference only: its weights are no parameters, it has no gradients, and it
cannot be saved as a vitkit checkpoint (quantize the float model again after loading it).
"""

from __future__ import annotations

import copy
import functools
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import ConfigError
from ..core.hardware import cpu_bf16_kind
from .fastpath import Hardware, Work, int8_kernel, vit_flops

KERNELS = ("onednn", "fbgemm")
# an MLP's activation -> oneDNN's post-op (name, algorithm); F's function where the kernel cannot fuse it
ONEDNN_POST_OPS = {"gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"), "relu": ("relu", "")}
_UNFUSED = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


def int8_available() -> bool:
    """True when this torch build has CPU int8 Linear kernels (oneDNN's, or fbgemm / qnnpack)."""
    return onednn_int8_available() or fbgemm_available()


def fbgemm_available() -> bool:
    """True when this torch build has the quantized engine's dynamic int8 Linear (fbgemm or qnnpack) and it
    computes a check product exactly here (``fbgemm_problem``)."""
    return not fbgemm_problem()


@functools.cache
def fbgemm_problem() -> str:
    """Why the quantized engine's dynamic int8 Linear cannot be used here; "" where it can. Its check is
    ``onednn_int8_problem``'s product: activations of 0 and 255 only, which its 7-bit quantization holds
    exactly (scale 255 / 127), so any error is the kernel's."""
    engines = getattr(torch.backends.quantized, "supported_engines", [])
    has_ops = hasattr(torch.ops.quantized, "linear_dynamic") and hasattr(torch.ops.quantized, "linear_prepack")
    if not (has_ops and any(e in engines for e in ("fbgemm", "x86", "qnnpack", "onednn"))):
        return "this torch build has no quantized dynamic int8 Linear"
    try:
        error = check_product_error(_fbgemm_check_product)
    except RuntimeError as e:
        return f"the quantized engine's int8 Linear failed on a check product ({str(e).splitlines()[0][:80]})"
    if error > CHECK_TOLERANCE:
        return f"the quantized engine's int8 Linear is wrong by {error:.3g} on a check product on this CPU"
    return ""


def _fbgemm_check_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized-tensor constructors announce their move to torchao
        qweight = torch._make_per_channel_quantized_tensor(
            w, torch.ones(w.shape[0], dtype=torch.double), torch.zeros(w.shape[0], dtype=torch.long), 0)
        return torch.ops.quantized.linear_dynamic(x.float(), torch.ops.quantized.linear_prepack(qweight, None), True)


def onednn_int8_available() -> bool:
    """True where oneDNN's int8 Linear runs here and computes its products exactly (``onednn_int8_problem``)."""
    return not onednn_int8_problem()


@functools.cache
def onednn_int8_problem() -> str:
    """Why oneDNN's int8 Linear cannot be used here, in a few words; "" where it can: this torch build has
    the ops and a check product through them equals the same product in float32 (run once a process).

    The check multiplies the extreme values real inputs reach, 8-bit activations up to 255 by weights of
    +-127, summed over 64 inputs: on an x86 CPU without VNNI (AVX512-VNNI, AVX-VNNI) or AMX, the u8 x s8
    multiply-add sums each pair of products in 16 bits, and 2 * 255 * 127 saturates there, so the kernel
    returns wrong numbers without an error. fbgemm's path quantizes activations to 7 bits and never does."""
    try:
        if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")):
            return "this torch build has no oneDNN int8 Linear"
        error = check_product_error(_onednn_check_product)
    except (AttributeError, RuntimeError) as e:
        return f"oneDNN's int8 Linear failed on a check product ({str(e).splitlines()[0][:80]})"
    if error > CHECK_TOLERANCE:
        return (f"oneDNN's int8 Linear is wrong by {error:.3g} on a check product on this CPU (8-bit products "
                "saturate without VNNI or AMX)")
    return ""


# the check product's largest allowed error, relative to its largest output: the exact integer sums in float32
CHECK_TOLERANCE = 1e-5


def check_operands() -> tuple[torch.Tensor, torch.Tensor]:
    """The check product's operands: 8-bit activations (one row at 255, one at 0, one alternating) and int8
    weights (rows of +127, -127, alternating signs, and a ramp), 64 inputs each."""
    k = 64
    alternating = torch.arange(k) % 2
    x = torch.stack([torch.full((k,), 255), torch.zeros(k, dtype=torch.long), alternating * 255]).to(torch.uint8)
    w = torch.stack([torch.full((k,), 127), torch.full((k,), -127), (1 - 2 * alternating) * 127,
                     torch.arange(k) * 4 - 127]).clamp(-127, 127).to(torch.int8)
    return x, w


def check_product_error(product) -> float:
    """The largest error of ``product(x, w)`` (uint8 activations with zero point 0, int8 weights, scales 1 ->
    float32 (rows, out)) on ``check_operands``, relative to the largest exact output."""
    x, w = check_operands()
    want = x.double() @ w.double().T
    got = product(x, w).double()
    return ((got - want).abs().max() / want.abs().max()).item()


def _onednn_check_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = w.shape[0]
    return torch.ops.onednn.qlinear_pointwise(
        x, 1.0, 0, torch.ops.onednn.qlinear_prepack(w, None), torch.ones(out),
        torch.zeros(out, dtype=torch.int32), None, 1.0, 0, torch.float32, "none", [], "")


def refuse_where_wrong(kernel: str) -> None:
    """A one-line ConfigError where ``kernel`` would return wrong numbers here, or cannot run."""
    problem = onednn_int8_problem() if kernel == "onednn" else fbgemm_problem()
    if problem:
        fallback = "; use kernel 'fbgemm' (7-bit activations, which do not saturate)" if kernel == "onednn" else ""
        raise ConfigError(f"int8 kernel {kernel!r}: {problem}{fallback}")


def activation_name(act: nn.Module) -> str | None:
    """The ``ONEDNN_POST_OPS`` name of an activation module (nn.GELU, exact or tanh; nn.ReLU), else None."""
    if type(act) is nn.GELU:
        return "gelu" if act.approximate == "none" else "gelu_tanh"
    return "relu" if type(act) is nn.ReLU else None


class Int8Linear(nn.Module):
    """A frozen ``nn.Linear`` with int8 per-channel weights and dynamically quantized activations, on
    ``kernel`` ('onednn' or 'fbgemm'); with ``act`` ('gelu', 'gelu_tanh', 'relu') the activation that
    follows it too (inside the kernel on oneDNN)."""

    def __init__(self, linear: nn.Linear, kernel: str = "fbgemm", act: str | None = None):
        super().__init__()
        if kernel not in KERNELS:
            raise ConfigError(f"int8 kernel: {kernel!r} is not one of {', '.join(KERNELS)}")
        if act is not None and act not in ONEDNN_POST_OPS:
            raise ConfigError(f"int8 activation: {act!r} is not one of {', '.join(ONEDNN_POST_OPS)}")
        self.in_features, self.out_features, self.kernel, self.act = linear.in_features, linear.out_features, kernel, act
        w = linear.weight.detach().float().cpu()
        self.w_scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)  # one scale per output channel
        self.w_int8 = torch.round(w / self.w_scale[:, None]).clamp_(-127, 127).to(torch.int8)
        self.bias = linear.bias.detach().float().cpu() if linear.bias is not None else None
        refuse_where_wrong(kernel)
        if kernel == "onednn":
            self._packed = torch.ops.onednn.qlinear_prepack(self.w_int8, None)
            self._w_zero = torch.zeros(self.out_features, dtype=torch.int32)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # quantized-tensor constructors announce their move to torchao
                qweight = torch._make_per_channel_quantized_tensor(
                    self.w_int8, self.w_scale.double(), torch.zeros(self.out_features, dtype=torch.long), 0)
                self._packed = torch.ops.quantized.linear_prepack(qweight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Int8Linear: input has {x.shape[-1]} features in its last dim, "
                             f"expected {self.in_features} (shape {tuple(x.shape)})")
        if self.kernel == "onednn":
            return self._onednn(x)
        # reduce_range: 7-bit activations, which x86's int8 multiply-add needs to never saturate
        y = torch.ops.quantized.linear_dynamic(x.float(), self._packed, True)
        return y if self.act is None else _UNFUSED[self.act](y)

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        if rows.numel() == 0:
            return x.new_zeros(*x.shape[:-1], self.out_features, dtype=torch.float32)
        lo, hi = (v.item() for v in torch.aminmax(rows))
        if not (math.isfinite(lo) and math.isfinite(hi)):  # inf / nan: they go through as float32 would
            return self._dequantized(x)
        lo, hi = min(lo, 0.0), max(hi, 0.0)  # the range holds 0, so that zero padding stays exact
        # 254 steps, not 255: with the zero point rounded, x / scale + zero + 0.5 then stays in [0, 256),
        # so that the cast (which truncates) rounds to nearest and never wraps around
        scale = (hi - lo) / 254 or 1.0
        zero = round(-lo / scale)
        q = torch.add(torch.tensor(zero + 0.5), rows, alpha=1.0 / scale).to(torch.uint8)
        post, algorithm = ONEDNN_POST_OPS[self.act] if self.act else ("none", "")
        y = torch.ops.onednn.qlinear_pointwise(q, scale, zero, self._packed, self.w_scale, self._w_zero, self.bias,
                                               1.0, 0, torch.float32, post, [], algorithm)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """The int8 weights times their scales: the float32 weight this layer multiplies by."""
        return self.w_int8.float() * self.w_scale[:, None]

    def _dequantized(self, x: torch.Tensor) -> torch.Tensor:
        """The same weights dequantized, in float32: for an input the activations' scale cannot cover."""
        y = F.linear(x.float(), self.dequantized_weight(), self.bias)
        return y if self.act is None else _UNFUSED[self.act](y)

    def extra_repr(self) -> str:
        act = f", then {self.act}" if self.act else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel weights, "
                f"{self.kernel}{act}")


def default_kernel(model: nn.Module) -> str:
    """The kernel ``vitkit.infer.fastpath.int8_kernel`` picks on this CPU for ``model`` (a batch size not known):
    fbgemm for a module without a ViT config."""
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return "fbgemm"
    hw = Hardware("cpu", cpu_bf16_kind=cpu_bf16_kind(), onednn_int8=not onednn_int8_problem(),
                  onednn_int8_why=onednn_int8_problem())
    return int8_kernel(hw, Work("infer", vit_flops(cfg)))[0]


def quantize_int8(model: nn.Module, float_blocks: int = 1, kernel: str | None = None) -> nn.Module:
    """A copy of ``model`` (float32, eval mode, on the CPU) with every ``nn.Linear`` an ``Int8Linear``,
    except in its first ``float_blocks`` encoder blocks (``model.blocks``; the module docstring says why).
    An MLP's activation (a module with ``fc1`` and ``act``, as ``layers.Mlp``) joins its first Linear.
    ``kernel``: 'onednn' or 'fbgemm', None for the one ``vitkit.infer.fastpath`` picks here for a batch of
    unknown size (the tools pass the one it picks for their batch).

    The model given is left as it was. Raises ConfigError when this torch build has no int8 kernels.
    """
    if float_blocks < 0:
        raise ConfigError(f"float_blocks: must be >= 0, got {float_blocks}")
    if kernel is None:
        kernel = default_kernel(model)
    if kernel not in KERNELS:
        raise ConfigError(f"int8 kernel: {kernel!r} is not one of {', '.join(KERNELS)}")
    refuse_where_wrong(kernel)
    q = copy.deepcopy(model).float().cpu().eval()
    blocks = list(getattr(q, "blocks", []))[:float_blocks]
    kept = {id(m) for b in blocks for m in b.modules()}
    for parent in list(q.modules()):
        if id(parent) in kept:
            continue
        act = activation_name(getattr(parent, "act", None))
        fc1 = getattr(parent, "fc1", None)
        if act is not None and type(fc1) is nn.Linear:  # the activation inside fc1's kernel: one pass fewer
            parent.fc1, parent.act = Int8Linear(fc1, kernel, act), nn.Identity()
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:  # subclasses may compute something else
                setattr(parent, name, Int8Linear(child, kernel))
    for p in q.parameters():
        p.requires_grad_(False)
    return q


__all__ = ["Int8Linear", "quantize_int8", "int8_available", "onednn_int8_available", "onednn_int8_problem",
           "check_product_error", "fbgemm_available", "KERNELS"]
