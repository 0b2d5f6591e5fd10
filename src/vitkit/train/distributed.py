"""Distributed data parallel: one ``DistInfo``, built once by the command line from the launcher's
environment (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK) and passed to the library.

Only rank 0 logs and writes files. The library never reads the environment itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ..errors import ConfigError


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


def init_process_group(info: DistInfo, device: torch.device) -> None:
    """Join the process group (gloo on CPU, nccl on CUDA); MASTER_ADDR/PORT come from the launcher."""
    import torch.distributed as dist

    if not info.enabled or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size)


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        import torch.distributed as dist

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
            dist.broadcast(b, src=0)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        import torch.distributed as dist

        dist.barrier()


__all__ = ["DistInfo", "init_process_group", "destroy_process_group", "all_reduce_sum", "broadcast_buffers",
           "barrier"]
