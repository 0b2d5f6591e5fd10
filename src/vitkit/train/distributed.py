"""Distributed data parallel: one ``DistInfo``, built once by the command line from the launcher's
environment (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK) and passed to the library.

Only rank 0 logs and writes files. The library never reads the environment itself.

Which backend serves which tensors is decided once, by ``collectives_for`` (see there): gloo on the
CPU; on CUDA a device-keyed group, gloo for CPU tensors and NCCL for CUDA tensors. Every collective
here checks first that the group can serve its tensor's device, so a misplaced tensor is a one-line
TrainingError instead of an error deep inside the backend (or, for some devices, a silent no-op).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Mapping

import torch

from ..core.errors import ConfigError, TrainingError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "DistInfo":
        """Read RANK / WORLD_SIZE / LOCAL_RANK from ``env`` (the CLI passes os.environ)."""

        def num(key: str, default: int) -> int:
            raw = env.get(key)
            if raw is None or raw == "":
                return default
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(f"environment variable {key}={raw!r} is not an integer") from None

        world = num("WORLD_SIZE", 1)
        rank = num("RANK", 0)
        local = num("LOCAL_RANK", rank)
        if world < 1 or not 0 <= rank < world:
            raise ConfigError(f"RANK={rank} / WORLD_SIZE={world}: rank must be in [0, world size)")
        return cls(rank=rank, world_size=world, local_rank=local)


@dataclass(frozen=True)
class Collectives:
    """How a run on one device type talks to the other processes. The trainer's own reduced tensors
    (step flags, evaluation sums) live on the CPU whatever the device."""

    backend: str  # what ``torch.distributed.init_process_group`` is given


def collectives_for(device: torch.device) -> Collectives:
    """The process-group backend for a run on ``device``.

    CPU: gloo. CUDA: the device-keyed backend ``cpu:gloo,cuda:nccl``, where NCCL carries what lives on
    the GPU (DDP's gradient buckets, the broadcast BatchNorm buffers) and gloo what lives on the CPU:
    the per-step flags and the evaluation sums, which are built from Python numbers the step has
    already read back (``.item()``), so they stay on the CPU with no copy to the GPU and back; and the
    object collectives (the gathered RNG states), which torch sends over the group's CPU backend when
    it has one. One design for both device types: the trainer's reductions always live on the CPU.
    A CUDA build without NCCL falls back to gloo alone, which serves CPU and CUDA tensors. Other
    devices get gloo too: MPS has no DDP (the command line refuses several processes there), and a
    model left on such a device fails ``check_served`` at its first collective, in one line.
    """
    import torch.distributed as dist

    if device.type == "cuda" and dist.is_available() and dist.is_nccl_available():
        return Collectives("cpu:gloo,cuda:nccl")
    return Collectives("gloo")


def init_process_group(info: DistInfo, device: torch.device, alone: bool = False) -> bool:
    """Join the process group (``collectives_for(device).backend``); MASTER_ADDR/PORT come from the
    launcher. On CUDA this process's GPU (``device``, its local rank's) becomes the current one first,
    so that NCCL's calls run there rather than all on cuda:0. ``alone``: one process starts a group of
    its own too (in-memory, no launcher), as FSDP needs one. True when this call started the group
    (False: one process not ``alone``, or a group the caller had started already)."""
    import torch.distributed as dist

    if not (info.enabled or alone) or dist.is_initialized():
        return False
    backend = collectives_for(device).backend
    # torch.distributed.nn.functional binds the group that exists when it is first imported (DDP and
    # FSDP import it) as its functions' default argument: imported after the group starts, it holds the
    # group, and the backend's worker threads, until the interpreter's exit, where they can abort a
    # process that has finished. Imported now, before any group exists, it holds none.
    import torch.distributed.nn.functional  # noqa: F401

    if device.type == "cuda":
        torch.cuda.set_device(device)
    alone_store = {} if info.enabled else {"store": dist.HashStore()}  # a group of one needs no rendezvous
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size, **alone_store)
    return True


@contextlib.contextmanager
def process_group(info: DistInfo, device: torch.device, alone: bool = False):
    """The process group for the duration of a run (``alone``: a group of one for one process, see
    ``init_process_group``): started here unless the caller has one, and then torn down here too. A
    gloo group left to the interpreter's exit can abort the process (its worker threads outlive
    Python), so whoever starts a group ends it."""
    started = init_process_group(info, device, alone)
    try:
        yield
    finally:
        if started:
            destroy_process_group()


_served: tuple = (None, ())  # (the process group, the device types it serves): read once per group


def served_device_types() -> tuple[str, ...]:
    """The device types the current process group can take tensors on (from its backend config,
    e.g. 'cpu:gloo,cuda:nccl' -> ('cpu', 'cuda')); empty when no group is started. Parsed once per
    group (every step and every BatchNorm layer asks)."""
    import torch.distributed as dist

    global _served
    if not (dist.is_available() and dist.is_initialized()):
        return ()
    group = dist.group.WORLD
    if _served[0] is not group:  # held, so a later group never reuses its identity
        _served = (group, tuple(pair.split(":")[0] for pair in dist.get_backend_config().split(",") if ":" in pair))
    return _served[1]


def check_served(t: torch.Tensor, what: str) -> None:
    """A one-line TrainingError if the process group cannot serve ``t``'s device (collective ``what``)."""
    import torch.distributed as dist

    served = served_device_types()
    if t.device.type not in served:
        config = dist.get_backend_config() if dist.is_initialized() else "none"
        raise TrainingError(f"{what}: a tensor on {t.device}, but the process group (backend '{config}') "
                            f"serves tensors on: {', '.join(served) or 'nothing'}")


def destroy_process_group() -> None:
    """End the group, and with it the backend's worker threads: no reference to it is kept here."""
    import torch.distributed as dist

    global _served
    _served = (None, ())
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        import torch.distributed as dist

        check_served(t, "all_reduce")
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_object(obj, info: DistInfo) -> list:
    if not info.enabled:
        return [obj]
    import torch.distributed as dist

    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, info: DistInfo):
    if not info.enabled:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_buffers(module: torch.nn.Module, info: DistInfo) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics follow each rank's own batches)."""
    if info.enabled:
        import torch.distributed as dist

        for b in module.buffers():
            check_served(b, "broadcast")
            dist.broadcast(b, src=0)


def broadcast_weights(module: torch.nn.Module, info: DistInfo) -> None:
    """Give every rank rank 0's parameters and buffers, the weights rank 0 saves: scoring a model sharded
    over the processes then scores one model, whatever set the ranks' copies apart."""
    if info.enabled:
        import torch.distributed as dist

        for t in module.state_dict().values():
            check_served(t, "broadcast")
            dist.broadcast(t, src=0)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        import torch.distributed as dist

        dist.barrier()


__all__ = ["DistInfo", "Collectives", "collectives_for", "init_process_group", "process_group", "destroy_process_group",
           "served_device_types", "check_served", "all_reduce_sum", "broadcast_buffers", "broadcast_weights",
           "barrier"]
