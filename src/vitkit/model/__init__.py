"""The model: ``ViTConfig`` and ``Preprocess`` (config), ``VisionTransformer`` (vit), its building
blocks (layers/) and the named models (variants)."""

from .config import Preprocess, ViTConfig
from .variants import build_model, get_config, list_models
from .vit import VisionTransformer, count_params

__all__ = ["ViTConfig", "Preprocess", "VisionTransformer", "count_params", "get_config", "list_models", "build_model"]
