"""The model configuration: one dataclass, every field commented and validated. No torch import.

A ``ViTConfig`` describes the architecture only. How images are prepared for the model (mean, std,
resize) is a ``Preprocess``; both are saved in a checkpoint's vitkit.json.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from ..core.errors import ConfigError
from ..core.strict import brief, from_dict, is_finite_real, real_in, reals_in, to_dict, to_hw

Pool = Literal["token", "avg", "map", "none"]
PosEmbed = Literal["learn", "sincos1d", "sincos2d", "none"]
RESIZE_MODES = ("shorter_then_crop", "squash")  # Preprocess.resize
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")  # Preprocess.interpolation

# The ranges a Preprocess takes (pixels are scaled to [0, 1] before the mean and std), wide enough for every
# published model and narrow enough that no value makes a non-finite input or an image of absurd size:
MEAN_RANGE = (-10.0, 10.0)  # each channel's mean (published ones are in [0, 1]: 0.5, ImageNet's, CLIP's)
STD_RANGE = (1e-3, 10.0)  # each channel's std; 1e-3 is also the floor of what a run measures on its data
CROP_PCT_RANGE = (0.1, 1.0)  # the resize before the centre crop is at most 10x the model's size (timm's
#   tags use 0.875 to 1.0, HF's processors crop 224 of 256 or none)
NORM_EPS_MAX = 0.1  # ViTConfig.norm_eps is in (0, NORM_EPS_MAX]: models use 1e-12 (HF) to 1e-5 (torch); a
#   larger one flattens every LayerNorm's output towards its bias
LAYER_SCALE_MAX = 10.0  # ViTConfig.layer_scale is in (0, LAYER_SCALE_MAX] (CaiT / DeiT III start at 1e-5 to 0.1)


def _bad(name: str, msg: str):
    raise ConfigError(f"ViTConfig.{name}: {msg}")


# The largest model a ViTConfig may describe, checked before anything is built, so that a config of absurd
# size (a hostile or mistyped file: depth 1e9, a width of 2**31) is one line rather than minutes of churn and
# a MemoryError. A caller who means a larger model raises them first, e.g. ``vitkit.model.config.MAX_PARAMS
# = 3e10`` for ViT-22B (21.7e9 parameters); ViT-g/14, the largest named model here, has 1.0e9.
MAX_PARAMS = 5_000_000_000  # parameters (estimated from the config: ``ViTConfig.param_estimate``)
MAX_WHOLE = 2**53  # the largest count or size a field may hold at all (a float holds every whole number up to it)
MAX_TOKENS = 65_536  # tokens per image: patches and prefix tokens (a 4096x4096 image in patches of 16)
MAX_DEPTH = 1024  # encoder blocks (ViT-22B has 48): a deep, narrow config under MAX_PARAMS would take minutes
#   only to build its modules


@dataclass
class ViTConfig:
    # --- input -----------------------------------------------------------------------------------
    img_size: int | tuple[int, int] = 224  # training resolution, H = W or (H, W); the grid is H/P x W/P
    patch_size: int = 16  # side P of the square patches (the "/16" in ViT-B/16)
    in_chans: int = 3  # image channels: 3 for RGB, 1 for grey
    num_classes: int = 1000  # classes of the linear head; 0 = no head (forward returns pooled features)
    # --- width and depth -------------------------------------------------------------------------
    embed_dim: int = 768  # token width D ("hidden size")
    depth: int = 12  # number of encoder blocks
    num_heads: int = 12  # attention heads; D must be divisible by it
    mlp_ratio: float = 4.0  # MLP hidden width = mlp_ratio * D (the tutorial's MNIST model uses 1.0)
    qkv_bias: bool = True  # bias in the q, k, v projections (True in ViT, False in some variants)
    qk_norm: bool = False  # LayerNorm on the queries and keys of every head before their dot product, one
    #   norm over the head dimension shared by the heads (ViT-22B; timm's qk_norm)
    # --- tokens and pooling ----------------------------------------------------------------------
    class_token: bool = True  # prepend a learnable [cls] token (initialised to zeros)
    reg_tokens: int = 0  # register tokens (Darcet et al. 2023, "Vision Transformers Need Registers"):
    #   learned tokens after the [cls] token and before the patches, in every block's attention but
    #   never pooled (timm's reg_tokens; the DINOv2 models with registers have 4)
    global_pool: Pool = "token"  # 'token': the [cls] token; 'avg': mean of patch tokens; 'map': attention
    #   pooling, a learned probe attending over the patch tokens (big_vision's MAP head; the [cls] token,
    #   if any, is not pooled, as timm); 'none': all tokens
    fc_norm: bool | None = None  # LayerNorm after pooling instead of before; None = on for 'avg' (as timm)
    pos_embed: PosEmbed = "learn"  # 'learn' (trunc normal, std .02), 'sincos1d' (tutorial: one index per
    #   token, class token included), 'sincos2d' (big_vision / MoCo v3: row and column, patches only), 'none'
    no_embed_class: bool = False  # learned position embeddings cover the patches only, and the class and
    #   register tokens are added after them (big_vision, DINOv2 with registers); False = one slot per
    #   token, prefix tokens included (timm)
    dynamic_img_size: bool = False  # resample position embeddings per input, so any multiple of P runs
    # --- block ------------------------------------------------------------------------------------
    norm: Literal["pre", "post"] = "pre"  # LayerNorm before each sub-block (ViT) or after the residual
    #   sum (the original Transformer, "post-LN"; no final norm then)
    norm_eps: float = 1e-6  # LayerNorm epsilon (JAX, timm and torchvision use 1e-6; HF defaults to 1e-12)
    act: Literal["gelu", "gelu_tanh", "relu"] = "gelu"  # MLP activation (exact GELU as the paper; ReLU as
    #   one tutorial)
    drop_rate: float = 0.0  # dropout after every dense layer and after adding position embeddings
    attn_drop_rate: float = 0.0  # dropout on the attention probabilities
    drop_path_rate: float = 0.0  # stochastic depth, rising linearly from 0 to this over the blocks
    layer_scale: float | None = None  # LayerScale on both residual branches, gamma initialised to this
    #   value (CaiT / DeiT III; timm's init_values); None = off
    attn_impl: Literal["fused", "manual"] = "fused"  # F.scaled_dot_product_attention, or an explicit
    #   softmax(QK^T/sqrt(d))V; both share weights and results; attention maps always use the manual path
    # --- stem -------------------------------------------------------------------------------------
    patch_embed: Literal["conv", "linear"] = "conv"  # Conv2d(kernel = stride = P), or space-to-depth
    #   reshape + Linear; both hold the same (D, C, P, P) weight, so either loads the other's checkpoint
    stem: Literal["patch", "conv"] = "patch"  # 'patch': the linear patch projection; 'conv': a hybrid
    #   convolutional stem (3x3 stride-2 conv + BatchNorm + ReLU, log2(P) times, then a 1x1 conv to D)
    stem_width: int = 32  # channels of the first conv of the 'conv' stem (doubling at each stride-2 conv)
    stem_convs: int = 0  # extra 3x3 stride-1 conv + BatchNorm + ReLU layers of the 'conv' stem, at the
    #   grid resolution before the 1x1 projection (more local features for small data)
    stem_early_convs: int = 0  # 3x3 stride-1 conv + BatchNorm + ReLU layers right after the 'conv' stem's first
    #   stride-2 conv, at twice the grid's resolution (16x16 of a 32-px image at patch 4), stem_width channels
    #   each: features learned before the next stride halves them (airbench works at such resolutions)
    stem_whiten: bool = False  # the 'conv' stem's first stride-2 conv is a frozen 2x2 patch-whitening filter
    #   bank (2*C*4 channels: the eigenvectors of the training data's 2x2 patch covariance over sqrt(eigenvalue),
    #   and their negatives; airbench), set from the data when a run starts from scratch
    stem_whiten_affine: bool = True  # the BatchNorm after the whitening filters learns a scale and shift; False:
    #   it only normalises, so nothing before the first learned conv trains and that conv's backward skips its
    #   input's gradient
    stem_dirac: bool = False  # the 'conv' stem's learned 3x3 convs start as identities on their first
    #   in-channels filters (torch.nn.init.dirac_; the rest He normal), so that a deeper stem starts by
    #   passing its input on (airbench: 21 -> 18 epochs to 94% on CIFAR-10)
    stem_bn_momentum: float = 0.1  # running-statistics momentum of the 'conv' stem's BatchNorm layers (torch's
    #   0.1; higher tracks a short run's changing statistics more closely)
    # --- head -------------------------------------------------------------------------------------
    representation_size: int | None = None  # pre-logits Linear + tanh before the head (the paper's
    #   ImageNet-21k models); None = no pre-logits layer
    head_drop_rate: float = 0.0  # dropout just before the head
    init: Literal["jax", "timm"] = "jax"  # weight init: 'jax' as the paper (xavier uniform, lecun normal
    #   patch projection, zero head), 'timm' (trunc normal std .02 for every Linear)

    def __post_init__(self):
        self.img_size = to_hw(self.img_size, "ViTConfig.img_size")
        self.validate()

    # ------------------------------------------------------------------------------------------------
    @property
    def grid_size(self) -> tuple[int, int]:
        """Patches per column and per row, (H/P, W/P)."""
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid_size
        return gh * gw

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: the class token (if any), then the registers."""
        return (1 if self.class_token else 0) + self.reg_tokens

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    @property
    def use_fc_norm(self) -> bool:
        return self.global_pool == "avg" if self.fc_norm is None else self.fc_norm

    # ------------------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ConfigError naming the first field out of range or inconsistent with another."""
        self._check_whole_numbers()
        self._check_sizes()
        self._check_tokens()
        self._check_layers()
        self._check_scale()

    def param_estimate(self) -> dict[str, int]:
        """The parameters of the model this config builds, by part (stem, pos_embed, blocks, head), from
        the config alone, within a fraction of a percent of what the model counts (norms and BatchNorm
        statistics are not all counted); enough to refuse a config of absurd size before building it."""
        D, C, P, hid = self.embed_dim, self.in_chans, self.patch_size, self.mlp_hidden
        if self.stem == "conv":
            widths = [C] + [self.stem_width * 2 ** i for i in range(max(P.bit_length() - 1, 0))]
            widths[2:2] = [self.stem_width] * self.stem_early_convs  # after the first stride-2 conv
            widths += [widths[-1]] * self.stem_convs
            stem = sum(9 * a * b + 2 * b for a, b in zip(widths, widths[1:])) + widths[-1] * D + D
        else:
            stem = D * C * P * P + D
        slots = self.num_patches + (0 if self.no_embed_class else self.num_prefix_tokens)
        pos = (slots * D if self.pos_embed == "learn" else 0) + self.num_prefix_tokens * D
        block = 4 * D * D + 4 * D + 2 * D * hid + hid + D + 4 * D + (2 * D if self.layer_scale else 0)
        feat = self.representation_size or D
        head = feat * self.num_classes + self.num_classes + (D * feat + feat if self.representation_size else 0)
        if self.global_pool == "map":
            head += D + block
        return {"stem": stem, "pos_embed": pos, "blocks": self.depth * block, "head": head + 2 * D}

    def _check_scale(self) -> None:
        """Tokens per image within MAX_TOKENS, parameters within MAX_PARAMS; the error names the field that
        makes the most of them."""
        h, w = self.img_size
        tokens = self.num_patches + self.num_prefix_tokens
        if tokens > MAX_TOKENS:
            field = "reg_tokens" if self.reg_tokens > self.num_patches else "img_size"
            _bad(field, f"{h}x{w} in patches of {self.patch_size} with {self.num_prefix_tokens} prefix tokens make "
                        f"{tokens} tokens per image, over the limit of {MAX_TOKENS} (vitkit.model.config.MAX_TOKENS; "
                        "raise it for larger inputs)")
        parts = self.param_estimate()
        total = sum(parts.values())
        if total <= MAX_PARAMS:
            if self.depth > MAX_DEPTH:
                _bad("depth", f"{self.depth} blocks, over the limit of {MAX_DEPTH} (vitkit.model.config.MAX_DEPTH; "
                              "raise it for a deeper model)")
            return
        part = max(parts, key=parts.get)
        field, what = {
            "stem": ("stem_width" if self.stem == "conv" else "patch_size",
                     f"a {self.stem} stem to width {self.embed_dim}"),
            "pos_embed": ("img_size", f"position embeddings of {tokens} tokens of width {self.embed_dim}"),
            "blocks": (max(("depth", self.depth / 48), ("embed_dim", self.embed_dim / 6144),
                           ("mlp_ratio", self.mlp_ratio / 4), key=lambda kv: kv[1])[0],
                       f"{self.depth} blocks of width {self.embed_dim} (MLP {self.mlp_hidden})"),
            "head": ("representation_size" if (self.representation_size or 0) > self.num_classes else "num_classes",
                     f"a head of {self.num_classes} classes on width {self.representation_size or self.embed_dim}"),
        }[part]
        _bad(field, f"{what} make {total:.2g} parameters, over the limit of {MAX_PARAMS:.2g} "
                    "(vitkit.model.config.MAX_PARAMS; raise it to build a larger model)")

    def _check_whole_numbers(self) -> None:
        """No whole number beyond MAX_WHOLE: the size checks compute in floats, which do not hold it."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            for x in v if isinstance(v, tuple) else (v,):
                if isinstance(x, int) and not isinstance(x, bool) and abs(x) > MAX_WHOLE:
                    shown = x if abs(x) < 10**20 else f"a number of {len(str(abs(x)))} digits"
                    _bad(f.name, f"{shown} is beyond {MAX_WHOLE} (2**53), the largest whole number a float holds "
                                 "exactly")

    def _check_sizes(self) -> None:
        """Widths, counts and rates: each in its range; the image in whole patches, the width in whole heads."""
        for name in ("patch_size", "in_chans", "embed_dim", "depth", "num_heads", "stem_width"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                _bad(name, f"must be a positive integer, got {brief(v)}")
        if not isinstance(self.num_classes, int) or self.num_classes < 0:
            _bad("num_classes", f"must be an integer >= 0 (0 = no head), got {self.num_classes!r}")
        h, w = self.img_size
        p = self.patch_size
        if h % p or w % p:
            _bad("img_size", f"{h}x{w} is not divisible by patch_size {p}")
        if self.embed_dim % self.num_heads:
            _bad("num_heads", f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        r = self.mlp_ratio
        if not (is_finite_real(r) and is_finite_real(self.embed_dim * r) and int(self.embed_dim * r) >= 1):
            _bad("mlp_ratio", f"must be a finite number giving an MLP width >= 1, got {r!r}")
        self._check_rates()

    def _check_rates(self) -> None:
        """The dropout rates in [0, 1), norm_eps, layer_scale and the BatchNorm momentum each finite, in range."""
        for name in ("drop_rate", "attn_drop_rate", "drop_path_rate", "head_drop_rate"):
            real_in(getattr(self, name), f"ViTConfig.{name}", 0.0, 1.0, open_hi=True)
        real_in(self.norm_eps, "ViTConfig.norm_eps", 0.0, NORM_EPS_MAX, open_lo=True)
        if self.layer_scale is not None:
            real_in(self.layer_scale, "ViTConfig.layer_scale", 0.0, LAYER_SCALE_MAX, open_lo=True)
        real_in(self.stem_bn_momentum, "ViTConfig.stem_bn_momentum", 0.0, 1.0, open_lo=True)

    def _check_tokens(self) -> None:
        """Prefix tokens, pooling and position tables: each pooling finds the tokens it reads."""
        if not isinstance(self.reg_tokens, int) or isinstance(self.reg_tokens, bool) or self.reg_tokens < 0:
            _bad("reg_tokens", f"must be an integer >= 0, got {self.reg_tokens!r}")
        if self.global_pool == "token" and not self.class_token:
            _bad("global_pool", "'token' pooling needs class_token=True (use 'avg' without a class token)")
        if self.global_pool in ("avg", "map") and self.num_patches < 1:
            _bad("global_pool", f"{self.global_pool!r} pooling needs at least one patch token")
        if self.pos_embed == "sincos1d" and self.embed_dim % 2:
            _bad("pos_embed", f"'sincos1d' needs an even embed_dim, got {self.embed_dim}")
        if self.pos_embed == "sincos2d" and self.embed_dim % 4:
            _bad("pos_embed", f"'sincos2d' needs embed_dim divisible by 4, got {self.embed_dim}")
        if self.no_embed_class and self.pos_embed != "learn":
            _bad("no_embed_class", "only applies to learned position embeddings (pos_embed='learn')")
        if self.dynamic_img_size and self.pos_embed == "sincos1d":
            _bad("dynamic_img_size", "1D sin-cos embeddings have no 2D grid to resample")

    def _check_layers(self) -> None:
        """The stem, LayerScale, the pre-logits layer and the norms agree with each other."""
        p = self.patch_size
        if not isinstance(self.stem_convs, int) or isinstance(self.stem_convs, bool) or self.stem_convs < 0:
            _bad("stem_convs", f"must be an integer >= 0, got {self.stem_convs!r}")
        if self.stem_convs and self.stem != "conv":
            _bad("stem_convs", "extra stem convolutions need stem='conv'")
        if not isinstance(self.stem_early_convs, int) or isinstance(self.stem_early_convs, bool) \
                or self.stem_early_convs < 0:
            _bad("stem_early_convs", f"must be an integer >= 0, got {self.stem_early_convs!r}")
        if self.stem_early_convs and self.stem != "conv":
            _bad("stem_early_convs", "early stem convolutions need stem='conv'")
        if self.stem_whiten and self.stem != "conv":
            _bad("stem_whiten", "the whitening layer is part of the conv stem; it needs stem='conv'")
        if not self.stem_whiten_affine and not self.stem_whiten:
            _bad("stem_whiten_affine", "is the BatchNorm after the whitening filters; it needs stem_whiten=True")
        if self.stem_dirac and self.stem != "conv":
            _bad("stem_dirac", "the identity init is for the conv stem's convolutions; it needs stem='conv'")
        if self.stem == "conv":
            if p & (p - 1) or p < 2:
                _bad("stem", f"the 'conv' stem needs a power-of-two patch_size >= 2, got {p}")
            if self.patch_embed != "conv":
                _bad("patch_embed", "the 'conv' stem has no linear form; use patch_embed='conv'")
        if self.representation_size is not None and self.representation_size < 1:
            _bad("representation_size", f"must be a positive integer or null, got {self.representation_size!r}")
        if self.norm == "post" and self.fc_norm:
            _bad("fc_norm", "post-LN blocks already end in a LayerNorm; fc_norm must be off")

    # ------------------------------------------------------------------------------------------------
    def replace(self, **changes) -> "ViTConfig":
        """A copy with some fields changed (validated)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ConfigError(f"ViTConfig: unknown field(s) {', '.join(map(repr, unknown))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "ViTConfig") -> "ViTConfig":
        return from_dict(cls, data, where)


@dataclass
class Preprocess:
    """How an image becomes the model's input: resize, centre crop, scale to [0, 1], normalise."""

    mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # per-channel mean, subtracted after scaling to [0, 1]
    std: tuple[float, ...] = (0.5, 0.5, 0.5)  # per-channel std, divided by after the mean
    crop_pct: float = 1.0  # resize to size / crop_pct (as ``resize`` says), then centre crop to size
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bicubic"  # resize filter
    resize: Literal["shorter_then_crop", "squash"] = "shorter_then_crop"  # 'shorter_then_crop': the short
    #   side to size / crop_pct, the aspect ratio kept (timm's crop_mode 'center'); 'squash': each side to
    #   size / crop_pct, the aspect ratio not kept (timm's crop_mode 'squash'; HF's ViTImageProcessor, at
    #   crop_pct 1: the whole image squeezed to the size)

    def __post_init__(self):
        """Each field checked for its type, finiteness and range (MEAN_RANGE, STD_RANGE, CROP_PCT_RANGE)."""
        self.mean = reals_in(self.mean, "Preprocess.mean", *MEAN_RANGE)
        self.std = reals_in(self.std, "Preprocess.std", *STD_RANGE)
        if len(self.mean) != len(self.std):
            raise ConfigError(f"Preprocess: mean has {len(self.mean)} values but std has {len(self.std)}")
        self.crop_pct = real_in(self.crop_pct, "Preprocess.crop_pct", *CROP_PCT_RANGE)
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"Preprocess.interpolation: expected one of {', '.join(INTERPOLATIONS)}, "
                              f"got {self.interpolation!r}")
        if self.resize not in RESIZE_MODES:
            raise ConfigError(f"Preprocess.resize: expected one of {', '.join(RESIZE_MODES)}, got {self.resize!r}")

    def for_channels(self, channels: int) -> "Preprocess":
        """The same constants with one value per channel (a grey model gets the mean of RGB values; constants
        that are the same for every channel, as the default 0.5, fit any number of channels)."""
        if len(self.mean) == channels:
            return self
        if channels == 1:
            m, s = sum(self.mean) / len(self.mean), sum(self.std) / len(self.std)
            return dataclasses.replace(self, mean=(m,), std=(s,))
        if len(set(self.mean)) == 1 and len(set(self.std)) == 1:
            return dataclasses.replace(self, mean=self.mean[:1] * channels, std=self.std[:1] * channels)
        raise ConfigError(f"Preprocess.mean: {len(self.mean)} values do not fit {channels} channels (expected 1 or "
                          f"{channels})")

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "Preprocess") -> "Preprocess":
        return from_dict(cls, data, where)


__all__ = ["ViTConfig", "Preprocess"]
