"""Fully sharded data parallel (``strategy = "fsdp"``): every process holds a 1/N shard of each
parameter, its gradient and its optimizer state, instead of a full replica as under DDP.

torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) does the sharding. Each encoder block is one
unit and the root (stem, embeddings, final norm, head) another: a block's parameters are gathered
just before its forward (and again before its backward), used, and freed, and its gradients are
reduce-scattered back to the shards. The parameters become DTensors sharded on dim 0 over a
one-dimensional device mesh of all the processes; everything else about the model is unchanged.

What leaves the trainer is always whole, so a run directory is the same whatever the strategy:

- ``full_weights``: the model's state dict gathered into ordinary tensors (rank 0's copy on the CPU),
  written as an ordinary vitkit checkpoint;
- ``full_optimizer_state`` / ``load_optimizer_state``: the optimizer state gathered into the layout of
  ``torch.optim.Optimizer.state_dict()`` (parameters numbered in group order), and sharded again on
  load, so trainer.pt is the same file as a DDP run's and either strategy resumes it;
- ``plain_copy``: an unsharded model holding given full weights, for validation and best/.

Mixed precision is the trainer's autocast, as under DDP (no ``MixedPrecisionPolicy``): the shards,
the gathered parameters and the reduced gradients stay float32, and the matrix products run in bf16
inside autocast, so an FSDP run computes what a DDP run computes. fp16 is refused (its gradient
scaler is not made for sharded gradients); bf16 needs no scaler.
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from ..io import checkpoint as ckpt_io


def shard_model(model: nn.Module, device: torch.device) -> nn.Module:
    """Shard ``model`` in place over all the processes of the current group (which may be one): each
    block of ``model.blocks``, then the root. Returns ``model``, whose parameters are now DTensors.
    Build the optimizer after this: the parameters are new objects."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _dtensor() -> type | tuple:
    """torch's DTensor class, for isinstance; an empty tuple (nothing is one) in a build of torch
    without torch.distributed."""
    import torch.distributed as dist

    if not dist.is_available():
        return ()
    from torch.distributed.tensor import DTensor

    return DTensor


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` (unwrapped from torch.compile) holds sharded (DTensor) parameters."""
    return any(isinstance(p, _dtensor()) for p in ckpt_io.unwrap(model).parameters())


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered into an ordinary tensor (a collective: every process calls it); other
    tensors as they are."""
    return t.full_tensor() if isinstance(t, _dtensor()) else t


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` laid out as ``like``: sharded the same way when ``like`` is a DTensor (every process
    holds the same ``full``), else on ``like``'s device in its memory layout (e.g. channels-last)."""
    if isinstance(like, _dtensor()):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(like.device), like.device_mesh, like.placements)
    return torch.empty_like(like, dtype=full.dtype).copy_(full)


def _options(everywhere: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # cpu_offload with full_state_dict: rank 0 alone receives the tensors, on the CPU
    return StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)


def full_weights(model: nn.Module, everywhere: bool = False) -> dict[str, torch.Tensor]:
    """The sharded model's state dict as ordinary full tensors: on rank 0 only, on the CPU (to write),
    or ``everywhere``: on every process, on the model's device (to evaluate). A collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(ckpt_io.unwrap(model), options=_options(everywhere))


def _names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters, in the order ``Optimizer.state_dict()`` numbers them."""
    name_of = {p: n for n, p in ckpt_io.unwrap(model).named_parameters()}
    return [name_of[p] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state of a sharded model, gathered, in ``Optimizer.state_dict()``'s layout: on
    rank 0 (on the CPU); an empty dict elsewhere. A collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    named = get_optimizer_state_dict(ckpt_io.unwrap(model), optimizer, options=_options(False))
    if not named:
        return {}
    number = {name: i for i, name in enumerate(_names(model, optimizer))}
    return {"state": {number[n]: s for n, s in named["state"].items()},
            "param_groups": [{**g, "params": [number[n] for n in g["params"]]} for g in named["param_groups"]]}


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Shard a full optimizer state (``Optimizer.state_dict()``'s layout, as every process read it from
    trainer.pt) into the optimizer of the sharded model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _names(model, optimizer)
    named = {"state": {names[i]: s for i, s in saved["state"].items()},
             "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]]}
    set_optimizer_state_dict(ckpt_io.unwrap(model), optimizer, named,
                             options=StateDictOptions(full_state_dict=True))


def plain_copy(model: nn.Module, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """An unsharded VisionTransformer of ``model``'s architecture, preprocess and labels holding the full
    weights ``state`` (e.g. ``full_weights(model, everywhere=True)``), on ``state``'s device, in eval mode."""
    base = ckpt_io.unwrap(model)
    copy = ckpt_io.model_from_state(base.cfg, state, "the gathered weights")
    copy.preprocess, copy.labels = base.preprocess, base.labels
    device = next(iter(state.values())).device if state else torch.device("cpu")
    return copy.to(device).eval()


__all__ = ["shard_model", "is_sharded", "full_tensor", "shard_like", "full_weights", "full_optimizer_state",
           "load_optimizer_state", "plain_copy"]
