"""The training log: ``metrics.jsonl`` (one JSON record per line) and the plots drawn from it.

Records, by ``type``:

- ``step``: every ``log_every`` optimizer steps, the mean loss and train accuracy since the last one,
  the learning rate and the speed;
- ``epoch``: at the end of each epoch;
- ``eval``: each validation;
- ``final``: the run's summary, last.

Only the main process writes. A resumed run first drops the records written after its checkpoint,
so the log has neither gaps nor duplicates.
"""

from __future__ import annotations

import errno
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TrainingError
from ..io.atomic import atomic_path, atomic_write_text


class MetricsLog:
    """Appends records to ``file``; does nothing where ``enabled`` is False (the other processes)."""

    def __init__(self, file: Path, enabled: bool = True):
        self.file = Path(file)
        self.enabled = enabled

    def append(self, rec: dict) -> None:
        if not self.enabled:
            return
        try:
            with open(self.file, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:  # a full disk: one line (the checkpoints are written atomically and stay intact)
            why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or type(e).__name__)
            raise TrainingError(f"{self.file}: could not write the training log ({why})") from None

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
    """loss.png, accuracy.png and lr.png from metrics.jsonl; a note (and no plots) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
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
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        for label, xs, ys in series:
            if xs:
                ax.plot(xs, ys, label=label, marker="o" if len(xs) < 30 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        with atomic_path(run_dir / name) as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)

    plot("loss.png", [("train", [r["step"] for r in steps], [r["loss"] for r in steps]),
                      ("val", [r["step"] for r in evals], [r["loss"] for r in evals])], "loss")
    plot("accuracy.png", [("train", [r["step"] for r in steps], [r["train_acc"] for r in steps]),
                          ("val", [r["step"] for r in evals], [r["acc"] for r in evals])], "accuracy")
    plot("lr.png", [("lr", [r["step"] for r in steps], [r["lr"] for r in steps])], "learning rate")
    return None


__all__ = ["MetricsLog", "StepWindow", "write_plots"]
