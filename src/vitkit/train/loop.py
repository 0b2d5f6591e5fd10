"""``train``: one run from a RunConfig, start to end.

    resume point (--resume) -> the model's config, resolved once (init_from weights read once; none when
      resuming: the checkpoint has the model) -> data -> model -> its path (runtime.training_path: precision,
      channels-last) -> Trainer
      -> fit: epochs until they or the time budget are spent, or a stop is requested
      -> completed: last/, final validation (best/), test, summary | interrupted: last/, how to continue

Its parts: ``build`` (config, data, model), ``trainer`` (steps, validation, checkpoints), ``state``,
``ema``, ``metrics``, ``checkpoint`` (atomic saves, the run directory's lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..core.errors import ConfigError, TrainingError
from ..core.hardware import resolve_device
from ..core.progress import Progress
from ..infer.fastpath import FastPath
from ..infer.paths import pick_precision, training_path
from ..io.atomic import ensure_dir, removed_if_left_empty
from .build import check_classes, check_run_dir, check_views, foreign_init, model_config, open_data, prepare_model
from .checkpoint import RunLock, checkpoint_step, cleanup_temp, find_checkpoint, resume_point
from .config import RunConfig
from .distributed import DistInfo, all_gather_object, barrier, broadcast_object, process_group
from .metrics import check_loggers
from .replay import Plan, read_plan
from .speed import machine_key, record_reached
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
    cache_dir: str | Path | None = None,
    path: FastPath | None = None,
    loggers: Sequence = (),
    init: tuple | None = None,
) -> dict:
    """Train as ``cfg`` says, writing the run directory; return a summary dict.

    ``splits``: a ready DataSplits (else opened from cfg.data). ``stop``: polled every step; when it
    returns True the run saves last/ and returns with status 'interrupted'. ``resume``: continue from
    run_dir/last. ``progress``: where the main process shows the decoding of the data and the steps
    (default: nowhere). ``cache_dir``: where decoded image folders are cached (``data.cache``; None = no
    cache). The summary records the seconds spent loading the data (``data_seconds``), whether the
    cache served them (``data_cache``) and the path the run took (``fast_path``: precision, compile,
    channels-last, and why; also its second line): ``path`` as resolved with the run
    (``train.resolve.resolve_run``), else as ``cfg`` settles it here. ``loggers``: logger objects besides the
    config's named loggers (``vitkit.train.metrics.ObjectLog``: ``log_metrics(metrics, step)``, optional
    ``log_hparams``, ``close``). ``init``: the timm, HF or JAX ``init_from`` weights as the run's resolution
    read them (``train.build.foreign_init``), so that they are not read again. Errors are VitkitError
    subclasses with one-line messages.
    """
    cfg = ran_with(cfg.validate(), dist)
    check_loggers(cfg.loggers)
    run_dir = Path(run_dir)
    say = main_log(log, dist)
    progress = progress if progress is not None and dist.is_main else Progress()
    device = resolve_device(cfg.device, local_rank=dist.local_rank)
    pick_precision(cfg.precision, device)  # an error before the run directory is made
    with (process_group(dist, device, alone=cfg.strategy == "fsdp"), _hold(run_dir, resume, dist),
          contextlib.ExitStack() as scratch):
        # The run's model, trainer and data live in _run's frame alone, so they are gone before the group
        # ends: DDP's reducer holds the group, and the last holder of a gloo group joins its worker threads,
        # which a reducer does while holding the GIL that those threads may be waiting for.
        summary = _run(cfg, run_dir, dist, device, resume, splits, scratch, progress, stop, log, say, cache_dir,
                       path, loggers, init)
        barrier(dist)  # all ranks end together: none tears its process group down while rank 0 still writes
        return summary


def _run(cfg: RunConfig, run_dir: Path, dist: DistInfo, device: torch.device, resume: bool, splits,
         scratch: contextlib.ExitStack, progress: Progress, stop, log, say, cache_dir, path: FastPath | None,
         loggers=(), init=None) -> dict:
    """``train``'s work inside its process group and the run directory's lock: the summary."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    cfg = main_config(cfg, dist, device)
    resume_from, saved = start_point(run_dir, resume, dist, scratch)
    if saved is not None and dist.is_main:
        cleanup_temp(run_dir)
    if init is None or dist.enabled or resume_from is not None:  # each rank reads what rank 0's config names
        init = foreign_init(cfg, resume_from)  # foreign init_from weights, read once for the config and model
    mcfg = model_config(cfg, init, resume_from)
    check_views(cfg, mcfg)
    loaded = None
    if splits is None:
        splits, loaded = load_data(cfg, mcfg, say, progress, cache_dir, dist)
        cfg = held_out_recorded(cfg, splits)
    classes = check_classes(splits, run_dir, saved["classes"] if saved is not None else None, say)
    model = prepare_model(cfg, mcfg, classes, splits.train, resume_from, say, init)
    if loaded is not None and (loaded["data_cache"] != "off" or loaded["data_seconds"] >= 1):
        say(loaded_line(splits, loaded, cache_dir))  # when it took a while, or the cache was involved
    cfg = mirror_checked(cfg, splits.train, say, dist)
    if path is None or dist.enabled:  # each rank's own device; rank 0's config (main_config)
        path = run_path(cfg, mcfg, device, len(splits.train))
    parts = dict(val_set=splits.val, test_set=splits.test, dist=dist, device=device, precision=path.precision,
                 channels_last=path.channels_last, log=log, stop=stop, progress=progress, loggers=loggers)
    if cfg.tune == "probe":  # the head alone, on the backbone's features computed once (train/probe.py)
        from .probe import probe_trainer

        trainer = probe_trainer(cfg, model, splits, run_dir, cache_dir, started=t_start, **parts)
    else:
        trainer = Trainer(cfg, model, splits.train, run_dir, **parts)
    trainer.session_start = t_start  # the segment's wall-clock counts from its start, data loading included
    with contextlib.closing(trainer):
        if cfg.replay and saved is None:
            trainer.follow(replay_plan(cfg.replay, dist))
        if saved is not None:
            trainer.restore(saved)
        trainer.open_run(resumed=saved is not None)
        noted = {**(loaded or {}), "fast_path": path.describe(), "machine": machine_key(device)}  # for the summary
        say(f"path: {noted['fast_path']}")
        if trainer.fit() == "interrupted":
            summary = {**trainer.interrupt(), **noted}
        else:
            summary = {**trainer.complete(splits.test), **noted}
            summary["total_seconds"] = round(trainer.wall_seconds(), 2)  # every segment, as train_seconds
            summary["cpu_seconds"] = round(time.process_time() - cpu_start, 1)  # this process, all threads
            trainer.write_summary(summary)
            if dist.is_main and cfg.expected_epochs and cfg.max_minutes and not (resume or cfg.replay) \
                    and summary["epochs"] < cfg.epochs:  # the clock ended it: the share it reached, for later runs
                record_reached(cache_dir, device, cfg.processes, cfg.expected_epochs, summary["epochs"])
    return summary


def replay_plan(run: str, dist: DistInfo) -> Plan:
    """The steps run directory ``run`` recorded (``replay.read_plan``), as rank 0 reads them, on every rank."""
    plan = broadcast_object(read_plan(run) if dist.is_main else None, dist)  # an error on rank 0 stops the others
    if plan is None:
        raise ConfigError(f"replay: {run} records no steps to replay (no last/ checkpoint with its schedule)")
    return plan


def run_path(cfg: RunConfig, mcfg, device: torch.device, images: int) -> FastPath:
    """The path a run of ``images`` training images takes (``runtime.training_path``): 'auto' weighs the
    model's size (precision) and its stem (channels-last); FSDP trains contiguous."""
    return training_path(mcfg, device, cfg.precision, cfg.compile, cfg.channels_last, cfg.epochs * images,
                         sharded=cfg.strategy == "fsdp")


def load_data(cfg: RunConfig, mcfg, say: Callable[[str], None], progress: Progress, cache_dir,
              dist: DistInfo = DistInfo()) -> tuple:
    """The run's data (``build.open_data``; the processes of a distributed run: ``open_shared``), and for the
    summary how long loading it took and whether the decoded-image cache served it ('hit', 'miss' or 'off')."""
    t0 = time.perf_counter()
    if dist.enabled and cache_dir is not None:
        splits = open_shared(cfg, mcfg, say, progress, cache_dir, dist)
    else:
        splits = open_data(cfg, mcfg, say, progress, cache_dir)
    for note in splits.cache_notes:
        say(f"warning: {note}")
    return splits, {"data_seconds": round(time.perf_counter() - t0, 2), "data_cache": splits.cache}


def open_shared(cfg: RunConfig, mcfg, say: Callable[[str], None], progress: Progress, cache_dir,
                dist: DistInfo):
    """A distributed run's data, decoded once a machine: the first process of each machine (local rank 0; on the
    first machine, the one that shows the decoding) opens the data, reading the decoded-image cache or
    decoding what it lacks and storing it, while the others read what the cache holds, side by side; where it
    lacked a part, they open the data once the first is done, reading what it stored (or, where it could not
    store it, decoding for themselves). A failure to open the data on one process is a one-line error on all
    of them, not a wait."""
    from ..core.errors import DataError, VitkitError
    from ..data.cache import CacheMiss

    splits, failed = None, None
    try:
        splits = open_data(cfg, mcfg, say, progress, cache_dir, cached_only=dist.local_rank != 0)
    except CacheMiss:
        pass
    except VitkitError as e:
        failed = e
    errors = [e for e in all_gather_object(None if failed is None else str(failed), dist) if e is not None]
    if failed is not None:
        raise failed
    if errors:
        raise DataError(errors[0])
    return splits if splits is not None else open_data(cfg, mcfg, say, progress, cache_dir)


def held_out_recorded(cfg: RunConfig, splits) -> RunConfig:
    """``cfg`` with data.val_fraction the share of the training images the run held out for validation (the
    carve a run makes of data with neither a validation nor a test part), so that config.json says so and
    replays the same carve."""
    if not splits.held_out or splits.held_out == cfg.data.val_fraction:
        return cfg
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, val_fraction=splits.held_out))


def mirror_checked(cfg: RunConfig, images, say: Callable[[str], None], dist: DistInfo = DistInfo()) -> RunConfig:
    """``cfg`` as the mirror check leaves it (augment.mirror_check; ``data.mirror``): where mirroring the training
    ``images`` changes their class, with no flips in training (augment.hflip 0) and test-time views without
    mirror images (tta_flip false), so that config.json says so; a line saying what the check found. Rank 0
    checks, and every rank takes its answer. Fewer than ``data.mirror.MIN_IMAGES`` images are too few to tell:
    the flips are kept, unsaid; a linear probe (tune 'probe') trains on features of the images unflipped, and
    checks nothing."""
    from ..data.mirror import MIN_IMAGES, mirror_check

    flips = cfg.augment.hflip > 0 or (cfg.tta and cfg.tta_flip)
    if not cfg.augment.mirror_check or not flips or len(images) < MIN_IMAGES or cfg.tune == "probe":
        return cfg

    found = broadcast_object(mirror_check(images, cfg.seed) if dist.is_main else None, dist)
    if not found.refuses:
        say(f"mirror check: flips kept: {found.describe()}")
        return cfg
    say(f"mirror check: mirroring changes the class, so no flips in training or in the test-time views: "
        f"{found.describe()}")
    return dataclasses.replace(cfg, augment=dataclasses.replace(cfg.augment, hflip=0.0), tta_flip=False)


def loaded_line(splits, loaded: dict, cache_dir) -> str:
    """'data loaded in 0.4 s (from the cache in DIR): <the data's summary>'."""
    how = {"hit": f"from the cache in {cache_dir}", "miss": f"decoded, cached in {cache_dir}",
           "shared": f"decoded by another process meanwhile, cached in {cache_dir}",
           "miss, not cached": f"decoded, not cached in {cache_dir}"}.get(loaded["data_cache"])
    return f"data loaded in {loaded['data_seconds']:.1f} s" + (f" ({how})" if how else "") + f": {splits.summary()}"


def main_config(cfg: RunConfig, dist: DistInfo, device: torch.device) -> RunConfig:
    """Rank 0's config on every rank, with this process's own CPU threads. A rank on another machine
    may lack the resumed run's config.json (only rank 0 writes the run directory): it starts with the
    command line's values alone, and takes the run's here. The device it joined the group with must be
    of the run's type."""
    if not dist.enabled:
        return cfg
    run = dataclasses.replace(broadcast_object(cfg, dist), threads=cfg.threads)
    if (kind := resolve_device(run.device, local_rank=dist.local_rank).type) != device.type:
        raise TrainingError(f"device: rank {dist.rank} started on {device.type}, but the run trains on {kind}; "
                            f"give every machine the same --device")
    return run


def start_point(run_dir: Path, resume: bool, dist: DistInfo,
                scratch: contextlib.ExitStack) -> tuple[Path | None, dict | None]:
    """The checkpoint a run continues from and its trainer state ((None, None): a new run): rank 0's, on
    every rank, as rank 0 decides. Only rank 0 writes the run directory, so on several machines the
    others see its checkpoint only where the machines share it. A rank that does not (none there, or
    one of another step) gets its files from rank 0 over the process group, into a temporary folder
    that ``scratch`` removes when the run ends; when every rank sees it, nothing is sent."""
    resume = broadcast_object(resume, dist)
    if not resume:
        return None, None
    if dist.is_main:
        resume_from, saved = resume_point(run_dir)  # an error here is the run's: the others are stopped
    mine = find_checkpoint(run_dir, "last")
    steps = all_gather_object(None if mine is None else checkpoint_step(mine), dist)
    if any(step != steps[0] for step in steps):
        files = broadcast_object(_checkpoint_files(resume_from) if dist.is_main else None, dist)
        if steps[dist.rank] != steps[0]:
            run_dir = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="vitkit-resume-")))
            _write_checkpoint_files(files, run_dir / "last")
    return (resume_from, saved) if dist.is_main else resume_point(run_dir)


def _checkpoint_files(ckpt_dir: Path) -> dict[str, bytes]:
    """The files of a checkpoint folder, by name, to send to the ranks that do not see them."""
    return {p.name: p.read_bytes() for p in sorted(Path(ckpt_dir).iterdir()) if p.is_file()}


def _write_checkpoint_files(files: dict[str, bytes], ckpt_dir: Path) -> None:
    ckpt_dir.mkdir(parents=True)
    for name, data in files.items():
        (ckpt_dir / Path(name).name).write_bytes(data)


def ran_with(cfg: RunConfig, dist: DistInfo) -> RunConfig:
    """``cfg`` as this run executes it, to record in its config.json: the CPU threads (``cfg.threads``, set
    here; else torch's current number) and the processes. The same values replay the run exactly."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return dataclasses.replace(cfg, threads=torch.get_num_threads(),
                               processes=dist.world_size if dist.enabled else cfg.processes)


@contextlib.contextmanager
def _hold(run_dir: Path, resume: bool, dist: DistInfo):
    """The main process checks and creates the run directory, and holds its lock while the run lasts. A
    folder it created and a failed run left empty is removed, so that a failure leaves nothing behind."""
    lock = RunLock(run_dir)
    with removed_if_left_empty(run_dir) if dist.is_main else contextlib.nullcontext():
        if dist.is_main:
            check_run_dir(run_dir, resume)
            ensure_dir(run_dir)  # a file in the way: one line naming it
            lock.acquire()
        try:
            yield
        finally:
            lock.release()


__all__ = ["train", "replay_plan", "run_path", "main_config", "start_point", "ran_with"]
