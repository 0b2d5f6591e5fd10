"""Multi-head self-attention.

``Attention`` holds one fused qkv Linear (timm's layout: weight (3D, D), rows q then k then v, each
split into heads of size D/H) and computes softmax(Q K^T / sqrt(d_head)) V either with
F.scaled_dot_product_attention (fused) or explicitly (manual); a fused module takes the explicit path
where it is measured faster (``math_attention_pays``: a bf16 training step on a CPU). ``forward`` returns the tokens only;
``forward_with_attention`` also returns the attention probabilities, taking the manual path for that
call whichever path the module runs otherwise. ``PerHeadAttention`` is the textbook formulation with
a separate q, k, v projection per head; it exists as a readable reference and converts to and from
``Attention`` weights.

With ``qk_norm`` the queries and keys pass through a LayerNorm over the head dimension before their
dot product (Dehghani et al. 2023, ViT-22B): one norm for the queries and one for the keys, each
shared by every head (``q_norm``, ``k_norm``, as timm). It bounds the attention logits, which keeps
large models and high learning rates stable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def softmax_attention(q, k, v, scale: float, drop: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T * scale) V written out, for q (B, H, Tq, hd) and k, v (B, H, T, hd): the per-head
    outputs (B, H, Tq, hd) and the probabilities (B, H, Tq, T), before ``drop`` (dropout on them)."""
    scores = (q * scale) @ k.transpose(-2, -1)  # (B, H, Tq, T)
    attn = scores.softmax(dim=-1)
    return (drop(attn) if drop is not None else attn) @ v, attn


def math_attention_pays(q: torch.Tensor) -> bool:
    """Whether the written-out attention (``softmax_attention``) replaces the fused kernel for a call on
    ``q``: a bf16 call on a CPU that autograd records (a training step), where the fused kernel's forward
    and backward measured slower. A float32 step and inference keep the fused kernel. Measured by
    benchmarks/attention_backward.py -> benchmarks/results/attention_backward_{amx,avx512bf16}.json; the
    figures: docs/performance.md, "The written-out attention in bf16 training"."""
    return q.device.type == "cpu" and q.dtype == torch.bfloat16 and q.requires_grad and torch.is_grad_enabled()


def qk_norms(head_dim: int, on: bool, eps: float) -> tuple[nn.Module, nn.Module]:
    """The query and key norms: a LayerNorm over the head dimension each (shared by the heads), or identities."""
    if not on:
        return nn.Identity(), nn.Identity()
    return nn.LayerNorm(head_dim, eps=eps), nn.LayerNorm(head_dim, eps=eps)


class Attention(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused: bool = True,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"Attention: dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused = fused
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.q_norm, self.k_norm = qk_norms(self.head_dim, qk_norm, norm_eps)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        q, k, v = self.split_heads(x)
        if self.fused and not math_attention_pays(q):
            p = self.attn_drop.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # (B, H, T, hd)
        else:
            out, _ = softmax_attention(q, k, v, self.scale, self.attn_drop)
        del q, k, v  # the qkv buffer goes before the projection runs
        out = self.concat_heads(out)  # rebound: the per-head layout goes too
        return self.proj_drop(self.proj(out))

    def forward_with_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) -> (B, T, D) and the (B, H, T, T) attention probabilities, by the manual path."""
        q, k, v = self.split_heads(x)
        out, attn = softmax_attention(q, k, v, self.scale, self.attn_drop)
        return self.proj_drop(self.proj(self.concat_heads(out))), attn

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, D) tokens -> q, k, v, each (B, H, T, hd); q and k normalised if ``qk_norm``."""
        B, T, _ = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim)  # (B, T, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, hd)
        return self.q_norm(q), self.k_norm(k), v

    @staticmethod
    def concat_heads(out: torch.Tensor) -> torch.Tensor:
        """(B, H, T, hd) per-head outputs -> concatenated heads (B, T, D)."""
        B, H, T, hd = out.shape
        return out.transpose(1, 2).reshape(B, T, H * hd)


class PerHeadAttention(nn.Module):
    """The tutorials' formulation: head i has its own q_i, k_i, v_i projections (D -> d_head);
    head_i = softmax(q_i(x) k_i(x)^T / sqrt(d_head)) v_i(x); the heads are concatenated and projected.

    With ``sliced=True`` head i sees only its slice x[..., i*d:(i+1)*d] (d_head -> d_head maps), as in
    the 'from scratch' MNIST tutorial; that equals fused attention with a block-diagonal qkv weight.
    With ``qk_norm`` every head's q_i(x) and k_i(x) pass through the one ``q_norm`` and ``k_norm``
    the heads share.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, sliced: bool = False,
                 qk_norm: bool = False, norm_eps: float = 1e-6):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"PerHeadAttention: dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = hd = dim // num_heads
        self.sliced = sliced
        d_in = hd if sliced else dim
        self.q = nn.ModuleList(nn.Linear(d_in, hd, bias=qkv_bias) for _ in range(num_heads))
        self.k = nn.ModuleList(nn.Linear(d_in, hd, bias=qkv_bias) for _ in range(num_heads))
        self.v = nn.ModuleList(nn.Linear(d_in, hd, bias=qkv_bias) for _ in range(num_heads))
        self.q_norm, self.k_norm = qk_norms(hd, qk_norm, norm_eps)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hd = self.head_dim
        heads = []
        for i in range(self.num_heads):
            xi = x[..., i * hd : (i + 1) * hd] if self.sliced else x  # (B, T, d_in)
            q, k, v = self.q_norm(self.q[i](xi)), self.k_norm(self.k[i](xi)), self.v[i](xi)  # (B, T, hd)
            attn = torch.softmax(q @ k.transpose(-2, -1) / hd**0.5, dim=-1)  # (B, T, T)
            heads.append(attn @ v)  # (B, T, hd)
        return self.proj(torch.cat(heads, dim=-1))  # (B, T, D)

    @torch.no_grad()
    def fused_state_dict(self) -> dict[str, torch.Tensor]:
        """The same weights in ``Attention``'s layout (qkv.weight (3D, D), qkv.bias, q_norm.*, k_norm.*,
        proj.*)."""
        dim, hd = self.proj.in_features, self.head_dim
        ws, bs = [], []
        for group in (self.q, self.k, self.v):
            for i, lin in enumerate(group):
                w = torch.zeros(hd, dim, dtype=lin.weight.dtype)
                if self.sliced:
                    w[:, i * hd : (i + 1) * hd] = lin.weight  # block-diagonal
                else:
                    w.copy_(lin.weight)
                ws.append(w)
                if lin.bias is not None:
                    bs.append(lin.bias)
        sd = {"qkv.weight": torch.cat(ws, 0), "proj.weight": self.proj.weight.clone(), "proj.bias": self.proj.bias.clone()}
        if bs:
            sd["qkv.bias"] = torch.cat(bs, 0)
        for name in ("q_norm", "k_norm"):
            sd.update({f"{name}.{k}": v.clone() for k, v in getattr(self, name).state_dict().items()})
        return sd

    @torch.no_grad()
    def load_fused(self, attn: Attention) -> "PerHeadAttention":
        """Copy the weights of a fused ``Attention`` (not ``sliced``: a full qkv has no sliced form)."""
        if self.sliced:
            raise ValueError("PerHeadAttention.load_fused: a sliced module cannot hold a full qkv weight")
        dim, hd = self.proj.in_features, self.head_dim
        w = attn.qkv.weight.reshape(3, self.num_heads, hd, dim)
        b = attn.qkv.bias.reshape(3, self.num_heads, hd) if attn.qkv.bias is not None else None
        for j, group in enumerate((self.q, self.k, self.v)):
            for i, lin in enumerate(group):
                lin.weight.copy_(w[j, i])
                if b is not None:
                    lin.bias.copy_(b[j, i])
        self.q_norm.load_state_dict(attn.q_norm.state_dict())
        self.k_norm.load_state_dict(attn.k_norm.state_dict())
        self.proj.load_state_dict(attn.proj.state_dict())
        return self
