"""A run bounded by the clock, replayed step by step.

In a run bounded by the clock (``max_minutes``) the learning rate of each step depends on the time
spent (``schedule.Schedule``), and the clock decides where the run ends. So each run records, in every
``last/trainer.pt``, the share of its budget spent at each step (``CLOCK_KEY``: float64, NaN for a step
not bounded by the clock), beside where it stands (step, epoch, position in the epoch). A replay
(``vitkit train --config RUN``) reads that record (``read_plan``) and follows it instead of a clock:
the same learning rate at each step, and the end where RUN's last checkpoint stands, whatever the time;
so the same data order, EMA, evaluation points and weights, bit for bit.

A resumed run's record runs on from its checkpoint's, so it holds every step of the run as resumed. A
run stopped (Ctrl-C) or killed ends its record at its last checkpoint: its replay takes those steps and
then ends as a finished run (final validation, best/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.errors import ConfigError
from .checkpoint import find_checkpoint, load_trainer_state
from .config import RunConfig

CLOCK_KEY = "clock"  # trainer.pt: the share of the budget spent at each step, float64
PLAN_KEY = "replay"  # trainer.pt of a replay: the plan it follows (``Plan.to_dict``), so that it resumes


@dataclass(frozen=True)
class Plan:
    """The steps a replay takes: those of ``run``. ``clock``: the share of the budget spent at each of
    them; ``step``, ``epoch``, ``pos``: where the run ended (its last checkpoint); ``views``: the test-time
    views its end scored (summary.json's ``eval_views``: fewer than asked where its budget cut them; None:
    no summary, as after Ctrl-C)."""

    run: str
    clock: tuple[float, ...]
    step: int
    epoch: int
    pos: int
    views: int | None = None

    def ended(self, step: int, epoch: int, pos: int) -> bool:
        """Whether a replay standing at (step, epoch, pos) is where the run ended: at its last step, and
        past the end of its epoch when the run went on to the next one (a validation, a checkpoint)."""
        return step >= self.step and (epoch, pos) >= (self.epoch, self.pos)

    def check(self, steps_per_epoch: int) -> None:
        """The replay's epochs must be of the run's steps (the same data and batch size)."""
        if self.epoch * steps_per_epoch + self.pos != self.step or self.pos > steps_per_epoch:
            raise ConfigError(f"replay: the {self.step} steps of {self.run} ended at step {self.pos} of epoch "
                              f"{self.epoch + 1}, which epochs of {steps_per_epoch} steps do not give; replay it "
                              f"on its data and batch size, or give --max-minutes to train bounded by the clock")

    def to_dict(self) -> dict:
        return {"run": self.run, "clock": torch.tensor(self.clock, dtype=torch.float64),
                "end": [self.step, self.epoch, self.pos], "views": self.views}

    @classmethod
    def from_dict(cls, saved: dict) -> "Plan":
        step, epoch, pos = (int(v) for v in saved["end"])
        return cls(str(saved["run"]), tuple(saved["clock"].tolist()), step, epoch, pos, saved.get("views"))


def read_plan(run_dir: str | Path) -> Plan | None:
    """The steps run directory ``run_dir`` recorded in its last checkpoint, or None where it has none, or a
    record that does not start at its first step (a run of an earlier vitkit, resumed by this one)."""
    ckpt = find_checkpoint(Path(run_dir), "last")
    if ckpt is None:
        return None
    saved = load_trainer_state(ckpt)
    clock = saved.get(CLOCK_KEY)
    step = int(saved.get("step", -1))
    if clock is None or clock.numel() != step:
        return None
    return Plan(str(run_dir), tuple(clock.double().tolist()), step, int(saved["epoch"]), int(saved["pos"]),
                _views(Path(run_dir)))


def _views(run_dir: Path) -> int | None:
    """The test-time views the run's end scored, as its summary.json records them (None: not recorded)."""
    try:
        views = json.loads((run_dir / "summary.json").read_text(encoding="utf-8")).get("eval_views")
    except (OSError, ValueError, AttributeError):
        return None
    return views if isinstance(views, int) and not isinstance(views, bool) else None


def settle_replay(cfg: RunConfig, config: str, given: dict) -> str | None:
    """Set ``cfg.replay`` to the run that ``config`` names (a run directory or its config.json) where that
    run was bounded by the clock and the request (``given``: the values its flags and overrides give) leaves
    its bound (``max_minutes``, ``epochs``) as it was: the replay takes the steps the run recorded rather
    than the clock's. The line that says why it cannot, where it cannot."""
    path = Path(config)
    if "replay" in given or not (path.is_dir() or path.suffix.lower() == ".json"):
        return None  # as the request or a TOML config says
    cfg.replay = None
    if not cfg.max_minutes:
        return None  # a run without a clock: its steps follow from its config
    if "max_minutes" in given or "epochs" in given:
        return None  # a new run bounded by the clock
    run = path if path.is_dir() else path.parent
    if read_plan(run) is None:
        return (f"--config {config}: no record of the run's steps there (no last/ checkpoint that holds one): "
                f"bounded by the clock again ({cfg.max_minutes:g} min), not replayed step by step")
    cfg.replay = str(run)
    return None


__all__ = ["Plan", "read_plan", "settle_replay", "CLOCK_KEY", "PLAN_KEY"]
