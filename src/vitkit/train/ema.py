"""An exponential moving average (EMA) of a model's weights, evaluated and saved in their place.

The average covers the whole ``state_dict`` (parameters and buffers) in float32, whatever the
model's dtype: floating tensors are averaged with one foreach lerp per update, the others (e.g.
BatchNorm's step counters) follow the model. A copy of the model with the average in place, cast to
the model's dtypes, is what validation scores and what ``best/`` holds.

Under FSDP the parameters are shards (DTensors), and so is their average: each process averages its
own shard. The average is gathered whole where it leaves the trainer (trainer.pt, the copy).

The decay warms up (``ema_decay``), so that a short run's average is not held back by the random
initial weights.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..io.checkpoint import unwrap
from .fsdp import full_tensor, is_sharded, plain_copy, shard_like


def ema_decay(decay: float, step: int) -> float:
    """The EMA decay at optimizer step ``step`` (0-based): min(decay, (1 + step) / (10 + step)).

    A fixed decay of 0.999 averages over the last ~1,000 steps, so early in a run (or all through a
    short one) the average still holds the random initial weights. Warming the decay up lets the
    average follow the weights at first and settle on ``decay`` after a few thousand steps.
    """
    return min(decay, (1.0 + step) / (10.0 + step))


class EMA:
    """The moving average of ``model``'s state, started at its current weights, on its device."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.shadow = [t.detach().clone().float() for t in model.state_dict().values()]

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        """Move the average towards ``model``'s weights after optimizer step ``step`` (0-based)."""
        values = list(model.state_dict().values())
        floats = [(e, v) for e, v in zip(self.shadow, values) if v.is_floating_point()]
        weight = 1.0 - ema_decay(self.decay, step)
        for kind in dict.fromkeys(type(e) for e, _ in floats):  # one lerp per kind: shards (DTensors) apart
            pairs = [(e, v) for e, v in floats if type(e) is kind]
            torch._foreach_lerp_([e for e, _ in pairs], [v.float() for _, v in pairs], weight)
        for e, v in zip(self.shadow, values):
            if not v.is_floating_point():
                e.copy_(v)

    def state_dict(self) -> list[torch.Tensor]:
        """The averaged tensors in the model's ``state_dict`` order, full, on the CPU (as trainer.pt holds
        them); the shards of a sharded model's average are gathered (a collective)."""
        return [full_tensor(t).cpu() for t in self.shadow]

    def load_state_dict(self, tensors: list[torch.Tensor]) -> None:
        """Take a saved average (``state_dict``'s list), laid out as this average: on its device, and
        sharded as the model is."""
        self.shadow = [shard_like(t, like) for t, like in zip(tensors, self.shadow)]

    def averaged_copy(self, model: nn.Module) -> nn.Module:
        """A copy of ``model`` (unwrapped from DDP / compile) holding the average, in the model's dtypes.
        Of a sharded model: an unsharded copy on every process (gathered: a collective)."""
        if is_sharded(model):
            names = unwrap(model).state_dict().keys()
            return plain_copy(model, {k: full_tensor(e) for k, e in zip(names, self.shadow)})
        averaged = copy.deepcopy(unwrap(model))
        with torch.no_grad():
            for v, e in zip(averaged.state_dict().values(), self.shadow):
                v.copy_(e.to(v.dtype))
        return averaged


__all__ = ["EMA", "ema_decay"]
