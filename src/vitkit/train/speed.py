"""How fast this machine trains a model: the images per second of its training step, measured before a run
that the clock bounds, so that a budget in minutes becomes a budget in epochs (``recipe.choose_by_work``).

``measure_speed`` runs a few real training steps (the run's augmentation, forward, backward, clipping and
optimizer, on random images of the run's size) as one of the run's processes would: its share of the batch,
its threads, its precision and memory layout, on its device. The run's processes share the machine's cores,
each on its own, so together they train ``processes`` times one process's images per second. A measurement
is kept in the cache folder (``speed.json``) when the CPU was quiet while it ran, keyed by the machine (CPU model and instruction set, or GPU,
and the torch build) and by everything in the run that sets a step's cost, so that the next run of the same
model on the same machine starts without measuring again.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import stat
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.errors import VitkitError
from ..core.hardware import cpu_bf16_kind, cpu_capability, load_average, usable_cpus
from ..data import ImageSet
from ..io.atomic import atomic_write_text
from .config import RunConfig

SPEED_FILE = "speed.json"  # in the cache folder: machine and run -> images per second
WARMUP_STEPS = 2  # steps before the clock starts: the first allocations, the optimizer's state
MIN_STEPS, MAX_STEPS, MIN_SECONDS = 3, 20, 1.0  # timed steps: at least MIN_STEPS, until MIN_SECONDS have passed
MAX_ENTRIES = 200  # measurements the cache file keeps (the newest)
# The epochs a run expects from its measured speed are more than it reaches: its processes share the machine and
# wait on each other (the measurement times one alone), and loading the data and starting the processes take
# time the count leaves out (on a 2-core AVX2 CPU mostly 0.8-0.9 of the expected epochs, 0.71-1.07 in all: the runs
# of docs/experiments.md, "On a 2-core AVX2-only Zen 3"). A finished run bounded by
# the clock keeps the share it reached; later runs of as many processes on the machine scale their count by the
# median of the recent ones (train/resolve.py), for every candidate alike. Where none is recorded, a CPU run of two or
# more processes counts at FIRST_SHARE: the median share that such runs reached as the first run on their machine (an
# empty cache folder): set from 20 runs on three CPU kinds, 0.63-1.10 (benchmarks/results/time_to_accuracy.jsonl; a
# test recomputes the median over every such record, and the two runs counted at it since reached 0.81 and 0.82).
# One process has no pair to wait on, and a GPU run had one record: those count at 1.
FIRST_SHARE = 0.82
RUNS_FILE = "runs.json"  # in the cache folder: machine and processes -> the shares of their expected epochs reached
RUN_SHARES = 5  # the recent shares kept for each
MIN_SHARE, MAX_SHARE = 0.25, 2.0  # a share outside these is a run stopped short or given more time: not kept


@dataclass(frozen=True)
class Speed:
    """A run's measured training speed: ``images_per_s`` of all its processes together, the seconds the
    measurement cost (0 when the cache had it) and whether it came from the cache."""

    images_per_s: float
    seconds: float = 0.0
    cached: bool = False


def machine_key(device: torch.device) -> str:
    """What a speed is a speed of, as far as the machine goes: the CPU's model and instruction set (or the
    GPU's name) and the torch build."""
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{cpu_model()} {cpu_capability()} {cpu_bf16_kind()}"
    return f"{device.type}: {where}; torch {torch.__version__}"


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_key(cfg: RunConfig, img_size: tuple[int, int], threads: int) -> str:
    """What a speed is a speed of, as far as the run goes: the values that set a step's cost."""
    parts = {"model": cfg.model, "model_args": cfg.model_args, "img_size": list(img_size), "batch": cfg.batch_size,
             "processes": cfg.processes, "threads": threads, "precision": cfg.precision,
             "channels_last": cfg.channels_last, "optim": [cfg.optim.name, cfg.optim.muon_convs],
             "ema": cfg.ema is not None, "augment": cfg.augment.crop, "accum": cfg.accum_steps}
    if cfg.augment.low_size:  # progressive resizing: a part of the time at another size
        parts["low"] = [cfg.augment.low_size, cfg.augment.low_share]
    return json.dumps(parts, sort_keys=True, default=str)


def speed_key(cfg: RunConfig, mcfg, device: torch.device, threads: int) -> str:
    """What a measured speed is a speed of: the machine (``machine_key``) and the run (``run_key``). Runs of
    one key cost the same a step, whatever else differs (a learning rate, say)."""
    return f"{machine_key(device)} | {run_key(cfg, mcfg.img_size, threads)}"


def measure_speed(cfg: RunConfig, mcfg, device: torch.device, threads: int, cache_dir: str | os.PathLike | None = None,
                  num_classes: int = 10) -> Speed:
    """The training speed of a run of ``cfg`` (its precision and channels-last settled) training the model
    ``mcfg`` on ``device``, each of its ``cfg.processes`` processes on ``threads`` threads: from the cache
    folder's ``speed.json`` when it holds this machine and run, else measured (and stored there)."""
    key = speed_key(cfg, mcfg, device, threads)
    cache = Path(cache_dir) / SPEED_FILE if cache_dir is not None else None
    known = read_speeds(cache).get(key) if cache is not None else None
    if known is not None:
        return Speed(float(known["images_per_s"]), 0.0, True)
    quiet = machine_quiet()
    start = time.perf_counter()
    if cfg.augment.low_size:  # the steps at each size, timed apart
        one = progressive_speed(cfg.augment.low_share,
                                process_speed(low_sized(cfg, 0.0), mcfg, device, threads, num_classes),
                                process_speed(low_sized(cfg, 1.0), mcfg, device, threads, num_classes))
    else:
        one = process_speed(cfg, mcfg, device, threads, num_classes)
    speed = Speed(one * max(cfg.processes, 1), time.perf_counter() - start, False)
    if cache is not None and (quiet or device.type != "cpu"):
        store_speed(cache, key, speed.images_per_s)  # a busy CPU's figure serves this run only
    return speed


def low_sized(cfg: RunConfig, share: float) -> RunConfig:
    """``cfg`` training ``share`` of its steps at augment.low_size (0: none, at its own size; 1: all)."""
    low = {"low_size": cfg.augment.low_size if share else 0, "low_share": share}
    return RunConfig.from_dict({**cfg.to_dict(), "augment": {**cfg.augment.to_dict(), **low}})


def progressive_speed(share: float, full: float, low: float) -> float:
    """The images per second of a run the clock bounds that trains the first ``share`` of its time at ``low``
    images per second and the rest at ``full``: the mean of the two, weighted by the time at each."""
    return share * low + (1.0 - share) * full


def machine_quiet() -> bool:
    """Whether the CPU is quiet enough for its speed to be kept for later runs: a 1-minute load average
    under half its usable cores (other work steals the cores a run's processes would have)."""
    return load_average() < 0.5 * usable_cpus()


def process_speed(cfg: RunConfig, mcfg, device: torch.device, threads: int, num_classes: int,
                  dist=None, steps: int | None = None) -> float:
    """Images per second of one process's training steps (its share of the batch) on ``threads`` threads.
    ``dist``: the steps of one rank of that many processes training together (DDP; the caller started
    their process group), where the measurement is a process alone. ``steps``: exactly that many timed
    steps (as all of a group's ranks must take), where the measurement takes MIN_STEPS to MAX_STEPS."""
    from .build import build_model
    from .distributed import DistInfo
    from .trainer import Trainer

    dist = dist or DistInfo()
    per_process = max(cfg.batch_size // max(cfg.processes, 1), 1)
    step_cfg = RunConfig.from_dict({**cfg.to_dict(), "batch_size": per_process * dist.world_size,
                                    "processes": dist.world_size, "loggers": [], "max_minutes": None, "epochs": 1,
                                    "ema": cfg.ema, "init_from": None,
                                    "tune": "full"})  # a fine-tune's model, its weights unread: the same cost
    classes = [str(i) for i in range(max(num_classes, 2))]
    images = random_set(per_process, classes, mcfg.in_chans, mcfg.img_size)
    data = images if not dist.enabled else random_set(per_process * dist.world_size, classes, mcfg.in_chans,
                                                      mcfg.img_size)  # a batch for every rank to shard
    old_threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 1))
    try:
        with torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory(prefix="vitkit-speed-") as tmp:
            model = build_model(step_cfg, mcfg, classes)
            trainer = Trainer(step_cfg, model, data, tmp, dist=dist, device=device, precision=cfg.precision,
                              channels_last=cfg.channels_last, log=lambda m: None)
            with contextlib.closing(trainer):
                return timed_steps(trainer, images, per_process, device, steps)
    finally:
        torch.set_num_threads(old_threads)


def timed_steps(trainer, images: ImageSet, batch: int, device: torch.device, steps: int | None = None) -> float:
    """Images per second of ``trainer``'s steps on the batch ``images`` (after WARMUP_STEPS untimed ones):
    MIN_STEPS to MAX_STEPS of them, until MIN_SECONDS have passed, or exactly ``steps``."""
    step = (images.images, images.labels)
    done, start = 0, 0.0
    for i in range(WARMUP_STEPS + (MAX_STEPS if steps is None else steps)):
        if i == WARMUP_STEPS:
            sync(device)
            start = time.perf_counter()
        trainer.train_step(step)
        trainer.optimizer_step()
        if i >= WARMUP_STEPS:
            done += 1
            if steps is None and done >= MIN_STEPS and time.perf_counter() - start >= MIN_SECONDS:
                break
    sync(device)
    return done * batch / max(time.perf_counter() - start, 1e-9)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_set(n: int, classes: list[str], channels: int, size: tuple[int, int]) -> ImageSet:
    """``n`` random uint8 images of ``size``, labels cycling through ``classes``: what a step's cost needs."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, channels, *size), generator=g, dtype=torch.uint8)
    labels = torch.arange(n) % len(classes)
    return ImageSet(labels=labels, classes=classes, images=images, paths=None, size=tuple(size), channels=channels)


def read_speeds(file: Path) -> dict:
    """The measurements in ``file`` (key -> {"images_per_s", "when"}); {} where it is missing, not a regular
    file or not such a JSON object (it is then measured again and rewritten)."""
    data = _json_object(file)
    return {k: v for k, v in data.items() if isinstance(v, dict) and _positive(v.get("images_per_s"))}


def _json_object(file: Path) -> dict:
    """The JSON object in the cache file ``file``; {} where it is missing, not a regular file or not an object."""
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):
            return {}
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")


def store_speed(file: Path, key: str, images_per_s: float) -> None:
    """Add a measurement to ``file`` (atomically; the oldest dropped past MAX_ENTRIES). A cache folder that
    cannot be written is no error: the next run measures again."""
    speeds = read_speeds(file)
    speeds[key] = {"images_per_s": round(images_per_s, 2), "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    kept = dict(sorted(speeds.items(), key=lambda kv: kv[1].get("when", ""))[-MAX_ENTRIES:])
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(file, json.dumps(kept, indent=1, sort_keys=True))
    except (OSError, VitkitError):
        pass


def layout_key(device: torch.device, processes: int) -> str:
    """What a reached share is a share of: the machine (``machine_key``) and the run's processes on it."""
    return f"{machine_key(device)} | {max(processes, 1)} process(es)"


def reached_share(cache_dir: str | os.PathLike | None, device: torch.device, processes: int) -> tuple[float, int] | None:
    """(the median share of their expected epochs that the last runs here reached, how many runs): what a run of
    ``processes`` processes on ``device`` scales its expected epochs by. Where no run has recorded one: (FIRST_SHARE,
    0) for two or more processes on a CPU, else None."""
    runs = {} if cache_dir is None else _read_runs(Path(cache_dir) / RUNS_FILE)
    shares = runs.get(layout_key(device, processes), [])
    if shares:
        return statistics.median(shares), len(shares)
    return (FIRST_SHARE, 0) if device.type == "cpu" and processes > 1 else None


def record_reached(cache_dir: str | os.PathLike | None, device: torch.device, processes: int, expected: float,
                   reached: float) -> None:
    """Keep the share of ``expected`` epochs that a finished run reached (the last RUN_SHARES of each machine and
    processes, written atomically; one outside MIN_SHARE..MAX_SHARE, a run stopped by something else, is not kept).
    A cache folder that cannot be written is no error."""
    if cache_dir is None or not _positive(expected) or not _positive(reached):
        return
    share = reached / expected
    if not MIN_SHARE <= share <= MAX_SHARE:
        return
    file = Path(cache_dir) / RUNS_FILE
    runs = _read_runs(file)
    key = layout_key(device, processes)
    runs[key] = (runs.get(key, []) + [round(share, 4)])[-RUN_SHARES:]
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(file, json.dumps(runs, indent=1, sort_keys=True))
    except (OSError, VitkitError):
        pass


def share_words(share: tuple[float, int]) -> str:
    """How a line says that it counts epochs at ``share`` ((the share, how many runs), ``reached_share``)."""
    value, runs = share
    if runs == 0:
        return (f"at {value:.2f}x, the median share of their expected epochs that runs of several processes reached "
                "as the first run on their CPU (none recorded here yet)")
    if runs == 1:
        return f"at {value:.2f}x, the share of its expected epochs that the last run here reached"
    return f"at {value:.2f}x, the median share of their expected epochs that the last {runs} runs here reached"


def _read_runs(file: Path) -> dict[str, list[float]]:
    """``RUNS_FILE``'s shares (layout -> the recent ones); {} where it is missing or not such a JSON object, and
    a layout's entry left out where it is not a list of shares in range."""
    return {k: v[-RUN_SHARES:] for k, v in _json_object(file).items()
            if isinstance(v, list) and v and all(_positive(x) and MIN_SHARE <= x <= MAX_SHARE for x in v)}


__all__ = ["Speed", "measure_speed", "machine_key", "run_key", "speed_key", "read_speeds", "store_speed", "SPEED_FILE",
           "RUNS_FILE", "FIRST_SHARE", "layout_key", "reached_share", "record_reached", "share_words"]
