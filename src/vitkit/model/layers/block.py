"""One encoder block: attention and MLP sub-blocks, each with a residual connection.

pre-LN (ViT):   x = x + attn(norm1(x));  x = x + mlp(norm2(x))
post-LN (the original Transformer):  x = norm1(x + attn(x));  x = norm2(x + mlp(x))

``block(x)`` returns the tokens; ``block.forward_with_attention(x)`` also returns the block's
attention probabilities (computed by the manual attention path).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention
from .mlp import Mlp


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch per sample with probability p (training only)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """Per-channel learnable scale of a residual branch (CaiT, DeiT III), initialised small."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.init_value = init
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma

    @torch.no_grad()
    def init_weights(self) -> None:
        """Every channel back to the initial scale."""
        nn.init.constant_(self.gamma, self.init_value)


class Block(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_hidden: int,
        qkv_bias: bool = True,
        act: str = "gelu",
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm: str = "pre",
        eps: float = 1e-6,
        fused_attn: bool = True,
        layer_scale: float | None = None,
        qk_norm: bool = False,
    ):
        super().__init__()
        self.pre_norm = norm == "pre"
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop, fused=fused_attn, qk_norm=qk_norm,
                              norm_eps=eps)
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, mlp_hidden, act, drop)
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D). Each step rebinds ``x``, so no intermediate outlives its use: the
        attention's output is freed before the MLP runs (held longer, it changed the allocator's pattern
        and cost inference a few percent)."""
        x = self._add_attention(x, self.attn(self.norm1(x) if self.pre_norm else x))
        return self._add_mlp(x)

    def forward_with_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D) -> (B, T, D) and the block's (B, H, T, T) attention probabilities."""
        a, attn = self.attn.forward_with_attention(self.norm1(x) if self.pre_norm else x)
        x = self._add_attention(x, a)
        del a
        return self._add_mlp(x), attn

    def _add_attention(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The first residual sum, given the attention output ``a`` (post-LN: and its norm)."""
        x = x + self.drop_path1(self.ls1(a))
        return x if self.pre_norm else self.norm1(x)

    def _add_mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP and the second residual sum (post-LN: and its norm)."""
        if self.pre_norm:
            return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return self.norm2(x + self.drop_path2(self.ls2(self.mlp(x))))
