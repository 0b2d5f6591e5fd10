"""Reading and writing weights: the canonical format, and key tables for timm, HF and JAX checkpoints."""

from .checkpoint import load, load_state_dict_file, resolve_checkpoint, save
from .convert import convert, from_hf, from_jax, from_timm, to_hf, to_timm

__all__ = [
    "load",
    "save",
    "load_state_dict_file",
    "resolve_checkpoint",
    "convert",
    "from_timm",
    "to_timm",
    "from_hf",
    "to_hf",
    "from_jax",
]
