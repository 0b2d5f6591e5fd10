"""``create_model``: a named model with fresh weights, or a model read from weights on disk in any format.

    model = vitkit.create_model("vit_small_patch16_224", seed=0)                  # random weights
    model = vitkit.create_model(weights="vit_small.safetensors")                   # timm weights
    model = vitkit.create_model("vit_small_patch16_224", weights="ViT-S_16.npz", num_classes=10)
    model = vitkit.create_model("vit_small_patch16_224", pretrained=True)           # its published weights
    model = vitkit.create_model(weights="hf-hub:google/vit-base-patch16-224")       # from the Hugging Face Hub

With ``weights``, the format is told by the container (``io.convert.detect_format``: a vitkit checkpoint
or run directory, an HF folder, a JAX .npz file, a timm .pth / .bin / .safetensors file) and the
architecture is read from the weights as ``vitkit convert`` reads it. A name is then optional: None
(or 'auto') takes everything from the weights and fills in what they do not show (heads, LayerNorm
eps, activation, pooling) with defaults; a name supplies those fields from that model instead, after
checking that it agrees with the weights on width, depth, patch size, channels and MLP width.
``io.convert.read`` gives the same model together with what was assumed.

``pretrained=True`` reads the named model's published weights (``io.hub.PRETRAINED``: timm's default tag
for that architecture) from the Hugging Face Hub, as ``weights="hf-hub:ORG/NAME"`` reads any repository
(``pip install 'vitkit[hub]'``); the model's ``preprocess`` is the one its publisher gives.
"""

from __future__ import annotations

import os

from .core.errors import ConfigError
from .model.variants import build_model


def create_model(name: str | None = None, seed: int | None = None, *, pretrained: bool = False,
                 weights: str | os.PathLike | None = None, **overrides):
    """A model: ``name`` with random weights (``seed`` makes them reproducible), or read from ``weights`` (a
    path or a Hub name), or (``pretrained``) from ``name``'s published weights.

    Reading weights, ``overrides`` set ViTConfig fields the weights do not show (as ``vitkit convert
    --set``), and ``num_classes`` different from the weights' head gives a new, zero-initialised head
    of that size (the labels are dropped). A vitkit checkpoint carries its config: it takes no name and
    no overrides but num_classes. The model is in eval mode on the CPU, as ``vitkit.load`` gives it.
    """
    if pretrained:
        if weights is not None:
            raise ConfigError("create_model: give pretrained=True (the name's published weights) or weights=..., "
                              "not both")
        if name in (None, "auto"):
            raise ConfigError("create_model: pretrained=True needs a model name (vitkit.list_models())")
        from .io.hub import pretrained_name
        from .model.variants import get_config

        get_config(name)  # an unknown name is that error
        weights = pretrained_name(name)
    if weights is None:
        if name in (None, "auto"):
            raise ConfigError("create_model: give a model name (vitkit.list_models()) or weights=PATH")
        return build_model(name, seed=seed, **overrides)
    from .io.convert import read

    num_classes = overrides.pop("num_classes", None)
    model, _ = read(weights, model_name=None if name in (None, "auto") else name, overrides=overrides)
    if num_classes is not None and num_classes != model.cfg.num_classes:
        model.reset_head(num_classes)
    return model


__all__ = ["create_model"]
