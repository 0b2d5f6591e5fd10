"""Patch embedding: (B, C, H, W) images to (B, N, D) tokens, N = (H/P) * (W/P).

Two ways to compute the same thing, sharing one parameter, ``proj.weight`` of shape (D, C, P, P):
- 'conv':   a Conv2d with kernel = stride = P (what timm, HF and the JAX code do);
- 'linear': cut the image into P x P patches (space-to-depth), flatten each in (C, P, P) order and
            apply a Linear layer whose weight is ``proj.weight`` viewed as (D, C*P*P) (the tutorials).
Because the parameter is the same tensor, either mode loads the other's checkpoint unchanged.

``resample_patch_embed`` resizes that kernel to another patch size (FlexiViT, Beyer et al. 2023): with
B the matrix that resizes a flattened P x P patch to the new size by the chosen interpolation, the new
kernel is pinv(B^T) w, so that <B x, w_new> = <x, w> for every patch x when the new size is larger
(exactly), and in the least-squares sense when it is smaller. ``PatchEmbed.resample_patch_size``
applies it in place.

Each stem knows its initialisation (``init_weights``), the same under every model init: the patch
projection as the Dense layer it is (LeCun normal), the convolutional stem as a CNN (He normal).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...core.errors import ConfigError
from .weight_init import lecun_normal_

RESIZE_MODES = ("bicubic", "bilinear", "nearest")  # interpolations a patch kernel can be resampled for


def resize_matrix(
    old_size: tuple[int, int], new_size: tuple[int, int], mode: str = "bicubic", antialias: bool = True
) -> torch.Tensor:
    """The float64 matrix B (new_h*new_w, old_h*old_w) of ``F.interpolate`` resizing one patch:
    resize(x).flatten() = B @ x.flatten(). Column j is the resized j-th basis image."""
    n_old = old_size[0] * old_size[1]
    basis = torch.eye(n_old, dtype=torch.float64).reshape(n_old, 1, *old_size)
    kw = {} if mode == "nearest" else {"align_corners": False, "antialias": antialias}
    resized = F.interpolate(basis, size=tuple(new_size), mode=mode, **kw)  # (n_old, 1, new_h, new_w)
    return resized.reshape(n_old, -1).T


def resample_patch_embed(
    weight: torch.Tensor, new_size: tuple[int, int], mode: str = "bicubic", antialias: bool = True
) -> torch.Tensor:
    """A patch kernel (D, C, p, p) resized to (D, C, *new_size) by the pseudo-inverse resize (FlexiViT).

    Each (p, p) filter w becomes pinv(B^T) w, B = ``resize_matrix``: the embedding of a patch resized
    with ``mode`` / ``antialias`` through the new kernel equals that of the patch through the old one
    (exactly when enlarging; least squares when shrinking). Computed in float64, returned in the
    weight's dtype. The defaults are timm's (``timm.layers.resample_patch_embed``).
    """
    if weight.ndim != 4:
        raise ValueError(f"resample_patch_embed: expected a (D, C, p, p) kernel, got {tuple(weight.shape)}")
    old_size, new_size = tuple(weight.shape[-2:]), (int(new_size[0]), int(new_size[1]))
    if old_size == new_size:
        return weight
    B = resize_matrix(old_size, new_size, mode, antialias)  # (new, old)
    pinv_t = torch.linalg.pinv(B.T).to(weight.device)  # (new, old): w_new = pinv(B^T) w
    D, C = weight.shape[:2]
    flat = weight.detach().double().reshape(D * C, -1)  # one filter a row
    return (flat @ pinv_t.T).reshape(D, C, *new_size).to(weight.dtype)


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
    def resample_patch_size(self, patch_size: int, mode: str = "bicubic", antialias: bool = True) -> None:
        """Take patches of ``patch_size`` from now on, the kernel resized by ``resample_patch_embed``:
        in place, the bias kept, no random draw (a fresh Conv2d would consume the RNG)."""
        if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1:
            raise ConfigError(f"resample_patch_size: the patch size must be a positive integer, got {patch_size!r}")
        if mode not in RESIZE_MODES:
            raise ConfigError(f"resample_patch_size: mode {mode!r} is not one of {', '.join(RESIZE_MODES)}")
        proj = self.proj
        new = resample_patch_embed(proj.weight, (patch_size, patch_size), mode, antialias)
        proj.weight = nn.Parameter(new, requires_grad=proj.weight.requires_grad)
        proj.kernel_size = proj.stride = (patch_size, patch_size)
        self.patch_size = patch_size

    @torch.no_grad()
    def init_weights(self) -> None:
        """LeCun normal with fan_in = C*P*P, as a Dense layer on the flattened patch (the paper); zero bias."""
        lecun_normal_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)


WHITEN_EPS = 5e-4  # added to every eigenvalue of the patch covariance: noise directions are not blown up


def patch_whitening(images: torch.Tensor, k: int = 2, eps: float = WHITEN_EPS) -> torch.Tensor:
    """Whitening filters (C*k*k, C, k, k) for the k x k patches of ``images`` (N, C, H, W, normalised):
    the eigenvectors of the patches' covariance, each scaled by 1 / sqrt(eigenvalue + eps), largest
    eigenvalue first. The patches x (flattened in (C, k, k) order) map to W x, whose covariance is
    diag(lambda / (lambda + eps)): the identity wherever the data has variance. Computed in float64."""
    if images.ndim != 4:
        raise ValueError(f"patch_whitening: expected (N, C, H, W) images, got {tuple(images.shape)}")
    C = images.shape[1]
    patches = images.double().unfold(2, k, 1).unfold(3, k, 1)  # (N, C, H-k+1, W-k+1, k, k)
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, C * k * k)  # one patch a row, (C, k, k) order
    centred = patches - patches.mean(0)
    cov = centred.T @ centred / max(len(centred) - 1, 1)  # (C*k*k, C*k*k)
    eigvals, eigvecs = torch.linalg.eigh(cov)  # ascending
    eigvals, eigvecs = eigvals.flip(0).clamp_min(0), eigvecs.flip(1)  # largest first
    filters = eigvecs.T / torch.sqrt(eigvals + eps)[:, None]  # (C*k*k, C*k*k): one filter a row
    return filters.reshape(C * k * k, C, k, k).to(images.dtype)


class PatchWhitening(nn.Module):
    """A frozen k x k, stride-k conv whose filters whiten the data's patches, and their negatives
    (Jordan 2024, airbench: "patch-whitening initialisation", from Page's ResNet-9 recipe).

    Its 2*C*k*k output channels are W x and -W x, W the whitening filters (``patch_whitening``), so that
    the ReLU after it keeps every direction. The filters are a buffer (saved with the weights, never
    trained); until ``set_filters`` gives them the data's, they are the pixel basis (W = I).
    """

    def __init__(self, in_chans: int, k: int = 2):
        super().__init__()
        self.k = k
        eye = torch.eye(in_chans * k * k).reshape(-1, in_chans, k, k)
        self.register_buffer("weight", torch.cat([eye, -eye]))  # (2*C*k*k, C, k, k)

    @property
    def out_channels(self) -> int:
        return self.weight.shape[0]

    @torch.no_grad()
    def set_filters(self, images: torch.Tensor, eps: float = WHITEN_EPS) -> None:
        """The filters of ``images`` (N, C, H, W, normalised as the model's input) and their negatives."""
        w = patch_whitening(images.to(self.weight.device), self.k, eps).to(self.weight.dtype)
        self.weight.copy_(torch.cat([w, -w]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Always in float32, autocast or not: the filters scale up the patches' low-variance directions
        # (small differences of nearby pixels), which bf16's 8-bit mantissa rounds away. On a CIFAR-10
        # model, bf16 autocast agreed with float32 on the top-1 of 99.42% of a validation carve with this
        # conv in bf16 and 99.84% with it in float32 (benchmarks/path_agreement.py).
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return F.conv2d(x.float(), self.weight.float(), stride=self.k)  # (B, 2*C*k*k, H/k, W/k)
        return F.conv2d(x.float(), self.weight.float(), stride=self.k).to(x.dtype)

    def extra_repr(self) -> str:
        return f"k={self.k}, out_channels={self.out_channels}"


class ConvStem(nn.Module):
    """Hybrid stem: a small CNN in place of the linear patch projection (Dosovitskiy et al. sec. 3.1;
    Xiao et al. 2021, "Early convolutions help transformers see better").

    log2(P) blocks of 3x3 stride-2 conv + BatchNorm + ReLU, doubling channels from ``width``, reach the
    same H/P x W/P grid as a P x P patch projection; ``extra`` more 3x3 stride-1 blocks work at that
    grid; a final 1x1 conv (``proj``) maps to D. ``early`` 3x3 stride-1 blocks of ``width`` channels come
    right after the first stride-2 block, at twice the grid's resolution.

    ``whiten``: the first block's conv is a frozen 2x2 stride-2 ``PatchWhitening`` instead (2*C*4
    channels), whose filters are set from the training data before training (``set_whitening``);
    ``whiten_affine=False``: the BatchNorm after it normalises without a learned scale and shift, so the
    stem's first learned conv needs no input gradient.
    ``bn_momentum``: the BatchNorm layers' running-statistics momentum (torch's 0.1; higher follows the
    changing statistics of a short run more closely).
    ``dirac``: each learned 3x3 conv starts as the identity on its first in-channels filters (a stride-2
    conv: the subsampled input), the others He normal (``init_weights``).
    """

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, width: int = 32, extra: int = 0,
                 whiten: bool = False, bn_momentum: float = 0.1, dirac: bool = False, early: int = 0,
                 whiten_affine: bool = True):
        super().__init__()
        self.dirac = dirac
        n = int(math.log2(patch_size))
        layers: list[nn.Module] = []
        c_in = in_chans
        for i in range(n):
            affine = True
            if i == 0 and whiten:
                conv: nn.Module = PatchWhitening(c_in, 2)
                c_out, affine = conv.out_channels, whiten_affine
            else:
                c_out = width * 2**i
                conv = nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False)
            layers += [conv, nn.BatchNorm2d(c_out, momentum=bn_momentum, affine=affine), nn.ReLU(inplace=True)]
            c_in = c_out
            for _ in range(early if i == 0 else 0):
                layers += [nn.Conv2d(c_in, width, 3, padding=1, bias=False),
                           nn.BatchNorm2d(width, momentum=bn_momentum), nn.ReLU(inplace=True)]
                c_in = width
        for _ in range(extra):
            layers += [nn.Conv2d(c_in, c_in, 3, padding=1, bias=False), nn.BatchNorm2d(c_in, momentum=bn_momentum),
                       nn.ReLU(inplace=True)]
        self.patch_size = patch_size
        self.stem = nn.Sequential(*layers)
        self.proj = nn.Conv2d(c_in, embed_dim, kernel_size=1)

    def resample_patch_size(self, patch_size: int, mode: str = "bicubic", antialias: bool = True) -> None:
        """Refused: the stem's strided convolutions fix its patch size; there is no patch kernel to resize."""
        raise ConfigError(f"resample_patch_size: the conv stem (stem='conv') has no patch kernel to resize "
                          f"to {patch_size}; only stem='patch' models can change their patch size")

    @property
    def whitening(self) -> PatchWhitening | None:
        """The frozen whitening layer the stem begins with, if it has one."""
        first = self.stem[0]
        return first if isinstance(first, PatchWhitening) else None

    def set_whitening(self, images: torch.Tensor) -> None:
        """Set the whitening filters from ``images`` (N, C, H, W, normalised as the model's input)."""
        if self.whitening is None:
            raise ConfigError("set_whitening: this conv stem has no whitening layer (stem_whiten=False)")
        self.whitening.set_filters(images)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(self.stem(x))  # (B, D, H/P, W/P)
        return x.flatten(2).transpose(1, 2)  # (B, N, D)

    @torch.no_grad()
    def init_weights(self) -> None:
        """He normal (fan_out, ReLU) for every conv, in order, as torchvision's ResNets; BatchNorm as identity.
        With ``dirac``, the 3x3 convs' first in-channels filters are then identities."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if self.dirac and m.kernel_size == (3, 3):
                    nn.init.dirac_(m.weight[:min(m.in_channels, m.out_channels)])
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d) and m.affine:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
