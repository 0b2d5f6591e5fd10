"""Patch embedding: (B, C, H, W) images to (B, N, D) tokens, N = (H/P) * (W/P).

Two ways to compute the same thing, sharing one parameter, ``proj.weight`` of shape (D, C, P, P):
- 'conv':   a Conv2d with kernel = stride = P (what timm, HF and the JAX code do);
- 'linear': cut the image into P x P patches (space-to-depth), flatten each in (C, P, P) order and
            apply a Linear layer whose weight is ``proj.weight`` viewed as (D, C*P*P) (the tutorials).
Because the parameter is the same tensor, either mode loads the other's checkpoint unchanged.

Each stem knows its initialisation (``init_weights``), the same under every model init: the patch
projection as the Dense layer it is (LeCun normal), the convolutional stem as a CNN (He normal).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .weight_init import lecun_normal_


class PatchEmbed(nn.Module):
    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, mode: str = "conv"):
        super().__init__()
        if mode not in ("conv", "linear"):
            raise ValueError(f"PatchEmbed: mode must be 'conv' or 'linear', got {mode!r}")
        self.patch_size = patch_size
        self.mode = mode
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        P = self.patch_size
        gh, gw = H // P, W // P
        if self.mode == "conv":
            x = self.proj(x)  # (B, D, gh, gw)
            return x.flatten(2).transpose(1, 2)  # (B, N, D)
        x = x.reshape(B, C, gh, P, gw, P)  # (B, C, gh, P, gw, P)
        x = x.permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * P * P)  # (B, N, C*P*P), (C, P, P) order
        weight = self.proj.weight.reshape(self.proj.out_channels, -1)  # (D, C*P*P)
        return F.linear(x, weight, self.proj.bias)  # (B, N, D)

    @torch.no_grad()
    def init_weights(self) -> None:
        """LeCun normal with fan_in = C*P*P, as a Dense layer on the flattened patch (the paper); zero bias."""
        lecun_normal_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)


class ConvStem(nn.Module):
    """Hybrid stem: a small CNN in place of the linear patch projection (Dosovitskiy et al. sec. 3.1;
    Xiao et al. 2021, "Early convolutions help transformers see better").

    log2(P) blocks of 3x3 stride-2 conv + BatchNorm + ReLU, doubling channels from ``width``, reach the
    same H/P x W/P grid as a P x P patch projection; ``extra`` more 3x3 stride-1 blocks work at that
    grid; a final 1x1 conv (``proj``) maps to D.
    """

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, width: int = 32, extra: int = 0):
        super().__init__()
        n = int(math.log2(patch_size))
        layers: list[nn.Module] = []
        c_in = in_chans
        for i in range(n):
            c_out = width * 2**i
            layers += [
                nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True),
            ]
            c_in = c_out
        for _ in range(extra):
            layers += [nn.Conv2d(c_in, c_in, 3, padding=1, bias=False), nn.BatchNorm2d(c_in), nn.ReLU(inplace=True)]
        self.patch_size = patch_size
        self.stem = nn.Sequential(*layers)
        self.proj = nn.Conv2d(c_in, embed_dim, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(self.stem(x))  # (B, D, H/P, W/P)
        return x.flatten(2).transpose(1, 2)  # (B, N, D)

    @torch.no_grad()
    def init_weights(self) -> None:
        """He normal (fan_out, ReLU) for every conv, in order, as torchvision's ResNets; BatchNorm as identity."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
