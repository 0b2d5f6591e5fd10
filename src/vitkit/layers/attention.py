"""Multi-head self-attention.

``Attention`` holds one fused qkv Linear (timm's layout: weight (3D, D), rows q then k then v, each
split into heads of size D/H) and computes softmax(Q K^T / sqrt(d_head)) V either with
F.scaled_dot_product_attention (fused) or explicitly (manual). ``forward`` returns the tokens only;
``forward_with_attention`` also returns the attention probabilities, taking the manual path for that
call whichever path the module runs otherwise. ``PerHeadAttention`` is the textbook formulation with
a separate q, k, v projection per head; it exists as a readable reference and converts to and from
``Attention`` weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused: bool = True,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"Attention: dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused = fused
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        q, k, v = self._split_heads(x)
        if self.fused:
            p = self.attn_drop.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # (B, H, T, hd)
        else:
            out, _ = self._softmax_attention(q, k, v)
        return self._merge_heads(out)

    def forward_with_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) -> (B, T, D) and the (B, H, T, T) attention probabilities, by the manual path."""
        q, k, v = self._split_heads(x)
        out, attn = self._softmax_attention(q, k, v)
        return self._merge_heads(out), attn

    def _split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, D) tokens -> q, k, v, each (B, H, T, hd)."""
        B, T, _ = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim)  # (B, T, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, hd)
        return q, k, v

    def _softmax_attention(self, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        """softmax(Q K^T / sqrt(hd)) V written out: per-head outputs (B, H, T, hd) and probabilities (B, H, T, T)."""
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, T, T)
        attn = scores.softmax(dim=-1)
        return self.attn_drop(attn) @ v, attn

    def _merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        """(B, H, T, hd) per-head outputs -> concatenated heads (B, T, D) -> output projection."""
        B, H, T, hd = out.shape
        out = out.transpose(1, 2).reshape(B, T, H * hd)
        return self.proj_drop(self.proj(out))


class PerHeadAttention(nn.Module):
    """The tutorials' formulation: head i has its own q_i, k_i, v_i projections (D -> d_head);
    head_i = softmax(q_i(x) k_i(x)^T / sqrt(d_head)) v_i(x); the heads are concatenated and projected.

    With ``sliced=True`` head i sees only its slice x[..., i*d:(i+1)*d] (d_head -> d_head maps), as in
    the 'from scratch' MNIST tutorial; that equals fused attention with a block-diagonal qkv weight.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, sliced: bool = False):
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
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hd = self.head_dim
        heads = []
        for i in range(self.num_heads):
            xi = x[..., i * hd : (i + 1) * hd] if self.sliced else x  # (B, T, d_in)
            q, k, v = self.q[i](xi), self.k[i](xi), self.v[i](xi)  # (B, T, hd)
            attn = torch.softmax(q @ k.transpose(-2, -1) / hd**0.5, dim=-1)  # (B, T, T)
            heads.append(attn @ v)  # (B, T, hd)
        return self.proj(torch.cat(heads, dim=-1))  # (B, T, D)

    @torch.no_grad()
    def fused_state_dict(self) -> dict[str, torch.Tensor]:
        """The same weights in ``Attention``'s layout (qkv.weight (3D, D), qkv.bias, proj.*)."""
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
        self.proj.load_state_dict(attn.proj.state_dict())
        return self
