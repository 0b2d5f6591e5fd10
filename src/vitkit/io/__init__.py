"""Reading and writing weights: the canonical format, and key tables for timm, HF and JAX checkpoints.

The modules form layers; each imports only from those below it:

- ``convert``: the front end: one table of formats (read, write), ``convert`` and ``from_*`` / ``to_*``;
- ``timm``, ``hf``, ``jax``: one format each: its key table, what its weights show, its layout on disk;
- ``keys`` (applying a key table with hard checks, building the model) and ``arch`` (the ViTConfig
  of foreign weights);
- ``checkpoint`` (vitkit's own format, reading weight files) and ``atomic`` (crash-safe writes).
"""

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
