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

- ``csv``: metrics.csv, one row per step record (split 'train'), per evaluation (split 'val') and, at
  the end of a run with a test split, its test loss and accuracy (type 'final', split 'test'), under fixed
  columns (``CSV_COLUMNS``);
- ``tensorboard``: an event file in the run directory (``tensorboard --logdir runs/`` shows each run
  by its directory's name) with the scalars of ``scalars``, the run's config as hyper-parameters (the
  HPARAMS tab) and, at the end, the confusion matrix as an image; needs the tensorboard package;
- ``wandb``: a Weights & Biases run under run_dir/wandb, in the mode and project the config names
  (``wandb_mode``, ``wandb_project``; by default offline, under project 'vitkit': ``wandb sync``
  uploads it); needs wandb;
- ``mlflow``: an MLflow run (``mlflow_tracking_uri``, by default a SQLite store in run_dir/mlflow.db;
  ``mlflow_experiment``, by default 'vitkit') with the config as parameters; needs mlflow.

A logger that cannot start (a store its library refuses, say) stops the run with one line naming it,
before any logger has started a run: each is made ready first (``Logger.prepare``), then opened.

Besides the named loggers, ``train(..., loggers=[obj])`` takes objects from Python (``ObjectLog``):
anything with ``log_metrics(metrics: dict[str, float], step: int)``, and optionally
``log_hparams(hparams: dict)`` (called once, when a new run starts, with the run's config flattened
to dotted keys) and ``close()``. ``metrics`` holds the tags of ``scalars``.

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

from ..core.errors import ConfigError, TrainingError, VitkitError
from ..io.atomic import atomic_path, atomic_write_text


def _write_error(file: Path, e: OSError) -> TrainingError:
    # a full disk: one line (the checkpoints are written atomically and stay intact)
    why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or type(e).__name__)
    return TrainingError(f"{file}: could not write the training log ({why})")


class Logger:
    """A copy of the training log in another format. ``prepare`` checks what can fail before anything is
    started (a store to open), ``open(step)`` starts it (a resumed run at ``step`` first drops what was
    logged after it), ``write`` takes each record, ``close`` ends it."""

    name = "logger"

    def prepare(self) -> None:
        pass

    def open(self, step: int) -> None:
        pass

    def write(self, rec: dict) -> None:
        raise NotImplementedError

    def confusion(self, matrix, classes: Sequence[str], split: str, step: int) -> None:
        """The confusion matrix (rows: true class, columns: predicted) of the run's model on ``split``,
        at the end of a run, for the loggers that show one."""

    def close(self) -> None:
        pass


def _started(logger: Logger, start) -> None:
    """Run ``start`` (a logger's prepare or open); its library's failure is one line naming the logger."""
    try:
        start()
    except (VitkitError, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - whatever the logger's library raises
        why = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:300]
        raise TrainingError(f"loggers: {logger.name} could not start ({type(e).__name__}: {why})") from None


class MetricsLog:
    """Appends records to ``file`` and hands them to ``loggers``; does nothing where ``enabled`` is False
    (the other processes)."""

    def __init__(self, file: Path, enabled: bool = True, loggers: Sequence[Logger] = ()):
        self.file = Path(file)
        self.enabled = enabled
        self.loggers = list(loggers) if enabled else []

    def open(self, step: int) -> None:
        """Start the log of a run at ``step``: trim metrics.jsonl to it, make every logger ready, then open
        them; a logger that fails to is a TrainingError naming it (those opened before it are closed)."""
        self.trim(step)
        for logger in self.loggers:
            _started(logger, logger.prepare)
        for i, logger in enumerate(self.loggers):
            try:
                _started(logger, lambda: logger.open(step))
            except TrainingError:
                for opened in self.loggers[:i]:
                    opened.close()
                raise

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

    def confusion(self, matrix, classes: Sequence[str], split: str, step: int) -> None:
        for logger in self.loggers:
            logger.confusion(matrix, classes, split, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


# ============================================================================================ loggers
CSV_COLUMNS = ("type", "step", "epoch", "seconds", "split", "loss", "acc", "lr", "img_per_s")


def csv_row(rec: dict) -> dict | None:
    """The metrics.csv row of a record: step records as split 'train' (their train accuracy as acc),
    evaluations as their split, the final record of a run with a test split as split 'test' (its test loss
    and accuracy, its train seconds); None for the other records."""
    if rec.get("type") == "step":
        return {**{k: rec.get(k, "") for k in CSV_COLUMNS}, "split": "train", "acc": rec["train_acc"]}
    if rec.get("type") == "eval":
        return {k: rec.get(k, "") for k in CSV_COLUMNS}
    if rec.get("type") == "final" and "test_acc" in rec:
        return {**{k: "" for k in CSV_COLUMNS}, "type": "final", "step": rec["step"],
                "seconds": rec.get("train_seconds", ""), "split": "test", "loss": rec["test_loss"], "acc": rec["test_acc"]}
    return None


class CsvLog(Logger):
    """metrics.csv in the run directory, under ``CSV_COLUMNS``."""

    name = "csv"

    def __init__(self, run_dir: Path):
        self.file = Path(run_dir) / "metrics.csv"

    def open(self, step: int) -> None:
        rows = []
        if self.file.exists():  # a resumed run: keep the rows up to its step
            with open(self.file, newline="", encoding="utf-8") as f:
                rows = [r for r in csv.DictReader(f) if r.get("step", "").isdigit() and int(r["step"]) <= step
                        and r.get("type") != "final"]  # a longer run's test row is written at its end
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


def flat_hparams(config: dict, prefix: str = "") -> dict[str, int | float | str | bool]:
    """A nested config as one level of dotted keys, each value a number, a string or a bool (a list or
    None as its text), as TensorBoard's hyper-parameters and MLflow's parameters take them."""
    out: dict = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_hparams(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value)
    return out


class TensorBoardLog(Logger):
    """An event file in the run directory, written with torch.utils.tensorboard (needs tensorboard): the
    scalars, the config as hyper-parameters (when a run starts) and the final confusion matrix."""

    name = "tensorboard"

    # the scalars TensorBoard's HPARAMS tab sets beside the hyper-parameters
    HPARAM_METRICS = ("val/acc", "val/loss", "test/acc", "test/loss")

    def __init__(self, run_dir: Path, config: dict | None = None):
        self.dir = Path(run_dir)
        self.config = config or {}
        self.writer = None

    def open(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # resumed at step > 0: TensorBoard hides what an earlier segment logged after that step
        self.writer = SummaryWriter(str(self.dir), purge_step=step + 1 if step else None)
        if not step:  # a new run; a resumed one wrote them when it started
            for summary in hparams(flat_hparams(self.config), dict.fromkeys(self.HPARAM_METRICS, 0.0)):
                self.writer.file_writer.add_summary(summary)
            self.writer.flush()

    def confusion(self, matrix, classes: Sequence[str], split: str, step: int) -> None:
        self.writer.add_image(f"{split}/confusion", confusion_image(matrix, classes, f"{split} confusion"), step,
                              dataformats="HWC")
        self.writer.flush()

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


def _run_id(file: Path) -> str | None:
    """The id kept in ``file`` (a run directory's wandb-id.txt, say), or None without one."""
    return file.read_text(encoding="utf-8").strip() or None if file.exists() else None


class WandbLog(Logger):
    """A Weights & Biases run under run_dir/wandb, one per run directory: its id is kept in
    run_dir/wandb-id.txt, so a resumed run continues it. Mode and project as the config's
    ``wandb_mode`` and ``wandb_project`` say, by default offline (``wandb sync run_dir/wandb/offline-run-*``)
    under project 'vitkit'."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: dict):
        self.dir = Path(run_dir)
        self.config = config
        self.mode = config.get("wandb_mode") or "offline"
        self.project = config.get("wandb_project") or "vitkit"
        self.run = None

    def open(self, step: int) -> None:
        import wandb

        id_file = self.dir / "wandb-id.txt"
        run_id = _run_id(id_file) or uuid.uuid4().hex[:12]
        atomic_write_text(id_file, run_id + "\n")
        self.run = wandb.init(mode=self.mode, dir=str(self.dir), project=self.project, name=self.dir.name, id=run_id,
                              resume="allow", config=self.config)

    def write(self, rec: dict) -> None:
        values = scalars(rec)
        if values:
            self.run.log(values, step=rec["step"])

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


class MlflowLog(Logger):
    """An MLflow run, one per run directory: its id is kept in run_dir/mlflow-id.txt, so a resumed run
    continues it. Tracking URI and experiment as the config's ``mlflow_tracking_uri`` and
    ``mlflow_experiment`` say, by default a SQLite store in the run directory (``default_uri``: ``mlflow ui
    --backend-store-uri sqlite:///RUN/mlflow.db``; MLflow 3 refuses a file store), with no artifact folder
    outside it, and experiment 'vitkit'. A new run records the config as parameters."""

    name = "mlflow"

    def __init__(self, run_dir: Path, config: dict):
        self.dir = Path(run_dir)
        self.config = config
        self.uri = config.get("mlflow_tracking_uri") or self.default_uri(self.dir)
        self.experiment = config.get("mlflow_experiment") or "vitkit"
        self.client = self.run_id = self.experiment_id = None

    @staticmethod
    def default_uri(run_dir: Path) -> str:
        """sqlite:///RUN/mlflow.db, the run directory's absolute path."""
        return f"sqlite:///{(Path(run_dir) / 'mlflow.db').resolve().as_posix()}"

    def prepare(self) -> None:
        """Open the store and find (or create) the experiment: what fails where the store is refused."""
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            self.experiment_id = found.experiment_id
            return
        own = self.uri == self.default_uri(self.dir)  # artifacts beside the store, not in the working folder
        where = {"artifact_location": (self.dir / "mlartifacts").resolve().as_uri()} if own else {}
        self.experiment_id = self.client.create_experiment(self.experiment, **where)

    def open(self, step: int) -> None:
        id_file = self.dir / "mlflow-id.txt"
        self.run_id = _run_id(id_file)
        if self.run_id is None:
            self.run_id = self.client.create_run(self.experiment_id, run_name=self.dir.name).info.run_id
            atomic_write_text(id_file, self.run_id + "\n")
            params = flat_hparams(self.config)
            for name, value in params.items():  # MLflow keeps a parameter's first value: set once, here
                self.client.log_param(self.run_id, name, str(value)[:500])

    def write(self, rec: dict) -> None:
        for tag, value in scalars(rec).items():
            self.client.log_metric(self.run_id, tag, value, step=rec["step"])

    def close(self) -> None:
        if self.client is not None:
            self.client.set_terminated(self.run_id)
            self.client = None


class ObjectLog(Logger):
    """A logger object from Python (see the module's docstring): ``log_metrics(metrics, step)``, and
    ``log_hparams(hparams)`` and ``close()`` where it has them."""

    @property
    def name(self) -> str:
        return f"a {type(self.obj).__name__} object"

    def __init__(self, obj, config: dict):
        if not callable(getattr(obj, "log_metrics", None)):
            raise ConfigError(f"loggers: a {type(obj).__name__} has no log_metrics(metrics, step) method")
        self.obj = obj
        self.config = config

    def open(self, step: int) -> None:
        if not step and callable(getattr(self.obj, "log_hparams", None)):
            self.obj.log_hparams(flat_hparams(self.config))

    def write(self, rec: dict) -> None:
        values = scalars(rec)
        if values:
            self.obj.log_metrics(values, rec["step"])

    def close(self) -> None:
        if callable(getattr(self.obj, "close", None)):
            self.obj.close()


# name -> (the package it needs, or None; how to build it from the run directory and the config dict)
LOGGERS = {
    "csv": (None, lambda run_dir, config: CsvLog(run_dir)),
    "tensorboard": ("tensorboard", lambda run_dir, config: TensorBoardLog(run_dir, config)),
    "wandb": ("wandb", lambda run_dir, config: WandbLog(run_dir, config)),
    "mlflow": ("mlflow", lambda run_dir, config: MlflowLog(run_dir, config)),
}
CONFUSION_LOGGERS = ("tensorboard",)  # the named loggers that show the final confusion matrix


def check_loggers(names: Sequence[str]) -> None:
    """A ConfigError naming the pip extra when a logger's package is not installed (before any work starts)."""
    for name in names:
        if name not in LOGGERS:
            raise ConfigError(f"loggers: unknown logger {name!r}; choose from {', '.join(LOGGERS)}")
        package = LOGGERS[name][0]
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(f"loggers: {name} needs the {package} package: pip install 'vitkit[{name}]'")


def open_loggers(names: Sequence[str], run_dir: Path, config: dict, objects: Sequence = ()) -> list[Logger]:
    """The loggers ``names`` asks for, in order, then the logger ``objects`` (``ObjectLog``), to be opened
    by ``MetricsLog.open``."""
    check_loggers(names)
    return [LOGGERS[name][1](Path(run_dir), config) for name in names] + [ObjectLog(o, config) for o in objects]


def confusion_image(matrix, classes: Sequence[str], title: str = ""):
    """The confusion matrix as an (H, W, 3) uint8 array: drawn with labels by matplotlib where it is
    installed (``confusion_png``), else a heat map of each row's shares, 8 pixels a cell."""
    import io

    import numpy as np

    png = confusion_png(matrix, list(classes), title)
    if png is not None:
        from PIL import Image

        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    m = np.asarray(matrix, dtype=np.float64)
    share = m / np.maximum(m.sum(1, keepdims=True), 1)
    cells = (255 * (1 - share)).astype(np.uint8).repeat(8, 0).repeat(8, 1)  # dark: a large share
    return np.stack([cells, cells, np.full_like(cells, 255)], -1)


def confusion_png(matrix, classes: list[str], title: str = "") -> bytes | None:
    """The confusion matrix as PNG bytes (rows: true class, columns: predicted; colour: share of the row),
    or None when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    import io

    import numpy as np

    m = np.asarray(matrix, dtype=np.float64)
    K = len(classes)
    share = m / np.maximum(m.sum(1, keepdims=True), 1)
    side = min(12.0, 2.5 + 0.45 * K)
    fig = Figure(figsize=(side + 1.2, side), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    if K <= 30:
        ax.set_xticks(range(K), labels=classes, rotation=90 if max(map(len, classes)) > 3 else 0)
        ax.set_yticks(range(K), labels=classes)
        if K <= 20:
            for i in range(K):
                for j in range(K):
                    if m[i, j]:
                        ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=7,
                                color="white" if share[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


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


__all__ = ["MetricsLog", "Logger", "CsvLog", "TensorBoardLog", "WandbLog", "MlflowLog", "ObjectLog", "LOGGERS",
           "CONFUSION_LOGGERS", "CSV_COLUMNS", "check_loggers", "open_loggers", "scalars", "csv_row", "flat_hparams",
           "confusion_image", "confusion_png", "StepWindow", "write_plots"]
