"""Training augmentations applied to whole batches in pure torch (CPU or CUDA tensors).

``BatchAugment(cfg, img_size, pre, num_classes)(images, labels, generator)`` takes a uint8 batch
(B, C, h, w), or a list of B uint8 images (C, h_i, w_i) of different sizes (whole photos decoded at a
short side: each random resized crop is drawn from its own image), and returns the normalised float
batch (B, C, H, W) and the targets. Every random draw
comes from the given ``torch.Generator`` (on the images' device), so a run resumed with the same
generator state produces the same batches. Order of the steps:

    crop (random resized crop | pad-and-crop | none) + horizontal flip
    -> RandAugment / TrivialAugment (per-image ops, on 0..255 values)
    -> normalise ((x/255 - mean) / std) -> random erasing -> mixup / cutmix + label smoothing

Conventions (chosen here, documented in docs/data.md): geometric auto-augment ops fill the uncovered
area with mid-grey (128); random erasing fills its box with per-pixel standard normal noise (in
normalised units, as DeiT); mixup/cutmix pair each image with the batch in reverse order, and cutmix
uses one box for the whole batch, with lambda corrected to the box's real area.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from ..core.errors import ConfigError, DataError, ShapeError
from ..core.strict import brief, from_dict, to_dict, to_hw
from .images import check_uint8, norm_consts, resize_center_crop


@dataclass
class AugmentConfig:
    crop: Literal["rrc", "pad", "none"] = "rrc"  # 'rrc' random resized crop | 'pad' pad-and-crop (CIFAR
    #   style, zeros) | 'none' (only a resize to img_size when the stored size differs)
    rrc_scale: tuple[float, float] = (0.08, 1.0)  # random resized crop: range of the crop's area / image area
    rrc_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # random resized crop: range of the crop's aspect ratio w/h
    pad: int = 4  # pad-and-crop: pixels of zero padding on every side before the random crop
    hflip: float = 0.5  # probability of a horizontal flip (use 0 for digits and text)
    mirror_check: bool = False  # before training, check on the training images whether mirroring keeps an image's
    #   class (data.mirror: a linear classifier scores them as they are and mirrored); where it does not, train
    #   with hflip 0 and score test-time views without mirror images (tta_flip false). The recipes set it
    flip_mode: Literal["random", "alternate"] = "random"  # 'random': each image is flipped with probability
    #   hflip at every visit; 'alternate' (hflip > 0): a random half of the images is flipped in the first
    #   epoch and each image is flipped in every other epoch from then on, so consecutive epochs see both
    #   views (airbench's alternating flip); the trainer gives the flips (``alternating_flips``)
    auto: Literal["none", "randaugment", "trivialaugment"] = "none"  # per-image colour/geometry ops:
    #   'randaugment' applies ra_ops random ops at ra_magnitude; 'trivialaugment' one op, random magnitude
    ra_ops: int = 2  # RandAugment: ops applied to each image (drawn with replacement)
    ra_magnitude: int = 9  # RandAugment: strength on a 0..30 scale (9 as in the paper's ImageNet setting)
    ra_magnitude_std: float = 0.0  # RandAugment: each op's magnitude drawn from N(ra_magnitude, this), clipped
    #   to 0..30 (timm's mstd, which is on its 0..10 scale: x3 here); 0 = the fixed magnitude
    ra_increasing: bool = True  # RandAugment: every op grows more severe with the magnitude (timm's 'inc1'); False:
    #   timm's default ops, where colour, contrast, brightness and sharpness factors run 0.1..1.9 (no random
    #   sign), posterize keeps 0..4 bits and solarize's threshold rises with it (ORIGINAL_LEVELS)
    ra_prob: float = 1.0  # RandAugment: each drawn op is applied with this probability (timm's: 0.5)
    mixup_alpha: float = 0.0  # mixup: lambda ~ Beta(alpha, alpha); 0 = off (0.8 in DeiT)
    cutmix_alpha: float = 0.0  # cutmix: lambda ~ Beta(alpha, alpha); 0 = off (1.0 in DeiT). With both on,
    #   each batch uses one of them, chosen with equal odds
    mix_prob: float = 1.0  # probability that a batch is mixed at all (when mixup or cutmix is on)
    label_smoothing: float = 0.0  # smoothing of the one-hot targets: 1 - eps + eps/K on the label, eps/K off it
    erase_prob: float = 0.0  # probability of random erasing per image (a box of 2%..33% of the area)
    low_size: int = 0  # progressive resizing: train at this side (px, square; a multiple of the model's patch size,
    #   below img_size) during the first low_share of the run's progress, then at img_size; 0 = off. The crop is
    #   drawn as at img_size, then resized ('rrc': cropped to low_size directly); the model takes both sizes
    low_share: float = 0.0  # the share of the run's progress (its steps, or with --max-minutes its time, as the
    #   learning-rate schedule counts it) trained at low_size; 1 = all of it (scored at img_size all the same)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        def bad(name, msg):
            raise ConfigError(f"AugmentConfig.{name}: {msg}")

        if self.flip_mode not in ("random", "alternate"):
            bad("flip_mode", f"expected 'random' or 'alternate', got {self.flip_mode!r}")
        if self.crop not in ("rrc", "pad", "none"):
            bad("crop", f"expected 'rrc', 'pad' or 'none', got {self.crop!r}")
        if self.auto not in ("none", "randaugment", "trivialaugment"):
            bad("auto", f"expected 'none', 'randaugment' or 'trivialaugment', got {self.auto!r}")
        lo, hi = self.rrc_scale
        if not 0 < lo <= hi <= 1:
            bad("rrc_scale", f"expected 0 < min <= max <= 1, got {tuple(self.rrc_scale)}")
        lo, hi = self.rrc_ratio
        if not 0 < lo <= hi:
            bad("rrc_ratio", f"expected 0 < min <= max, got {tuple(self.rrc_ratio)}")
        if not isinstance(self.pad, int) or self.pad < 0:
            bad("pad", f"expected an integer >= 0, got {self.pad!r}")
        for name in ("hflip", "mix_prob", "erase_prob", "ra_prob"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                bad(name, f"is a probability, expected 0..1, got {brief(v)}")
        if not isinstance(self.ra_ops, int) or self.ra_ops < 1:
            bad("ra_ops", f"expected an integer >= 1, got {self.ra_ops!r}")
        if not isinstance(self.ra_magnitude, int) or not 0 <= self.ra_magnitude <= 30:
            bad("ra_magnitude", f"expected an integer in 0..30, got {self.ra_magnitude!r}")
        if not 0 <= self.ra_magnitude_std <= 300:
            bad("ra_magnitude_std", f"expected 0..300 (0 = a fixed magnitude), got {self.ra_magnitude_std!r}")
        for name in ("mixup_alpha", "cutmix_alpha"):
            if getattr(self, name) < 0:
                bad(name, f"expected >= 0 (0 = off), got {getattr(self, name)!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            bad("label_smoothing", f"expected 0 <= eps < 1, got {self.label_smoothing!r}")
        if not isinstance(self.low_size, int) or isinstance(self.low_size, bool) or self.low_size < 0:
            bad("low_size", f"expected an integer >= 0 (0 = off), got {self.low_size!r}")
        if not 0.0 <= self.low_share <= 1.0:
            bad("low_share", f"is a share of the run, expected 0..1, got {brief(self.low_share)}")
        if self.low_size and not self.low_share:
            bad("low_share", f"low_size={self.low_size} needs the share of the run it lasts (0 < low_share <= 1)")

    def low_at(self, progress: float) -> bool:
        """Whether a step at ``progress`` (0..1 of the run) trains at low_size."""
        return bool(self.low_size) and (self.low_share >= 1.0 or progress < self.low_share)

    @property
    def mixing(self) -> bool:
        return self.mix_prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    @property
    def soft_targets(self) -> bool:
        """True when __call__ returns float (B, K) targets instead of int64 labels."""
        return self.mixing or self.label_smoothing > 0

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "AugmentConfig") -> "AugmentConfig":
        return from_dict(cls, data, where)


# ==================================================================================================
# random draws (all from the caller's generator, on the images' device)
def _rand(g, *shape, device):
    return torch.rand(shape, generator=g, device=device)


def rrc_boxes(b: int, h: int, w: int, scale, ratio, g, device, trials: int = 10) -> torch.Tensor:
    """(B, 4) boxes (x0, y0, cw, ch) in pixels: area ~ U(scale) * h*w, log aspect ~ U(log ratio); the first of
    ``trials`` draws that fits, else the largest centred box within the ratio range (as torchvision)."""
    area = h * w * (scale[0] + (scale[1] - scale[0]) * _rand(g, b, trials, device=device))
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    ar = torch.exp(lr0 + (lr1 - lr0) * _rand(g, b, trials, device=device))
    cw, ch = torch.sqrt(area * ar), torch.sqrt(area / ar)
    ok = (cw <= w) & (ch <= h)
    first = ok.to(torch.uint8).argmax(1, keepdim=True)
    has = ok.any(1)
    cw, ch = cw.gather(1, first).squeeze(1), ch.gather(1, first).squeeze(1)
    in_ratio = w / h  # fallback: whole image clipped to the ratio range
    if in_ratio < ratio[0]:
        fw, fh = w, w / ratio[0]
    elif in_ratio > ratio[1]:
        fw, fh = h * ratio[1], h
    else:
        fw, fh = w, h
    cw = torch.where(has, cw, torch.full_like(cw, fw))
    ch = torch.where(has, ch, torch.full_like(ch, fh))
    u = _rand(g, b, 2, device=device)
    x0 = torch.where(has, u[:, 0] * (w - cw), (w - cw) / 2)
    y0 = torch.where(has, u[:, 1] * (h - ch), (h - ch) / 2)
    return torch.stack([x0, y0, cw, ch], 1)


def affine_grid(theta: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """F.affine_grid(theta, (N, C, h, w), align_corners=False) by broadcasting (cheaper on CPU): the
    sampling point of output pixel (i, j) is theta @ (u_j, v_i, 1) with u, v the pixel centres in [-1, 1]."""
    dev, dt = theta.device, theta.dtype
    u = ((torch.arange(w, device=dev, dtype=dt) * 2 + 1) / w - 1).view(1, 1, w)
    v = ((torch.arange(h, device=dev, dtype=dt) * 2 + 1) / h - 1).view(1, h, 1)
    t = theta.view(-1, 6, 1, 1)
    gx = t[:, 0] * u + t[:, 1] * v + t[:, 2]  # (N, h, w)
    gy = t[:, 3] * u + t[:, 4] * v + t[:, 5]
    return torch.stack([gx, gy], -1)  # (N, h, w, 2)


def crop_resize(x: torch.Tensor, boxes: torch.Tensor, out_size: tuple[int, int], flip: torch.Tensor | None = None,
                mode: str = "bilinear") -> torch.Tensor:
    """Per-sample crops (x0, y0, cw, ch) of float (B, C, h, w), resized to ``out_size`` in one grid_sample
    call; ``flip`` (bool (B,)) mirrors the chosen samples horizontally at no extra cost."""
    b, _, h, w = x.shape
    x0, y0, cw, ch = boxes.unbind(1)
    sx, sy = cw / w, ch / h  # half-extent of the box in normalised [-1, 1] units
    cx, cy = (2 * x0 + cw) / w - 1, (2 * y0 + ch) / h - 1
    if flip is not None:
        sx = torch.where(flip, -sx, sx)
    zero = torch.zeros_like(sx)
    theta = torch.stack([torch.stack([sx, zero, cx], 1), torch.stack([zero, sy, cy], 1)], 1)  # (B, 2, 3)
    grid = affine_grid(theta, *out_size)
    return F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False)


def pad_crop(x: torch.Tensor, pad: int, g) -> torch.Tensor:
    """Zero-pad float (B, C, H, W) by ``pad`` and take a random (H, W) window per sample (one gather)."""
    if pad == 0:
        return x
    b, c, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad))
    off = (_rand(g, b, 2, device=x.device) * (2 * pad + 1)).long().clamp_(max=2 * pad)  # (B, 2) y, x
    ys = off[:, 0:1] + torch.arange(h, device=x.device)  # (B, H)
    xs = off[:, 1:2] + torch.arange(w, device=x.device)  # (B, W)
    # flat index into each (Hp*Wp) plane, gathered for all channels at once
    wp = w + 2 * pad
    idx = (ys[:, :, None] * wp + xs[:, None, :]).view(b, 1, h * w).expand(b, c, h * w)
    return xp.view(b, c, -1).gather(2, idx).view(b, c, h, w)


# ==================================================================================================
# per-image ops on float 0..255 images (N, C, H, W); m = signed magnitude in the op's own units (N,)
def _grey(x):
    if x.shape[1] == 1:
        return x
    return (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3])


def _blend(a, b, f):  # b + f * (a - b): f = 1 -> a; f = 0 -> b
    return (b + f.view(-1, 1, 1, 1) * (a - b)).clamp_(0, 255)


def op_identity(x, m):
    return x


def op_autocontrast(x, m):
    lo, hi = x.amin((2, 3), keepdim=True), x.amax((2, 3), keepdim=True)
    span = hi - lo
    scale = torch.where(span > 0, 255.0 / span.clamp(min=1e-6), torch.ones_like(span))
    off = torch.where(span > 0, lo, torch.zeros_like(lo))
    return ((x - off) * scale).clamp_(0, 255)


def op_equalize(x, m):
    """Per-channel histogram equalisation with Pillow's lookup-table rule."""
    n, c, h, w = x.shape
    flat = x.round().clamp(0, 255).long().view(n * c, h * w)
    hist = torch.zeros(n * c, 256, device=x.device).scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float32))
    last = 255 - (hist.flip(1) > 0).to(torch.uint8).argmax(1, keepdim=True)
    step = torch.div(h * w - hist.gather(1, last), 255, rounding_mode="floor")  # (NC, 1)
    cdf = hist.cumsum(1) - hist  # exclusive
    lut = torch.div(cdf + torch.div(step, 2, rounding_mode="floor"), step.clamp(min=1), rounding_mode="floor")
    lut = torch.where(step > 0, lut.clamp(0, 255), torch.arange(256, device=x.device, dtype=torch.float32))
    return lut.gather(1, flat).view(n, c, h, w)


def op_solarize(x, m):  # m = threshold in 0..255: pixels >= threshold are inverted
    return torch.where(x >= m.view(-1, 1, 1, 1), 255 - x, x)


def op_posterize(x, m):  # m = bits to keep (4..8)
    q = torch.pow(2.0, 8 - m).view(-1, 1, 1, 1)
    return torch.floor(x.round() / q) * q


def op_color(x, m):  # m = factor - 1
    return _blend(x, _grey(x).expand_as(x), 1 + m)


def op_contrast(x, m):
    mean = _grey(x).mean((1, 2, 3), keepdim=True)
    return _blend(x, mean.expand_as(x), 1 + m)


def op_brightness(x, m):
    return _blend(x, torch.zeros_like(x), 1 + m)


def op_sharpness(x, m):
    c = x.shape[1]
    k = torch.ones(3, 3, device=x.device)
    k[1, 1] = 5
    k = (k / 13).expand(c, 1, 3, 3)
    smooth = x.clone()
    smooth[:, :, 1:-1, 1:-1] = F.conv2d(x, k, groups=c)  # borders stay as they are (as Pillow)
    return _blend(x, smooth, 1 + m)


FILL = 128.0  # mid-grey for the area that geometric ops uncover


def _affine(x, lin: torch.Tensor, shift: torch.Tensor):
    """Output pixel -> input pixel mapping u_in = lin @ u_out + shift in normalised coords; nearest
    sampling, FILL outside."""
    n = x.shape[0]
    theta = torch.cat([lin, shift.view(n, 2, 1)], 2)
    grid = affine_grid(theta, *x.shape[-2:])
    return F.grid_sample(x - FILL, grid, mode="nearest", padding_mode="zeros", align_corners=False) + FILL


def geo_params(name: str, m: torch.Tensor, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(lin (N, 2, 2), shift (N, 2)) of a geometric op in normalised output -> input coordinates.
    rotate: m degrees; shear_x/y: m = shear factor; translate_x/y: m = fraction of the size."""
    one, zero = torch.ones_like(m), torch.zeros_like(m)
    shift = torch.zeros(len(m), 2, device=m.device)
    if name == "rotate":
        a = m * (math.pi / 180)
        cos, sin = torch.cos(a), torch.sin(a)
        lin = torch.stack([torch.stack([cos, -sin * h / w], 1), torch.stack([sin * w / h, cos], 1)], 1)
    elif name == "shear_x":
        lin = torch.stack([torch.stack([one, m * h / w], 1), torch.stack([zero, one], 1)], 1)
    elif name == "shear_y":
        lin = torch.stack([torch.stack([one, zero], 1), torch.stack([m * w / h, one], 1)], 1)
    else:
        lin = torch.eye(2, device=m.device).expand(len(m), 2, 2)
        shift = torch.stack([-2 * m, zero], 1) if name == "translate_x" else torch.stack([zero, -2 * m], 1)
    return lin, shift


def op_rotate(x, m):  # m = degrees
    return _affine(x, *geo_params("rotate", m, *x.shape[-2:]))


def op_shear_x(x, m):  # m = shear factor
    return _affine(x, *geo_params("shear_x", m, *x.shape[-2:]))


def op_shear_y(x, m):
    return _affine(x, *geo_params("shear_y", m, *x.shape[-2:]))


def op_translate_x(x, m):  # m = fraction of the width
    return _affine(x, *geo_params("translate_x", m, *x.shape[-2:]))


def op_translate_y(x, m):
    return _affine(x, *geo_params("translate_y", m, *x.shape[-2:]))


GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")


# name -> (function, map from the level as a fraction of 30 to the op's own units; None = no magnitude).
# The ops in SIGNED get a random sign per image.
# Ranges follow the RandAugment paper's table as commonly implemented: rotate 30 deg, shear 0.3,
# translate 0.45 of the size, colour/contrast/brightness/sharpness factor 1 +- 0.9, posterize down to
# 4 bits, solarize threshold down to 0.
OPS = {
    "identity": (op_identity, None),
    "autocontrast": (op_autocontrast, None),
    "equalize": (op_equalize, None),
    "solarize": (op_solarize, lambda f: 255.0 * (1 - f)),
    "color": (op_color, lambda f: 0.9 * f),
    "contrast": (op_contrast, lambda f: 0.9 * f),
    "brightness": (op_brightness, lambda f: 0.9 * f),
    "sharpness": (op_sharpness, lambda f: 0.9 * f),
    "posterize": (op_posterize, lambda f: 8 - torch.round(4 * f)),
    "rotate": (op_rotate, lambda f: 30.0 * f),
    "shear_x": (op_shear_x, lambda f: 0.3 * f),
    "shear_y": (op_shear_y, lambda f: 0.3 * f),
    "translate_x": (op_translate_x, lambda f: 0.45 * f),
    "translate_y": (op_translate_y, lambda f: 0.45 * f),
}
SIGNED = {"rotate", "color", "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x", "translate_y"}
OP_NAMES = list(OPS)
# RandAugment with ra_increasing=False: timm's default levels of the ops whose severity does not grow with the
# magnitude (timm's auto_augment.py: _enhance_level_to_arg, a factor 0.1 + 1.8 f; _posterize_level_to_arg,
# int(4 f) bits kept; _solarize_level_to_arg, threshold int(256 f)), unsigned; the other ops are as in OPS
ORIGINAL_LEVELS = {
    "solarize": lambda f: torch.floor(256.0 * f),
    "color": lambda f: 1.8 * f - 0.9,
    "contrast": lambda f: 1.8 * f - 0.9,
    "brightness": lambda f: 1.8 * f - 0.9,
    "sharpness": lambda f: 1.8 * f - 0.9,
    "posterize": lambda f: torch.floor(4.0 * f),
}


def op_level(name: str, frac: torch.Tensor, sign: torch.Tensor, increasing: bool = True) -> torch.Tensor | None:
    """Op ``name``'s argument in its own units at level ``frac`` (a fraction of 30) with ``sign`` (+-1, used by
    the signed ops); ``increasing`` False: ORIGINAL_LEVELS where it has one. None for ops without one."""
    level, signed = OPS[name][1], name in SIGNED
    if not increasing and name in ORIGINAL_LEVELS:
        level, signed = ORIGINAL_LEVELS[name], False
    if level is None:
        return None
    return level(frac) * sign if signed else level(frac)


def ra_fractions(g, n: int, magnitude: float, std: float, device) -> torch.Tensor:
    """RandAugment's level of each of ``n`` images' op, a fraction of 30: ``magnitude`` / 30, with N(0, ``std``)
    noise on the 0..30 scale where ``std`` > 0 (clipped to 0..30), as timm's magnitude_std."""
    frac = torch.full((n,), magnitude / 30.0, device=device)
    if std > 0:
        frac = (frac + torch.randn(n, generator=g, device=device) * (std / 30.0)).clamp_(0.0, 1.0)
    return frac


def apply_auto(x: torch.Tensor, g, mode: str, num_ops: int, magnitude: int, std: float = 0.0,
               increasing: bool = True, prob: float = 1.0) -> torch.Tensor:
    """RandAugment (``num_ops`` ops per image at ``magnitude``/30; ``std``, ``increasing``, ``prob``: see
    AugmentConfig's ra_magnitude_std, ra_increasing, ra_prob) or TrivialAugment (one op per image at a uniform
    random level in 0..30) on float 0..255 images; each image draws its own ops."""
    n, dev = x.shape[0], x.device
    rounds = num_ops if mode == "randaugment" else 1
    x = x.clone()
    for _ in range(rounds):
        op = (_rand(g, n, device=dev) * len(OPS)).long().clamp_(max=len(OPS) - 1)
        if mode == "randaugment":
            _ = _rand(g, n, device=dev)  # keep the draw count equal in both modes
            frac = ra_fractions(g, n, magnitude, std, dev)
        else:
            frac = (_rand(g, n, device=dev) * 31).floor().clamp_(max=30) / 30.0
        sign = torch.where(_rand(g, n, device=dev) < 0.5, -1.0, 1.0)
        if mode == "randaugment" and prob < 1:  # an op not applied is the identity (OP_NAMES[0])
            op = torch.where(_rand(g, n, device=dev) < prob, op, torch.zeros_like(op))
        # the geometric ops of this round: one affine warp for all the images that drew one
        lin = torch.eye(2, device=dev).repeat(n, 1, 1)
        shift = torch.zeros(n, 2, device=dev)
        h, w = x.shape[-2:]
        for name in GEOMETRIC:
            k = OP_NAMES.index(name)
            m = OPS[name][1](frac) * sign
            li, sh = geo_params(name, m, h, w)
            hit = (op == k).view(n, 1, 1)
            lin = torch.where(hit, li, lin)
            shift = torch.where(hit.view(n, 1), sh, shift)
        geo = torch.nonzero((op >= OP_NAMES.index(GEOMETRIC[0])) & (op <= OP_NAMES.index(GEOMETRIC[-1]))).flatten()
        if geo.numel():
            x[geo] = _affine(x[geo], lin[geo], shift[geo])
        for k, name in enumerate(OP_NAMES):
            if name == "identity" or name in GEOMETRIC:
                continue
            sel = torch.nonzero(op == k).flatten()
            if sel.numel() == 0:
                continue
            x[sel] = OPS[name][0](x[sel], op_level(name, frac[sel], sign[sel], increasing)).clamp_(0, 255)
    return x


# ==================================================================================================
def random_erase(x: torch.Tensor, prob: float, g, area=(0.02, 1 / 3), log_ratio=(math.log(0.3), math.log(3.3)),
                 trials: int = 10) -> torch.Tensor:
    """Replace one random box per image (with probability ``prob``) by standard normal noise."""
    b, c, h, w = x.shape
    dev = x.device
    a = h * w * (area[0] + (area[1] - area[0]) * _rand(g, b, trials, device=dev))
    r = torch.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * _rand(g, b, trials, device=dev))
    eh, ew = torch.sqrt(a * r).round(), torch.sqrt(a / r).round()
    ok = (eh < h) & (ew < w) & (eh >= 1) & (ew >= 1)
    first = ok.to(torch.uint8).argmax(1, keepdim=True)
    eh, ew = eh.gather(1, first).squeeze(1), ew.gather(1, first).squeeze(1)
    u = _rand(g, b, 3, device=dev)
    apply = ok.any(1) & (u[:, 0] < prob)
    top = (u[:, 1] * (h - eh + 1)).floor()
    left = (u[:, 2] * (w - ew + 1)).floor()
    ys = torch.arange(h, device=dev, dtype=x.dtype)
    xs = torch.arange(w, device=dev, dtype=x.dtype)
    my = (ys >= top[:, None]) & (ys < (top + eh)[:, None])  # (B, H)
    mx = (xs >= left[:, None]) & (xs < (left + ew)[:, None])  # (B, W)
    mask = (my[:, :, None] & mx[:, None, :] & apply[:, None, None])[:, None]  # (B, 1, H, W)
    noise = torch.randn(x.shape, generator=g, device=dev, dtype=x.dtype)
    return torch.where(mask, noise, x)


def one_hot(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """int64 (B,) -> float (B, K): 1 - eps + eps/K on the label, eps/K elsewhere."""
    off = smoothing / num_classes
    y = torch.full((labels.shape[0], num_classes), off, device=labels.device)
    return y.scatter_(1, labels.view(-1, 1), 1.0 - smoothing + off)


def mix_batch(x: torch.Tensor, y: torch.Tensor, cfg: AugmentConfig, g) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Mixup or cutmix of a normalised batch with itself in reverse order; y are soft targets (B, K).

    One generator draw (a seed for the batch-level scalars) keeps this exact across devices."""
    seed = int(torch.randint(0, 2**62, (1,), generator=g, device=x.device).item())
    rng = np.random.default_rng(seed)
    info = {"mixed": False, "mode": None, "lam": 1.0}
    if rng.random() >= cfg.mix_prob:
        return x, y, info
    if cfg.mixup_alpha > 0 and cfg.cutmix_alpha > 0:
        use_cutmix = rng.random() < 0.5
    else:
        use_cutmix = cfg.cutmix_alpha > 0
    alpha = cfg.cutmix_alpha if use_cutmix else cfg.mixup_alpha
    lam = float(rng.beta(alpha, alpha))
    xf, yf = x.flip(0), y.flip(0)
    if use_cutmix:
        h, w = x.shape[-2:]
        cut = math.sqrt(1.0 - lam)
        ch, cw = int(h * cut), int(w * cut)
        cy, cx = int(rng.integers(h)), int(rng.integers(w))
        y0, y1 = max(cy - ch // 2, 0), min(cy + ch - ch // 2, h)
        x0, x1 = max(cx - cw // 2, 0), min(cx + cw - cw // 2, w)
        x = x.clone()
        x[:, :, y0:y1, x0:x1] = xf[:, :, y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
    else:
        x = xf.lerp(x, lam)  # lam * x + (1 - lam) * x_flipped
    y = yf.lerp(y, lam)
    info.update(mixed=True, mode="cutmix" if use_cutmix else "mixup", lam=lam)
    return x, y, info


# ==================================================================================================
class BatchAugment:
    """The training-time transform of a uint8 batch: see the module docstring for the steps."""

    def __init__(self, cfg: AugmentConfig | dict | None, img_size, pre, num_classes: int):
        if cfg is None:
            cfg = AugmentConfig()
        self.cfg = cfg if isinstance(cfg, AugmentConfig) else AugmentConfig.from_dict(cfg)
        self.img_size = to_hw(img_size, "img_size", DataError)
        self.pre = pre
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ConfigError(f"BatchAugment: num_classes must be a positive integer, got {num_classes!r}")
        self.num_classes = num_classes
        self.last_info: dict = {}  # of the last batch: {'mixed', 'mode', 'lam'} when mixing is on
        self._consts: dict = {}

    def __repr__(self) -> str:
        return f"BatchAugment({self.cfg}, img_size={self.img_size}, num_classes={self.num_classes})"

    def __call__(self, images: torch.Tensor | list[torch.Tensor], labels: torch.Tensor, generator: torch.Generator,
                 flips: torch.Tensor | None = None, size: int | tuple[int, int] | None = None):
        """``flips``: which images to flip (bool (B,)), in place of the random draw (flip_mode='alternate').
        ``size``: the side (or (H, W)) of the images it returns, in place of img_size (progressive resizing: the
        crop is drawn at img_size and resized, or with 'rrc' cropped to it directly)."""
        b, c, dev = check_batch(images, "BatchAugment")
        if labels.shape != (b,):
            raise ShapeError(f"BatchAugment: labels must have shape ({b},), got {tuple(labels.shape)}")
        if generator.device.type != dev.type:
            raise ShapeError(f"BatchAugment: the generator is on {generator.device} but the images on {dev}")
        cfg, g = self.cfg, generator
        out = self.img_size if size is None else to_hw(size, "size", ShapeError)

        # 1. geometry: crop and flip
        flip = _rand(g, b, device=dev) < cfg.hflip  # drawn in either mode: the later draws stay the same
        if flips is not None:
            flip = flips.to(dev)
        if cfg.crop == "rrc":
            x = self.random_resized_crop(images, flip, g, out)
        else:
            x = fit_batch(images, self.img_size, 1.0, self.pre.interpolation)
            if cfg.crop == "pad":
                x = pad_crop(x, cfg.pad, g)
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
            if out != self.img_size:
                x = F.interpolate(x, size=out, mode="bilinear", antialias=True, align_corners=False)

        # 2. per-image colour/geometry ops
        if cfg.auto != "none":
            x = apply_auto(x, g, cfg.auto, cfg.ra_ops, cfg.ra_magnitude, cfg.ra_magnitude_std, cfg.ra_increasing,
                           cfg.ra_prob)

        # 3. normalise
        key = (str(dev), c)
        if key not in self._consts:  # built once per device: no host-to-device copy per batch
            self._consts[key] = norm_consts(self.pre, c, dev)
        mean, std = self._consts[key]
        x = (x - mean) / std

        # 4. random erasing
        if cfg.erase_prob > 0:
            x = random_erase(x, cfg.erase_prob, g)

        # 5. targets
        if not cfg.soft_targets:
            return x, labels
        if labels.device.type == "cpu" and b and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ShapeError(f"BatchAugment: labels must be in 0..{self.num_classes - 1}, got "
                             f"{int(labels.min())}..{int(labels.max())}")
        y = one_hot(labels, self.num_classes, cfg.label_smoothing)
        if cfg.mixing:
            x, y, self.last_info = mix_batch(x, y, cfg, g)
        return x, y

    def random_resized_crop(self, images: torch.Tensor | list[torch.Tensor], flip: torch.Tensor, g,
                            out: tuple[int, int] | None = None) -> torch.Tensor:
        """float (B, C, H, W): a random resized crop of each image (flipped where ``flip``) at ``out`` (else
        img_size), drawn from the whole image: one box draw and one grid_sample for a batch of one size, one
        each for a list."""
        cfg, dev = self.cfg, flip.device
        out = self.img_size if out is None else out
        if isinstance(images, torch.Tensor):
            b, _, h, w = images.shape
            boxes = rrc_boxes(b, h, w, cfg.rrc_scale, cfg.rrc_ratio, g, dev)
            return crop_resize(images.float(), boxes, out, flip)
        crops = [crop_resize(img[None].float(), rrc_boxes(1, *img.shape[-2:], cfg.rrc_scale, cfg.rrc_ratio, g, dev),
                             out, flip[i : i + 1]) for i, img in enumerate(images)]
        return torch.cat(crops)


def check_batch(images: torch.Tensor | list[torch.Tensor], what: str) -> tuple[int, int, torch.device]:
    """(B, C, device) of a uint8 batch (B, C, h, w) or a non-empty list of uint8 (C, h_i, w_i) images on one
    device with one channel count; ShapeError (naming ``what``) otherwise."""
    if not isinstance(images, (list, tuple)):
        check_uint8(images, 4, what)
        return images.shape[0], images.shape[1], images.device
    if not images:
        raise ShapeError(f"{what}: an empty list of images")
    for img in images:
        check_uint8(img, 3, what)
        if img.shape[0] != images[0].shape[0] or img.device != images[0].device:
            raise ShapeError(f"{what}: the images of a list must share their channels and device; got "
                             f"{tuple(images[0].shape)} on {images[0].device} and {tuple(img.shape)} on {img.device}")
    return len(images), images[0].shape[0], images[0].device


def move_batch(images: torch.Tensor | list[torch.Tensor], device: torch.device) -> torch.Tensor | list[torch.Tensor]:
    """A uint8 batch, or a list of images, on ``device``."""
    if isinstance(images, torch.Tensor):
        return images.to(device, non_blocking=True)
    return [img.to(device, non_blocking=True) for img in images]


def fit_batch(images: torch.Tensor | list[torch.Tensor], img_size: tuple[int, int], crop_pct: float,
              interpolation: str, resize: str = "shorter_then_crop") -> torch.Tensor:
    """float (B, C, H, W) 0..255 of a uint8 batch or list: each image resized (short side, or each side
    with ``resize='squash'``, to size / crop_pct) and centre cropped where its size is not (H, W) already."""
    if isinstance(images, torch.Tensor):
        x = images.float()
        if tuple(x.shape[-2:]) == tuple(img_size):
            return x
        return resize_center_crop(x, img_size, crop_pct, interpolation, resize)
    return torch.cat([fit_batch(img[None], img_size, crop_pct, interpolation, resize) for img in images])


def first_flips(n: int, seed: int) -> torch.Tensor:
    """Which of ``n`` images are flipped in the first epoch of alternating flips (bool (n,)): a seeded
    random half, on the CPU."""
    g = torch.Generator().manual_seed((seed * 7_919 + 104_729) % (2**63 - 1))
    return torch.rand(n, generator=g) < 0.5


def alternating_flips(first: torch.Tensor, epoch: int) -> torch.Tensor:
    """The flips of epoch ``epoch`` (0-based) under alternating flips: ``first`` (the first epoch's, for
    the same images) in even epochs, its complement in odd ones."""
    return first ^ bool(epoch % 2)


def eval_batch(images: torch.Tensor | list[torch.Tensor], img_size, pre) -> torch.Tensor:
    """uint8 (B, C, h, w), or a list of uint8 (C, h_i, w_i) -> normalised float (B, C, H, W); each image
    resized (short side, or each side: pre.resize, to size / crop_pct) and centre cropped, as timm's eval
    transform, when its size differs from img_size. No randomness."""
    _, c, dev = check_batch(images, "eval_batch")
    img_size = to_hw(img_size, "img_size", DataError)
    x = fit_batch(images, img_size, pre.crop_pct, pre.interpolation, pre.resize)
    mean, std = norm_consts(pre, c, dev)
    return (x - mean) / std


def eval_batches(images, img_size, pre, device: torch.device, batch_size: int, indices: torch.Tensor | None = None):
    """Batches of the ImageSet ``images`` (its ``indices``, in order; None: all of them) as evaluation
    prepares them: (normalised float (B, C, H, W) on ``device`` (``eval_batch``), int64 labels (B,))."""
    order = torch.arange(len(images)) if indices is None else indices
    for start in range(0, len(order), batch_size):
        x, y = images.get_batch(order[start:start + batch_size])
        yield eval_batch(move_batch(x, device), img_size, pre), y


__all__ = ["AugmentConfig", "BatchAugment", "eval_batch", "eval_batches", "check_batch", "fit_batch", "move_batch", "first_flips",
           "alternating_flips", "apply_auto", "rrc_boxes", "crop_resize", "pad_crop",
           "random_erase", "one_hot", "mix_batch", "affine_grid", "OP_NAMES", "op_level", "ra_fractions", "ORIGINAL_LEVELS"]
