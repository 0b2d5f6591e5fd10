"""bf16 inference on a CPU with the weights cast once and laid out ahead for oneDNN's matrix kernels.

Under autocast every forward casts each Linear's fp32 weight to bf16 and each fp32 activation back and
forth, and oneDNN reorders each weight into its blocked layout (AMX tiles) on every call. ``Bf16Inference``
does the weights' part once: a copy of the model whose Linear layers hold their weight already cast and
reordered (``PackedLinear``, oneDNN's ``_reorder_linear_weight`` / ``_linear_pointwise``, the kernels
torch.compile's CPU backend uses for frozen weights), run under autocast as before, so that the logits are
autocast's own. ``vitkit.infer.fastpath`` decides where it pays (``packed_pays``).

With ``stream='bfloat16'`` the copy runs its encoder blocks wholly in bf16 as well: LayerNorm reads and
writes bf16, and each residual sum happens inside the Linear kernel that ends its branch (oneDNN's sum
post-op, ``PackedLinear.add_to``), so the casts between the float32 stream and the bf16 products go; the
stem and the head stay as autocast runs them (a whitening conv in float32). ``vitkit.infer.fastpath``
decides where it pays (``bf16_stream_pays``, ``STREAM_MEASURED``: benchmarks/packed_bf16.py; top-1
agreement with fp32: benchmarks/path_agreement.py; the figures: docs/performance.md).

For inference only: the packed weights have no gradient and are not parameters (``state_dict`` of the
copy holds the other weights only); the original model is left as it was.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..model.layers import Attention, Block, LayerScale, Mlp, softmax_attention
from ..model.vit import VisionTransformer


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
        self._check(x)
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed, self.bias, "none", [], "")

    def add_to(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)`` in one kernel (oneDNN's sum post-op), for a ``residual`` of the output's
        shape, in ``dtype``."""
        self._check(x)
        return torch.ops.mkldnn._linear_pointwise.binary(x.to(self.dtype), residual, self.packed, self.bias, "add")

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"PackedLinear: input has {x.shape[-1]} features in its last dim, "
                             f"expected {self.in_features} (shape {tuple(x.shape)})")

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


def fold_layer_scale(linear: nn.Linear, scale: nn.Module) -> None:
    """Fold a residual branch's ``LayerScale`` into the Linear before it (in place): gamma * (W x + b) =
    (gamma W) x + gamma b. Any other ``scale`` (nn.Identity) leaves it as it is."""
    if isinstance(scale, LayerScale):
        with torch.no_grad():
            linear.weight.mul_(scale.gamma[:, None])
            if linear.bias is not None:
                linear.bias.mul_(scale.gamma)


def bf16_block(blk: Block, x: torch.Tensor) -> torch.Tensor:
    """``blk(x)`` in eval mode for a bf16 ``x`` (B, T, D), everything in bf16: LayerNorm reads and writes
    bf16 (its sums in float32), and each residual sum happens inside the Linear that ends its branch
    (``PackedLinear.add_to``), its LayerScale folded into that Linear's weights beforehand."""
    attn, mlp = blk.attn, blk.mlp
    q, k, v = attn.split_heads(blk.norm1(x))
    out = F.scaled_dot_product_attention(q, k, v) if attn.fused else softmax_attention(q, k, v, attn.scale)[0]
    del q, k, v
    x = attn.proj.add_to(attn.concat_heads(out), x)
    del out
    return mlp.fc2.add_to(mlp.act(mlp.fc1(blk.norm2(x))), x)


class Bf16Inference(nn.Module):
    """``model`` for CPU inference in bf16: a copy, eval mode, its Linear weights cast to bf16 and packed
    once (``PackedLinear``), run under bf16 autocast. Takes the usual float input and returns float32
    logits; ``cfg`` and ``preprocess`` are the model's.

    ``stream``: the dtype of the residual stream between the blocks. 'float32' (the default): everything
    as autocast runs it (the residual stream, LayerNorm and a conv stem's BatchNorm in float32, the
    whitening stem's conv in float32, the other products in bf16), so the logits are autocast's.
    'bfloat16': the stem and the head as autocast runs them, the encoder blocks wholly in bf16
    (``bf16_block``: the residual sums inside the Linear kernels, no casts between them); a model with
    blocks of another kind keeps autocast's way throughout: ``stream`` is then 'float32', the stream it runs."""

    STREAMS = ("float32", "bfloat16")

    def __init__(self, model: nn.Module, stream: str = "float32"):
        super().__init__()
        if stream not in self.STREAMS:
            raise ValueError(f"Bf16Inference: stream {stream!r} is not one of {', '.join(self.STREAMS)}")
        if not onednn_bf16_available():
            raise RuntimeError("bf16 packed inference needs a torch build with oneDNN and a CPU with bf16 support")
        self.cfg = getattr(model, "cfg", None)
        self.preprocess = getattr(model, "preprocess", None)
        self.net = copy.deepcopy(model).eval().requires_grad_(False)
        self.stream = stream if self.blocks() else "float32"  # the stream it runs
        if self.stream == "bfloat16":
            for blk in self.blocks():
                fold_layer_scale(blk.attn.proj, blk.ls1)
                fold_layer_scale(blk.mlp.fc2, blk.ls2)
                blk.ls1, blk.ls2 = nn.Identity(), nn.Identity()
        self.linears = pack_linears(self.net)

    def blocks(self) -> list[Block]:
        """The encoder blocks that run on the bf16 stream: the model's, where it is a VisionTransformer
        and each block is of the library's plain pre-LN kind."""
        net = self.net
        if not (isinstance(net, VisionTransformer) and len(net.blocks)):
            return []
        blocks = list(net.blocks)
        ok = all(type(b) is Block and b.pre_norm and type(b.attn) is Attention and type(b.mlp) is Mlp
                 and all(type(m) in (nn.Linear, PackedLinear) for m in (b.attn.qkv, b.attn.proj, b.mlp.fc1, b.mlp.fc2))
                 for b in blocks)
        return blocks if ok else []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            if self.stream == "float32":
                return self.net(x).float()
            net = self.net
            tokens = net.embed_positions(net.patch_embed(x), net.check_input(x)).to(torch.bfloat16)
        with torch.autocast(x.device.type, enabled=False):  # bf16 in, bf16 out: no float32 LayerNorm
            for blk in net.blocks:
                tokens = bf16_block(blk, tokens)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return net.forward_head(net.norm(tokens)).float()
