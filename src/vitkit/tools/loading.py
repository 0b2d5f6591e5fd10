"""The model a tool runs, and the names of its classes."""

from __future__ import annotations

import torch
from torch import nn

from ..core.hardware import resolve_device


def load_model(model_or_path, device: str | torch.device = "cpu") -> nn.Module:
    """The model a tool runs, in eval mode on ``device`` (checked as '--device'): a module as given, or
    the model of a checkpoint or run directory (its best checkpoint), of timm, HF or JAX weights, or of a
    Hub name (``hf-hub:ORG/NAME``, or a model name with published weights: ``io.hub``)."""
    device = resolve_device(device, what="--device")
    if isinstance(model_or_path, nn.Module):
        return model_or_path.to(device).eval()
    from ..io.convert import load_any  # the readers (and the model) only when a tool loads one

    return load_any(model_or_path, device=device)


def label_names(model: nn.Module) -> list[str]:
    """Class names of the model's head: its labels, else the class indices as strings."""
    n = model.cfg.num_classes
    return list(model.labels) if model.labels is not None else [str(i) for i in range(n)]


__all__ = ["load_model", "label_names"]
