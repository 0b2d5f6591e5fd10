"""vitkit: Vision Transformers from a blank page to production.

    import vitkit
    model = vitkit.create_model("vit_base_patch16_224", num_classes=10)
    vitkit.save(model, "ckpt/")
    model = vitkit.load("ckpt/")          # eval mode; float (B, C, H, W) -> logits
    model = vitkit.create_model(weights="vit_small.safetensors")   # timm, HF or JAX weights, told by the file
"""

from .config import Preprocess, ViTConfig
from .errors import CheckpointError, ConfigError, DataError, ShapeError, TrainingError, VitkitError
from .factory import create_model
from .io.checkpoint import load, save
from .model import VisionTransformer
from .runtime import count_params
from .variants import get_config, list_models

__version__ = "0.1.0"

__all__ = [
    "ViTConfig",
    "Preprocess",
    "VisionTransformer",
    "create_model",
    "get_config",
    "list_models",
    "load",
    "save",
    "count_params",
    "VitkitError",
    "ConfigError",
    "ShapeError",
    "CheckpointError",
    "DataError",
    "TrainingError",
]
