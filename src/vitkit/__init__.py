"""vitkit: Vision Transformers from a blank page to production.

    import vitkit
    model = vitkit.create_model("vit_base_patch16_224", num_classes=10)
    vitkit.save(model, "ckpt/")
    model = vitkit.load("ckpt/")          # eval mode; float (B, C, H, W) -> logits
    model = vitkit.create_model(weights="vit_small.safetensors")   # timm, HF or JAX weights, told by the file
    result = vitkit.fit("photos/", max_minutes=5, out="runs/photos")   # as `vitkit train --data photos/`

The package's layers, each importing only from those before it: ``core`` (errors, strict parsing,
progress, the hardware), ``model`` (the config, the ViT, its layers and named variants), ``io``
(checkpoints and conversions), ``data``, ``infer`` (the fast path), ``train``, ``tools`` (evaluate,
predict, explain, export, bench), ``api`` (the entry points named here) and ``cli``. The names below load
their module on first use, so that ``import vitkit`` (and ``vitkit --help``) does not import torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that owns it
_EXPORTS = {
    "ViTConfig": "vitkit.model.config",
    "Preprocess": "vitkit.model.config",
    "VisionTransformer": "vitkit.model.vit",
    "count_params": "vitkit.model.vit",
    "get_config": "vitkit.model.variants",
    "list_models": "vitkit.model.variants",
    "create_model": "vitkit.api",
    "fit": "vitkit.api",
    "FitResult": "vitkit.api",
    "load": "vitkit.io.checkpoint",
    "save": "vitkit.io.checkpoint",
    "VitkitError": "vitkit.core.errors",
    "ConfigError": "vitkit.core.errors",
    "ShapeError": "vitkit.core.errors",
    "CheckpointError": "vitkit.core.errors",
    "DataError": "vitkit.core.errors",
    "TrainingError": "vitkit.core.errors",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vitkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
