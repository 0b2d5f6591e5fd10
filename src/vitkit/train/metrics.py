"""The training log: ``metrics.jsonl`` (one JSON record per line), the loggers that copy it into other
formats, and the plots drawn from it.

Records, by ``type``:

- ``step``: every ``log_every`` optimizer steps, the mean loss and train accuracy since the last one,
  the learning rate and the speed;
- ``epoch``: at the end of each epoch;
- ``eval``: each validation;
- ``final``: the run's summary, last.

``MetricsLog`` writes every record to metrics.jsonl and hands it to each logger the run asked for
(``RunConfig.loggers``), from one place:

- ``csv``: metrics.csv, one row per step record (split 'train') and per evaluation (split 'val'),
  under fixed columns (``CSV_COLUMNS``);
- ``tensorboard``: an event file in the run directory (``tensorboard --logdir runs/`` shows each run
  by its directory's name) with the scalars of ``scalars``; needs the tensorboard package;
- ``wandb``: an offline Weights & Biases run under run_dir/wandb (``wandb sync`` uploads it); needs wandb.

Only the main process writes. A resumed run first drops the records written after its checkpoint
(metrics.jsonl and metrics.csv are trimmed, TensorBoard is told to purge the later steps), so the
log has neither gaps nor duplicates.
"""

from __future__ import annotations

import csv
import errno
import importlib.util
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..core.errors import ConfigError, TrainingError
from ..io.atomic import atomic_path, atomic_write_text


def _write_error(file: Path, e: OSError) -> TrainingError:
    # a full disk: one line (the checkpoints are written atomically and stay intact)
    why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or type(e).__name__)
    return TrainingError(f"{file}: could not write the training log ({why})")


class Logger:
    """A copy of the training log in another format. ``open(step)`` starts it (a resumed run at
    ``step`` first drops what was logged after it), ``write`` takes each record, ``close`` ends it."""

    def open(self, step: int) -> None:
        pass

    def write(self, rec: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class MetricsLog:
    """Appends records to ``file`` and hands them to ``loggers``; does nothing where ``enabled`` is False
    (the other processes)."""

    def __init__(self, file: Path, enabled: bool = True, loggers: Sequence[Logger] = ()):
        self.file = Path(file)
        self.enabled = enabled
        self.loggers = list(loggers) if enabled else []

    def open(self, step: int) -> None:
        """Start the log of a run at ``step``: trim metrics.jsonl to it and open the loggers."""
        self.trim(step)
        for logger in self.loggers:
            logger.open(step)

    def append(self, rec: dict) -> None:
        if not self.enabled:
            return
        try:
            with open(self.file, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:
            raise _write_error(self.file, e) from None
        for logger in self.loggers:
            logger.write(rec)

    def trim(self, step: int) -> None:
        """Drop the records written after step ``step`` and any final record (they will be written again)."""
        if not self.enabled or not self.file.exists():
            return
        keep = []
        for line in self.file.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("step", 0) <= step and rec.get("type") != "final":
                keep.append(line)
        atomic_write_text(self.file, "".join(line + "\n" for line in keep))

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


# ============================================================================================ loggers
CSV_COLUMNS = ("type", "step", "epoch", "seconds", "split", "loss", "acc", "lr", "img_per_s")


def csv_row(rec: dict) -> dict | None:
    """The metrics.csv row of a record: step records as split 'train' (their train accuracy as acc),
    evaluations as their split; None for the other records."""
    if rec.get("type") == "step":
        return {**{k: rec.get(k, "") for k in CSV_COLUMNS}, "split": "train", "acc": rec["train_acc"]}
    if rec.get("type") == "eval":
        return {k: rec.get(k, "") for k in CSV_COLUMNS}
    return None


class CsvLog(Logger):
    """metrics.csv in the run directory, under ``CSV_COLUMNS``."""

    def __init__(self, run_dir: Path):
        self.file = Path(run_dir) / "metrics.csv"

    def open(self, step: int) -> None:
        rows = []
        if self.file.exists():  # a resumed run: keep the rows up to its step
            with open(self.file, newline="", encoding="utf-8") as f:
                rows = [r for r in csv.DictReader(f) if r.get("step", "").isdigit() and int(r["step"]) <= step]
        with atomic_path(self.file) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            out = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
            out.writeheader()
            out.writerows(rows)

    def write(self, rec: dict) -> None:
        row = csv_row(rec)
        if row is None:
            return
        try:
            with open(self.file, "a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, CSV_COLUMNS, lineterminator="\n").writerow(row)
        except OSError as e:
            raise _write_error(self.file, e) from None


def scalars(rec: dict) -> dict[str, float]:
    """The scalars of a record under the tags TensorBoard and wandb show: train/loss, train/acc,
    train/lr, train/img_per_s (step records), val/loss, val/acc (evaluations), test/loss, test/acc
    (the final record of a run with a test split)."""
    kind = rec.get("type")
    if kind == "step":
        return {"train/loss": rec["loss"], "train/acc": rec["train_acc"], "train/lr": rec["lr"],
                "train/img_per_s": rec["img_per_s"]}
    if kind == "eval":
        return {f"{rec.get('split', 'val')}/loss": rec["loss"], f"{rec.get('split', 'val')}/acc": rec["acc"]}
    if kind == "final":
        return {f"test/{k}": rec[f"test_{k}"] for k in ("loss", "acc") if f"test_{k}" in rec}
    return {}


class TensorBoardLog(Logger):
    """An event file in the run directory, written with torch.utils.tensorboard (needs tensorboard)."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        self.writer = None

    def open(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # resumed at step > 0: TensorBoard hides what an earlier segment logged after that step
        self.writer = SummaryWriter(str(self.dir), purge_step=step + 1 if step else None)

    def write(self, rec: dict) -> None:
        values = scalars(rec)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, rec["step"])
        if values:
            self.writer.flush()  # a killed run's event file holds every record up to the kill

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class WandbLog(Logger):
    """An offline Weights & Biases run under run_dir/wandb, one per run directory: its id is kept in
    run_dir/wandb-id.txt, so a resumed run continues it (``wandb sync run_dir/wandb/offline-run-*``)."""

    def __init__(self, run_dir: Path, config: dict):
        self.dir = Path(run_dir)
        self.config = config
        self.run = None

    def open(self, step: int) -> None:
        import wandb

        id_file = self.dir / "wandb-id.txt"
        run_id = id_file.read_text(encoding="utf-8").strip() if id_file.exists() else uuid.uuid4().hex[:12]
        atomic_write_text(id_file, run_id + "\n")
        self.run = wandb.init(mode="offline", dir=str(self.dir), project="vitkit", name=self.dir.name, id=run_id,
                              resume="allow", config=self.config)

    def write(self, rec: dict) -> None:
        values = scalars(rec)
        if values:
            self.run.log(values, step=rec["step"])

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


# name -> (the package it needs, or None; how to build it from the run directory and the config dict)
LOGGERS = {
    "csv": (None, lambda run_dir, config: CsvLog(run_dir)),
    "tensorboard": ("tensorboard", lambda run_dir, config: TensorBoardLog(run_dir)),
    "wandb": ("wandb", lambda run_dir, config: WandbLog(run_dir, config)),
}


def check_loggers(names: Sequence[str]) -> None:
    """A ConfigError naming the pip extra when a logger's package is not installed (before any work starts)."""
    for name in names:
        if name not in LOGGERS:
            raise ConfigError(f"loggers: unknown logger {name!r}; choose from {', '.join(LOGGERS)}")
        package = LOGGERS[name][0]
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(f"loggers: {name} needs the {package} package: pip install 'vitkit[{name}]'")


def open_loggers(names: Sequence[str], run_dir: Path, config: dict) -> list[Logger]:
    """The loggers ``names`` asks for, in order, to be opened by ``MetricsLog.open``."""
    check_loggers(names)
    return [LOGGERS[name][1](Path(run_dir), config) for name in names]


@dataclass
class StepWindow:
    """The applied steps since the last ``step`` record: summed loss and accuracy counts, and when it began."""

    loss: float = 0.0  # sum of the steps' losses (each averaged over the processes)
    steps: int = 0
    correct: float = 0.0  # this process's correct predictions
    seen: int = 0  # this process's images
    start: float = field(default_factory=time.perf_counter)

    def add(self, loss: float, correct: float, seen: int) -> None:
        self.loss += loss
        self.steps += 1
        self.correct += correct
        self.seen += seen

    def close(self, step: int, epoch: int, lr: float, seconds: float, world_size: int) -> tuple[dict, float]:
        """The ``step`` record of this window and its speed (images/s, all processes); the window starts over."""
        now = time.perf_counter()
        speed = self.seen * world_size / max(now - self.start, 1e-9)
        rec = {"type": "step", "step": step, "epoch": epoch, "loss": round(self.loss / self.steps, 5),
               "train_acc": round(self.correct / max(self.seen, 1), 4), "lr": lr, "img_per_s": round(speed, 1),
               "seconds": round(seconds, 2)}
        self.loss, self.steps, self.correct, self.seen, self.start = 0.0, 0, 0.0, 0, now
        return rec, speed


def write_plots(run_dir: Path) -> str | None:
    """loss.png, accuracy.png and lr.png from metrics.jsonl; a note (and no plots) without matplotlib.

    The figures are drawn on their own Agg canvas, not through pyplot: a run writes them several times
    (each periodic validation, a stop, the end), and no backend is switched nor figure left open in the
    calling process."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return "note: matplotlib is not installed, so no plots were written (pip install 'vitkit[plot]')"
    recs = []
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
    steps = [r for r in recs if r.get("type") == "step"]
    evals = [r for r in recs if r.get("type") == "eval"]

    def plot(name, series, ylabel):
        fig = Figure(figsize=(6, 4), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        drawn = [ax.plot(xs, ys, label=label, marker="o" if len(xs) < 30 else None) for label, xs, ys in series if xs]
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:  # a run stopped before its first logged step has nothing to name
            ax.legend()
        fig.tight_layout()
        with atomic_path(run_dir / name) as tmp:
            fig.savefig(tmp, format="png")

    plot("loss.png", [("train", [r["step"] for r in steps], [r["loss"] for r in steps]),
                      ("val", [r["step"] for r in evals], [r["loss"] for r in evals])], "loss")
    plot("accuracy.png", [("train", [r["step"] for r in steps], [r["train_acc"] for r in steps]),
                          ("val", [r["step"] for r in evals], [r["acc"] for r in evals])], "accuracy")
    plot("lr.png", [("lr", [r["step"] for r in steps], [r["lr"] for r in steps])], "learning rate")
    return None


__all__ = ["MetricsLog", "Logger", "CsvLog", "TensorBoardLog", "WandbLog", "LOGGERS", "CSV_COLUMNS", "check_loggers",
           "open_loggers", "scalars", "csv_row", "StepWindow", "write_plots"]
