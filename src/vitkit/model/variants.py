"""Named models, as data: one table of sizes, one list of published (size, patch, resolution) models,
small-image presets and the tutorials' own models. Names follow timm where timm has the model.

Sizes are those of Dosovitskiy et al. 2020, Table 1 (Base, Large, Huge), Touvron et al. 2021 (Tiny,
Small) and Zhai et al. 2022, "Scaling Vision Transformers", Table 2 (Medium, giant).
"""

from __future__ import annotations

import fnmatch

from ..core.errors import ConfigError
from .config import ViTConfig

# size -> (width D, depth, heads, MLP width)
SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (192, 12, 3, 768),
    "small": (384, 12, 6, 1536),
    "medium": (512, 12, 8, 2048),
    "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096),
    "huge": (1280, 32, 16, 5120),
    "giant": (1408, 40, 16, 6144),
}

# (size, patch, image size, extra config) of published ImageNet models; 1000 classes unless changed.
_GAP = dict(class_token=False, global_pool="avg", fc_norm=False)
_REG4_DINOV2 = dict(reg_tokens=4, no_embed_class=True, layer_scale=1e-5, num_classes=0)
PUBLISHED: list[tuple[str, int, int, dict]] = [
    ("tiny", 16, 224, {}),
    ("tiny", 16, 384, {}),
    ("small", 8, 224, {}),
    ("small", 16, 224, {}),
    ("small", 16, 384, {}),
    ("small", 32, 224, {}),
    ("small", 32, 384, {}),
    ("base", 8, 224, {}),
    ("base", 16, 224, {}),
    ("base", 16, 384, {}),
    ("base", 32, 224, {}),
    ("base", 32, 384, {}),
    ("large", 14, 224, {}),
    ("large", 16, 224, {}),
    ("large", 16, 384, {}),
    ("large", 32, 224, {}),
    ("large", 32, 384, {}),
    ("huge", 14, 224, {}),
    ("giant", 14, 224, {}),
    # global-average-pooled models without a class token (timm's *_gap_* names)
    ("base", 16, 224, dict(_GAP, num_heads=16, name="vit_base_patch16_gap_224")),
    ("medium", 16, 240, dict(_GAP, qkv_bias=False, layer_scale=1e-6, name="vit_medium_patch16_gap_240")),
    ("medium", 16, 256, dict(_GAP, qkv_bias=False, layer_scale=1e-6, name="vit_medium_patch16_gap_256")),
    ("medium", 16, 384, dict(_GAP, qkv_bias=False, layer_scale=1e-6, name="vit_medium_patch16_gap_384")),
    ("huge", 14, 224, dict(_GAP, name="vit_huge_patch14_gap_224")),
    ("huge", 16, 448, dict(_GAP, name="vit_huge_patch16_gap_448")),
    ("giant", 16, 224, dict(_GAP, name="vit_giant_patch16_gap_224")),
    # DINOv2 with registers (Darcet et al. 2023), as timm builds it: 4 registers after [cls], a position
    # table over the 37 x 37 patches only, LayerScale; self-supervised backbones without a head
    ("small", 14, 518, dict(_REG4_DINOV2, name="vit_small_patch14_reg4_dinov2")),
    ("base", 14, 518, dict(_REG4_DINOV2, name="vit_base_patch14_reg4_dinov2")),
    ("large", 14, 518, dict(_REG4_DINOV2, name="vit_large_patch14_reg4_dinov2")),
]

# Small-image presets: CIFAR-like 32x32 RGB and MNIST-like 28x28 grey, 10 classes by default.
SMALL: dict[str, dict] = {
    "vit_tiny_patch4_32": dict(img_size=32, patch_size=4, in_chans=3, num_classes=10, embed_dim=192,
                               depth=12, num_heads=3),
    "vit_small_patch4_32": dict(img_size=32, patch_size=4, in_chans=3, num_classes=10, embed_dim=384,
                                depth=12, num_heads=6),
    # from-scratch recipe for small data: conv stem, 2D sin-cos positions, average pooling
    "vit_hybrid_tiny_patch4_32": dict(img_size=32, patch_size=4, in_chans=3, num_classes=10, embed_dim=192,
                                      depth=9, num_heads=3, mlp_ratio=2.0, stem="conv", stem_width=32,
                                      pos_embed="sincos2d", class_token=False, global_pool="avg"),
    "vit_tiny_patch4_28": dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=192,
                               depth=12, num_heads=3),
    "vit_mini_patch4_28": dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=64,
                               depth=4, num_heads=4, mlp_ratio=2.0),
    "vit_mini_patch4_32": dict(img_size=32, patch_size=4, in_chans=3, num_classes=10, embed_dim=64,
                               depth=4, num_heads=4, mlp_ratio=2.0),
    # the demo recipe's model (`vitkit train`): a conv stem (32 and 64 channels, stride 2 twice, then one
    # 3x3 conv at the 7x7 grid), two blocks of width 64, 2D sin-cos positions, average pooling. The stem's
    # extra conv and two blocks beat four blocks behind a lighter stem, in accuracy per second of CPU
    # (benchmarks/results/train_demo_search.json).
    "vit_hybrid_mini_patch4_28": dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=64,
                                      depth=2, num_heads=4, mlp_ratio=2.0, stem="conv", stem_width=32,
                                      stem_convs=1, pos_embed="sincos2d", class_token=False, global_pool="avg"),
    # the small-data recipe's model (`vitkit train --data DIR` on CIFAR-size data): a conv tokenizer down to
    # an 8x8 grid whose first layer is a frozen 2x2 patch-whitening filter bank set from the data (24
    # channels), then a 3x3 stride-2 conv (64) and a 3x3 conv at the grid, BatchNorm with fast running
    # statistics; four blocks of width 128, MLP ratio 2, 2D sin-cos positions, average pooling. About 42
    # MMAC per image; its parts measured one by one in docs/experiments.md.
    "vit_hybrid_whiten_patch4_32": dict(img_size=32, patch_size=4, in_chans=3, num_classes=10, embed_dim=128,
                                        depth=4, num_heads=4, mlp_ratio=2.0, stem="conv", stem_width=32,
                                        stem_convs=1, stem_whiten=True, stem_bn_momentum=0.4,
                                        pos_embed="sincos2d", class_token=False, global_pool="avg"),
    # the photos recipe's model (`vitkit train --data DIR` on images larger than 64 px): the small-data model's
    # tokenizer one stride-2 conv deeper (whitening, 64 and 128 channels, a 3x3 conv at the grid), an 8x8
    # grid at 64 px; the recipe sets the resolution and depth for the budget
    "vit_hybrid_whiten_patch8_64": dict(img_size=64, patch_size=8, in_chans=3, num_classes=10, embed_dim=128,
                                        depth=4, num_heads=4, mlp_ratio=2.0, stem="conv", stem_width=32,
                                        stem_convs=1, stem_whiten=True, stem_bn_momentum=0.4,
                                        pos_embed="sincos2d", class_token=False, global_pool="avg"),
    # a tiny model for tests: builds and runs in milliseconds
    "vit_test": dict(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=32, depth=2,
                     num_heads=2, mlp_ratio=2.0),
}

# The tutorials' models, to build, train and compare.
TUTORIALS: dict[str, dict] = {
    # 'ViT from scratch' on MNIST: 7x7 grid of 4x4 patches, width 8, 2 heads, one block, a ReLU MLP
    # as wide as the tokens, 1D sin-cos positions, 10 classes.
    "tutorial_mnist": dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=8, depth=1,
                           num_heads=2, mlp_ratio=1.0, act="relu", pos_embed="sincos1d",
                           patch_embed="linear"),
    # the timm-style tutorial's ViT-B/16 at 384 px
    "tutorial_vit_b16_384": dict(img_size=384, patch_size=16, embed_dim=768, depth=12, num_heads=12),
    # the paper's table 1, as the third tutorial builds them (224 px, 1000 classes)
    "tutorial_vit_base": dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12),
    "tutorial_vit_large": dict(img_size=224, patch_size=16, embed_dim=1024, depth=24, num_heads=16),
    "tutorial_vit_huge": dict(img_size=224, patch_size=14, embed_dim=1280, depth=32, num_heads=16),
}


def _build_registry() -> dict[str, dict]:
    reg: dict[str, dict] = {}
    for size, patch, res, extra in PUBLISHED:
        extra = dict(extra)
        name = extra.pop("name", f"vit_{size}_patch{patch}_{res}")
        D, depth, heads, mlp = SIZES[size]
        cfg = dict(img_size=res, patch_size=patch, embed_dim=D, depth=depth, num_heads=heads, mlp_ratio=mlp / D)
        cfg.update(extra)
        reg[name] = cfg
    reg.update(SMALL)
    reg.update(TUTORIALS)
    return reg


REGISTRY: dict[str, dict] = _build_registry()


def list_models(pattern: str = "*") -> list[str]:
    """Names of the registered models matching a shell-style pattern (e.g. 'vit_base*'), sorted."""
    pat = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
    return sorted(n for n in REGISTRY if fnmatch.fnmatch(n, pat))


def get_config(name: str, **overrides) -> ViTConfig:
    """The ViTConfig of a named model, with fields overridden."""
    if name not in REGISTRY:
        close = list_models(name)[:5]
        hint = f"; did you mean {', '.join(close)}?" if close else "; `vitkit list` shows every name"
        raise ConfigError(f"model {name!r} is not a known name{hint}")
    data = dict(REGISTRY[name])
    data.update(overrides)
    return ViTConfig.from_dict(data, where=f"{name}")


def build_model(name: str, seed: int | None = None, **overrides):
    """Build a named model (random weights); ``seed`` makes the initialisation reproducible."""
    import torch

    from .vit import VisionTransformer

    cfg = get_config(name, **overrides)
    if seed is None:
        return VisionTransformer(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return VisionTransformer(cfg)
