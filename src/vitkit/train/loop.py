"""``train``: one run from a RunConfig, start to end.

    resume point (--resume) -> the model's config, resolved once (init_from weights read once; none when
      resuming: the checkpoint has the model) -> data -> model -> Trainer
      -> fit: epochs until they or the time budget are spent, or a stop is requested
      -> completed: last/, final validation (best/), test, summary | interrupted: last/, how to continue

Its parts: ``build`` (config, data, model), ``trainer`` (steps, validation, checkpoints), ``state``,
``ema``, ``metrics``, ``checkpoint`` (atomic saves, the run directory's lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Callable

import torch

from ..fastpath import vit_flops
from ..io.atomic import ensure_dir
from ..progress import Progress
from ..runtime import pick_precision, resolve_device
from .build import check_classes, check_run_dir, init_format, model_config, open_data, prepare_model, read_init
from .checkpoint import RunLock, cleanup_temp, resume_point
from .config import RunConfig
from .distributed import DistInfo, barrier, process_group
from .metrics import check_loggers
from .trainer import Trainer, main_log


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    dist: DistInfo = DistInfo(),
    resume: bool = False,
    splits=None,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Train as ``cfg`` says, writing the run directory; return a summary dict.

    ``splits``: a ready DataSplits (else opened from cfg.data). ``stop``: polled every step; when it
    returns True the run saves last/ and returns with status 'interrupted'. ``resume``: continue from
    run_dir/last. ``progress``: where the main process shows the decoding of the data and the steps
    (default: nowhere). Errors are VitkitError subclasses with one-line messages.
    """
    cfg = ran_with(cfg.validate(), dist)
    check_loggers(cfg.loggers)
    run_dir = Path(run_dir)
    say = main_log(log, dist)
    progress = progress if progress is not None and dist.is_main else Progress()
    device = resolve_device(cfg.device, local_rank=dist.local_rank)
    with process_group(dist, device), _hold(run_dir, resume, dist):
        t_start, cpu_start = time.perf_counter(), time.process_time()
        resume_from, saved = resume_point(run_dir) if resume else (None, None)
        if saved is not None and dist.is_main:
            cleanup_temp(run_dir)
        init = None  # foreign init_from weights, read once for the model's config and the model
        if cfg.init_from and resume_from is None and (fmt := init_format(cfg)) != "vitkit":
            init = read_init(cfg, fmt)
        mcfg = model_config(cfg, init, resume_from)
        precision = pick_precision(cfg.precision, device, vit_flops(mcfg))  # 'auto' weighs the model's size
        if splits is None:
            splits = open_data(cfg, mcfg, say, progress)
        classes = check_classes(splits, run_dir, saved["classes"] if saved is not None else None, say)
        model = prepare_model(cfg, mcfg, classes, splits.train, resume_from, say, init)
        trainer = Trainer(cfg, model, splits.train, run_dir, val_set=splits.val, dist=dist, device=device,
                          precision=precision, log=log, stop=stop, progress=progress)
        with contextlib.closing(trainer):
            if saved is not None:
                trainer.restore(saved)
            trainer.open_run(resumed=saved is not None)
            if trainer.fit() == "interrupted":
                summary = trainer.interrupt()
            else:
                summary = trainer.complete(splits.test)
                summary["total_seconds"] = round(time.perf_counter() - t_start, 2)
                summary["cpu_seconds"] = round(time.process_time() - cpu_start, 1)  # this process, all threads
                trainer.write_summary(summary)
        barrier(dist)  # all ranks end together: none tears its process group down while rank 0 still writes
        return summary


def ran_with(cfg: RunConfig, dist: DistInfo) -> RunConfig:
    """``cfg`` as this run executes it, to record in its config.json: the CPU threads (``cfg.threads``, set
    here; else torch's current number) and the processes. The same values replay the run exactly."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return dataclasses.replace(cfg, threads=torch.get_num_threads(),
                               processes=dist.world_size if dist.enabled else cfg.processes)


@contextlib.contextmanager
def _hold(run_dir: Path, resume: bool, dist: DistInfo):
    """The main process checks and creates the run directory, and holds its lock while the run lasts."""
    lock = RunLock(run_dir)
    if dist.is_main:
        check_run_dir(run_dir, resume)
        ensure_dir(run_dir)  # a file in the way: one line naming it
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


__all__ = ["train", "ran_with"]
