"""Position embeddings: fixed sin-cos tables and resampling of learned tables to a new grid.

Every function here is pure (no module state) and computes in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sincos_1d(num_positions: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """The Transformer's 1D table, as in the 'from scratch' tutorial: (num_positions, dim).

    Even channels j hold sin(i / T^(j/dim)), odd channels cos(i / T^((j-1)/dim)), interleaved.
    """
    pos = torch.arange(num_positions, dtype=torch.float32)[:, None]  # (N, 1)
    j = torch.arange(0, dim, 2, dtype=torch.float32)  # even channel indices
    angle = pos / temperature ** (j / dim)  # (N, dim/2)
    out = torch.empty(num_positions, dim, dtype=torch.float32)
    out[:, 0::2] = torch.sin(angle)
    out[:, 1::2] = torch.cos(angle)
    return out


def sincos_2d(grid: tuple[int, int], dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """The 2D table of big_vision and MoCo v3: (gh * gw, dim), rows in raster order.

    A quarter of the channels each: sin(x w), cos(x w), sin(y w), cos(y w) with
    w_k = 1 / T^(k / (dim/4 - 1)), x the column and y the row of the patch.
    """
    gh, gw = grid
    q = dim // 4
    y, x = torch.meshgrid(
        torch.arange(gh, dtype=torch.float32), torch.arange(gw, dtype=torch.float32), indexing="ij"
    )
    omega = torch.arange(q, dtype=torch.float32) / max(q - 1, 1)
    omega = 1.0 / temperature**omega  # (q,)
    ang_y = y.flatten()[:, None] * omega[None]  # (N, q)
    ang_x = x.flatten()[:, None] * omega[None]
    return torch.cat([ang_x.sin(), ang_x.cos(), ang_y.sin(), ang_y.cos()], dim=1)  # (N, dim)


def resample_pos_embed(
    posemb: torch.Tensor,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    mode: str = "bicubic",
    antialias: bool = False,
) -> torch.Tensor:
    """Resample a learned (1, prefix + gh*gw, D) table to a new patch grid, keeping the prefix tokens.

    The patch part is viewed as a (D, gh, gw) image and interpolated in 2D, in float32, then cast back.
    ``old_grid`` defaults to the square root of the patch count. Defaults follow HF (bicubic, no
    antialias); timm uses antialias=True, torchvision mode='bicubic' with align_corners=True (not
    offered), JAX a linear zoom (mode='bilinear').
    """
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(f"resample_pos_embed: expected a (1, T, D) table, got {tuple(posemb.shape)}")
    n_patch = posemb.shape[1] - num_prefix_tokens
    if old_grid is None:
        side = int(round(n_patch**0.5))
        if side * side != n_patch:
            raise ValueError(
                f"resample_pos_embed: {n_patch} patch positions are not a square grid; pass old_grid"
            )
        old_grid = (side, side)
    if old_grid[0] * old_grid[1] != n_patch:
        raise ValueError(f"resample_pos_embed: old_grid {old_grid} does not hold {n_patch} positions")
    tracing = torch.jit.is_tracing() or torch.compiler.is_compiling()
    if not tracing:  # under an exporter the sizes may be symbolic: keep them, and record the resize
        new_grid = (int(new_grid[0]), int(new_grid[1]))
        if tuple(old_grid) == new_grid:
            return posemb
    prefix, patches = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    dtype = patches.dtype
    D = patches.shape[-1]
    patches = patches.float().reshape(1, old_grid[0], old_grid[1], D).permute(0, 3, 1, 2)  # (1, D, gh, gw)
    kw = {} if mode == "nearest" else {"align_corners": False, "antialias": antialias}
    patches = F.interpolate(patches, size=new_grid, mode=mode, **kw)
    patches = patches.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], D).to(dtype)
    return torch.cat([prefix, patches], dim=1)
