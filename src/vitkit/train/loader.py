"""Deterministic batches over an ImageSet.

Epoch ``e`` visits the images in the order of a permutation drawn from a generator seeded with
(seed, e), so the order depends on nothing but the seed and the epoch: a run resumed in the middle of
an epoch regenerates the permutation and skips the batches already done. A global batch of
``batch_size`` images is cut into ``world_size`` equal slices, one per process, and each slice into
``accum_steps`` micro-batches; the last incomplete batch of an epoch is dropped.

Images held in memory are taken in this process; streamed ones are decoded in DataLoader worker
processes (``workers``; by default as many as this machine's CPUs allow, ``loader_workers``), which
hand back exactly the batches this process would have decoded, in order, so the number of workers
never changes what a run sees.
"""

from __future__ import annotations

from typing import Iterator

import torch

from ..core.errors import ConfigError, DataError
from ..core.hardware import usable_cpus
from .distributed import DistInfo

MAX_WORKERS = 8  # the most DataLoader workers a process starts by default


def loader_workers(workers: int | None, processes: int = 1) -> int:
    """DataLoader worker processes per training process for streamed data: ``workers``, or (None) the
    CPUs this process may use shared among the ``processes`` training processes, 1 to MAX_WORKERS."""
    if workers is not None:
        return workers
    return max(1, min(MAX_WORKERS, usable_cpus() // max(processes, 1)))


def check_batches(images: int, batch_size: int, processes: int = 1, accum_steps: int = 1) -> None:
    """A ConfigError or DataError where ``images`` training images cannot make one batch of ``batch_size``
    cut into ``processes`` x ``accum_steps`` equal parts: checked before any pass over the data."""
    per = processes * accum_steps
    if batch_size % per:
        raise ConfigError(f"batch_size: {batch_size} is not divisible by processes x accum_steps = "
                          f"{processes} x {accum_steps}")
    if images < batch_size:
        raise DataError(f"training set: {images} images is fewer than one batch of {batch_size}; lower --batch-size")


def epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7919 + 17) % (2**63 - 1)


class BatchLoader:
    def __init__(self, images, batch_size: int, seed: int = 0, dist: DistInfo = DistInfo(), accum_steps: int = 1,
                 workers: int = 0):
        self.ds = images
        self.batch_size = batch_size
        self.seed = seed
        self.dist = dist
        self.accum_steps = accum_steps
        self.workers = workers
        check_batches(len(images), batch_size, dist.world_size, accum_steps)
        self.micro = batch_size // (dist.world_size * accum_steps)  # images per process per micro-batch
        self.steps_per_epoch = len(images) // batch_size
        self._perm: tuple[int, torch.Tensor] | None = None  # (epoch, permutation): the last one drawn

    def __len__(self) -> int:
        return self.steps_per_epoch

    def permutation(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        return torch.randperm(len(self.ds), generator=g)

    def rank_indices(self, perm: torch.Tensor, step_in_epoch: int) -> torch.Tensor:
        """This process's indices of global batch ``step_in_epoch``: its slice of the global batch."""
        start = step_in_epoch * self.batch_size
        batch = perm[start : start + self.batch_size]
        per_rank = self.batch_size // self.dist.world_size
        return batch[self.dist.rank * per_rank : (self.dist.rank + 1) * per_rank]

    def batch_indices(self, epoch: int, step_in_epoch: int) -> torch.Tensor:
        """The dataset indices of this process's share of batch ``step_in_epoch`` of epoch ``epoch`` (the
        images ``epoch`` yields there)."""
        return self.rank_indices(self.epoch_permutation(epoch), step_in_epoch)

    def epoch_permutation(self, epoch: int) -> torch.Tensor:
        """``permutation(epoch)``, drawn once per epoch for ``epoch`` and ``batch_indices`` both."""
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, self.permutation(epoch))
        return self._perm[1]

    def _fetch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ds = self.ds
        if getattr(ds, "images", None) is not None:
            return ds.images[idx], ds.labels[idx]
        return ds.get_batch(idx)  # a list of images of different sizes when the set has a short_side

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """Yield (step_in_epoch, uint8 images, int64 labels) of this process's share of each global
        batch, from batch ``start`` to the end of epoch ``epoch``."""
        perm = self.epoch_permutation(epoch)
        steps = range(start, self.steps_per_epoch)
        if not getattr(self.ds, "in_memory", True) and self.workers > 0:
            yield from self._streamed(perm, steps)
            return
        for s in steps:
            x, y = self._fetch(self.rank_indices(perm, s))
            yield s, x, y

    def _streamed(self, perm, steps):
        # decode in worker processes through the dataset view, in exactly this order
        from torch.utils.data import DataLoader

        batches = [self.rank_indices(perm, s).tolist() for s in steps]
        collate = _collate_list if getattr(self.ds, "short_side", None) else _collate
        dl = DataLoader(self.ds.as_dataset(), batch_sampler=batches, num_workers=self.workers,
                        collate_fn=collate, persistent_workers=False)
        for s, (x, y) in zip(steps, dl):
            yield s, x, y


def _collate(items):
    xs, ys = zip(*items)
    return torch.stack(xs), torch.as_tensor(ys, dtype=torch.int64)


def _collate_list(items):
    xs, ys = zip(*items)
    return list(xs), torch.as_tensor(ys, dtype=torch.int64)


def micro_batches(x: torch.Tensor, y: torch.Tensor, accum_steps: int):
    """Split a process's batch into ``accum_steps`` equal micro-batches."""
    if accum_steps == 1:
        return [(x, y)]
    return list(zip(x.chunk(accum_steps), y.chunk(accum_steps)))


__all__ = ["BatchLoader", "check_batches", "loader_workers", "micro_batches", "epoch_seed", "MAX_WORKERS"]
