"""Building blocks of the Vision Transformer, one concept a file."""

from .attention import Attention, PerHeadAttention, softmax_attention
from .attention_pool import AttentionPool
from .block import Block, DropPath, LayerScale
from .mlp import Mlp
from .patch_embed import (
    RESIZE_MODES,
    ConvStem,
    PatchEmbed,
    PatchWhitening,
    patch_whitening,
    resample_patch_embed,
    resize_matrix,
)
from .pos_embed import resample_pos_embed, sincos_1d, sincos_2d
from .weight_init import lecun_normal_

__all__ = [
    "Attention",
    "PerHeadAttention",
    "softmax_attention",
    "AttentionPool",
    "Block",
    "DropPath",
    "LayerScale",
    "Mlp",
    "PatchEmbed",
    "ConvStem",
    "PatchWhitening",
    "patch_whitening",
    "RESIZE_MODES",
    "resample_patch_embed",
    "resize_matrix",
    "resample_pos_embed",
    "sincos_1d",
    "sincos_2d",
    "lecun_normal_",
]
