"""Where a run stands: its counters and its evaluation history, saved in every ``last/trainer.pt``.

trainer.pt is a flat dict read back with ``torch.load(weights_only=True)``, so it holds only tensors
and plain values. ``TrainerState`` writes and reads its own keys of that dict (listed once, as the
dataclass's fields); the trainer adds the optimizer, scaler, EMA and RNG states beside them. The
keys and ``STATE_VERSION`` are those of every run directory written so far, so any of them resumes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

STATE_VERSION = 1


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps done (a skipped non-finite step counts)
    epoch: int = 0  # current epoch
    pos: int = 0  # next batch of the current epoch
    seconds: float = 0.0  # training wall-clock spent (all segments of a resumed run)
    wall_seconds: float = 0.0  # the run's whole wall-clock up to this checkpoint (data, validation and
    #   checkpoints too; all segments); absent from trainer.pt files written before it was kept
    skipped: int = 0  # non-finite steps skipped
    best_acc: float = -1.0  # best validation accuracy so far
    best_step: int = -1  # the step it was reached at
    history: list = field(default_factory=list)  # the validation records (for plots), saved as JSON text

    def to_dict(self) -> dict:
        """This state's keys of trainer.pt, with the format version."""
        out: dict = {"version": STATE_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = json.dumps(value) if f.name == "history" else value
        return out

    @classmethod
    def load(cls, saved: dict) -> "TrainerState":
        """The state a trainer.pt dict holds (the history may be absent)."""
        values = {f.name: saved[f.name] for f in fields(cls) if f.name not in ("history", "wall_seconds")}
        values["wall_seconds"] = saved.get("wall_seconds", saved["seconds"])  # older files: their train time
        return cls(**values, history=json.loads(saved.get("history", "[]")))


__all__ = ["TrainerState", "STATE_VERSION"]
