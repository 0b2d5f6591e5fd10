"""Weight initialisers that torch.nn.init does not have."""

from __future__ import annotations

import math

import torch
from torch import nn


def lecun_normal_(w: torch.Tensor) -> None:
    """LeCun normal as JAX's ``lecun_normal``: truncated at 2 std, with std 1 / sqrt(fan_in) after truncation.

    ``fan_in`` is the size of one output row, w[0]: in_features of a Linear, C * kh * kw of a Conv2d.
    """
    fan_in = w[0].numel()
    # a standard normal truncated to [-2, 2] has std 0.8796; rescale so that the result has std 1/sqrt(fan_in)
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
    nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)
