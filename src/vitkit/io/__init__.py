"""Reading and writing weights: the canonical format, and key tables for timm, HF and JAX checkpoints."""

from .checkpoint import load, load_state_dict_file, resolve_checkpoint, save

__all__ = ["load", "save", "load_state_dict_file", "resolve_checkpoint"]
