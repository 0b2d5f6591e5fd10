"""Learning-rate schedule: linear warmup, then cosine, linear, constant or step, over the run's progress.

Progress is the larger of ``step / total_steps`` and ``seconds / budget_seconds``: with a wall-clock
budget (``--max-minutes``) the schedule is fitted to the time actually available, so a run that is
cut short by the budget still ends its decay (lr near the floor) when the time is spent. Without a
budget the schedule depends on the step alone, so runs are exactly reproducible. The clock enters as one
number a step, the share of the budget spent (``share``; NaN without a budget): a run records it for each
step, and its replay gives it back (``lr(step, share=...)``), so that a run bounded by the clock replays
bit for bit (train/replay.py).
"""

from __future__ import annotations

import math

from .config import ScheduleConfig


class Schedule:
    def __init__(self, cfg: ScheduleConfig, base_lr: float, total_steps: int, budget_seconds: float | None = None):
        self.cfg = cfg
        self.base_lr = base_lr
        self.total_steps = max(int(total_steps), 1)
        self.budget = budget_seconds
        self.warmup_steps = max(cfg.warmup_steps, int(round(cfg.warmup_fraction * self.total_steps)))

    def share(self, seconds: float) -> float:
        """The share of the budget spent after ``seconds`` of training (NaN: no budget)."""
        return seconds / self.budget if self.budget else math.nan

    def progress(self, step: int, seconds: float = 0.0, share: float | None = None) -> float:
        p = step / self.total_steps
        t = self.share(seconds) if share is None else share
        if not math.isnan(t):
            p = max(p, t)
        return min(p, 1.0)

    def lr(self, step: int, seconds: float = 0.0, share: float | None = None) -> float:
        """The learning rate for optimizer step ``step`` (0-based) after ``seconds`` of training, or at
        ``share`` of the budget spent (NaN: a step not bounded by the clock) where it is given."""
        c = self.cfg
        warm = self.warmup_steps
        t = self.share(seconds) if share is None else share
        clocked = not math.isnan(t)
        if clocked:
            # with a budget the run may end long before total_steps: warm up over the fraction of the
            # time instead, or warmup_steps, whichever ends first
            pw = c.warmup_fraction
            if warm and step < warm and (not pw or t < pw):
                frac_w = max((step + 1) / warm, t / pw if pw else 0.0)
                return self.base_lr * min(frac_w, 1.0)
        elif step < warm:
            return self.base_lr * (step + 1) / warm
        p = self.progress(step, share=t)
        if c.decay == "step":  # as timm's: decays counted over the whole run, warmup included
            return self.base_lr * max(c.step_rate ** math.floor(p / c.step_every + 1e-9), c.min_lr_ratio)
        if not clocked:
            # decay over the steps after warmup
            p = (step - warm) / max(self.total_steps - warm, 1)
        else:
            p = (p - c.warmup_fraction) / max(1 - c.warmup_fraction, 1e-8)
        p = min(max(p, 0.0), 1.0)
        lo = c.min_lr_ratio
        if c.decay == "cosine":
            f = lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * p))
        elif c.decay == "linear":
            f = lo + (1 - lo) * (1 - p)
        else:
            f = 1.0
        return self.base_lr * f

    def apply(self, optimizer, step: int, seconds: float = 0.0, share: float | None = None) -> float:
        lr = self.lr(step, seconds, share)
        for g in optimizer.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        return lr

    def done(self, step: int, seconds: float) -> bool:
        return step >= self.total_steps or bool(self.budget and seconds >= self.budget)


__all__ = ["Schedule"]
