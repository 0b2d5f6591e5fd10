"""Attention pooling: a learned probe attends over the tokens (big_vision's MAP head, "multihead
attention pooling"; timm's AttentionPoolLatent as its VisionTransformer builds it for global_pool='map').

    probe (1, 1, D) -> q                        one query, split into H heads of size hd = D/H
    tokens (B, T, D) -> kv -> k, v              (B, H, T, hd) each
    softmax(q k^T / sqrt(hd)) v -> proj         (B, 1, D): the probe's multi-head attention, no residual
    x + mlp(norm(x))                            (B, 1, D): a pre-LN MLP with its residual
    -> (B, D)

The module pools whatever tokens it is given; the model gives it the patch tokens (timm drops the
class and register tokens first). Names follow timm (latent, q, kv, proj, norm, mlp.fc1 / fc2), so timm
state dicts load with an identity key map. As both references build the head, the q and kv
projections always have biases, there is no dropout, and the MLP is as wide as the blocks' MLPs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import softmax_attention
from .mlp import Mlp


class AttentionPool(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, act: str = "gelu", eps: float = 1e-6,
                 fused: bool = True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"AttentionPool: dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused = fused
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))  # the probe (big_vision's "probe")
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)  # rows: k then v
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, mlp_hidden, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) tokens -> (B, D), the probe's output."""
        return self._pool(x, with_attention=False)[0]

    def forward_with_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) -> (B, D) and the probe's (B, H, 1, T) attention probabilities, by the manual path."""
        return self._pool(x, with_attention=True)

    def _pool(self, x: torch.Tensor, with_attention: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, D = x.shape
        H, hd = self.num_heads, self.head_dim
        # the probe, once per image; a copy, not a view: a view of a parameter made under no_grad looks
        # like a leaf that needs a gradient, which torch's FlopCounterMode (vitkit bench) cannot track
        probe = self.latent.repeat(B, 1, 1)
        q = self.q(probe).reshape(B, 1, H, hd).transpose(1, 2)  # (B, H, 1, hd)
        k, v = self.kv(x).reshape(B, T, 2, H, hd).permute(2, 0, 3, 1, 4).unbind(0)  # 2 x (B, H, T, hd)
        if self.fused and not with_attention:
            out, attn = F.scaled_dot_product_attention(q, k, v), None
        else:
            out, attn = softmax_attention(q, k, v, self.scale)  # (B, H, 1, hd), (B, H, 1, T)
        out = self.proj(out.transpose(1, 2).reshape(B, 1, D))  # heads concatenated and projected
        out = out + self.mlp(self.norm(out))
        return out[:, 0], attn

    @torch.no_grad()
    def init_weights(self) -> None:
        """The probe as timm: truncated normal with std 1/sqrt(D), cut at 2 std. The layers take the model's init."""
        std = self.latent.shape[-1] ** -0.5
        nn.init.trunc_normal_(self.latent, std=std, a=-2 * std, b=2 * std)
