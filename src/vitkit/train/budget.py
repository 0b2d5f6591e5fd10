"""A run's time budget (``--max-minutes M``): the wall-clock time its user waits, from the start of
``train.loop.train`` to its summary.

What a run does before its first step (loading the data, building the model, a probe's feature pass,
starting the loggers) and after its last (saving last/, re-estimating BatchNorm statistics, the final
validation, the test split with its test-time views, the confusion matrix, best/ and the plots) comes
out of the budget. The trainer keeps a ``RunBudget``: when training starts it takes the time already
spent outside training, and at every step it estimates the run's end work; the schedule plans for the
training time that remains (``training_seconds``), so the learning rate ends its decay when training
stops, and training stops early enough for the end to fit.

The end work is estimated from what the run has timed: the image-views it scores (each image of a split
once a view) at the seconds one took in the last timed validation, else in a forward pass of one
evaluation batch on every process, timed twice (``FORWARD_AT``, the faster kept), else at ``FORWARD_SHARE``
of a training step's seconds an image; checkpoint writes at the longest one timed, else at ``SAVE_BYTES_PER_S``;
the plots at their time, else ``PLOT_SECONDS``.
"""

from __future__ import annotations

import statistics
from collections import deque

# A budget of M minutes ends within M plus 10%: training stops where the estimated end fits the time left;
# the end keeps its planned views if it runs past that by at most END_TOLERANCE of the budget (the stop
# falls up to a step late, and estimates err), half of the 10%.

FORWARD_SHARE = 1 / 3  # an image's forward pass against its training step (forward + backward: about 3 forwards)
FORWARD_TIMINGS = 5  # evaluation batches timed (after a warm-up) for the end's estimate, the fastest kept: one batch
#   timed alone may catch the machine busy, and an estimate too high is training time lost (a run's summary
#   gives the end's estimate and its seconds: end_estimate_seconds, end_seconds)
SAVE_BYTES_PER_S = 100e6  # a checkpoint write not timed yet: a slow disk's rate, fsync included
PLOT_SECONDS = 2.0  # drawing the plots, not timed yet (matplotlib's import included)
RECENT_STEPS = 16  # the steps whose median time is a step's
FORWARD_AT = (1, RECENT_STEPS)  # the steps after the first at which an evaluation batch is timed for the end's estimate
#   (until a validation is timed): once the steps' time is settled, and again once their median is, the faster kept.
#   A run's first seconds may find the machine busy: a 15-minute CIFAR-10 run timed it at its second step alone and
#   estimated its end at 36.2 s, which took 13.3 (results/time_to_accuracy.jsonl), seconds taken from training
END_MARGIN = 1.25  # the end's forward passes over their timed estimate, a margin: a 1.5-minute CIFAR-10 run of 2
#   processes timed 0.48 ms an image-view in an evaluation batch, and its whole end took 13.8 s of the 20.1 estimated
END_TOLERANCE = 0.05  # of the budget: how far past the time left the planned end may run before fewer views


def eval_views(tta: bool, shift: int, flip: bool = True) -> int:
    """The forward passes that scoring an image takes (``infer.paths.model_logits``): 1, 2 with test-time
    flips, 6 with flips and shifted copies; without the flips (``flip`` False) 1, or 3 with shifted copies."""
    if not tta:
        return 1
    return (3 if shift else 1) * (2 if flip else 1)


def fewer_views(tta: bool, shift: int, flip: bool = True) -> list[tuple[bool, int]]:
    """(tta, shift) settings from these views down to one view, most first."""
    out, counts = [], set()
    for o in [(tta, shift), (tta, 0), (False, 0)]:
        if (n := eval_views(*o, flip)) not in counts:
            out.append(o)
            counts.add(n)
    return out


def views_words(tta: bool, shift: int, flip: bool = True) -> str:
    """'6 views (flips and shifted copies)', '2 views (flips)', '3 views (the image and shifted copies)', '1 view'."""
    if not tta or eval_views(tta, shift, flip) == 1:
        return "1 view"
    if not flip:
        return "3 views (the image and shifted copies)"
    return "6 views (flips and shifted copies)" if shift else "2 views (flips)"


class RunBudget:
    """The budget of a run, ``seconds`` of wall-clock time, and what the run has timed to share it out."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.outside = 0.0  # wall-clock seconds of the run spent outside training (before it, earlier segments)
        self.first: float | None = None  # the first step timed (its warm-up makes it the slowest)
        self.steps: deque[float] = deque(maxlen=RECENT_STEPS)  # the steps after it
        self.forward: float | None = None  # seconds an image-view took in the last timed evaluation
        self.validated = False  # whether ``forward`` is a whole validation's (else evaluation batches', or none)
        self.forward_timings = 0  # the evaluation batches timed for ``forward`` (``timed_forward``)
        self.save: float | None = None  # the longest checkpoint write timed
        self.plot: float | None = None  # the last drawing of the plots timed

    def add_step(self, seconds: float) -> None:
        if self.first is None:
            self.first = max(float(seconds), 0.0)
        else:
            self.steps.append(max(float(seconds), 0.0))

    def settled(self) -> bool:
        """Whether a step after the first has been timed (the first's warm-up no longer counts)."""
        return bool(self.steps)

    def step_seconds(self) -> float:
        """A training step's seconds: the median of the recent ones after the first, else the first (0 before any)."""
        return statistics.median(self.steps) if self.steps else (self.first or 0.0)

    def timed_eval(self, seconds: float, image_views: int) -> None:
        """A validation timed: its seconds an image-view are the end's from now on."""
        if image_views > 0:
            self.forward, self.validated = seconds / image_views, True

    def wants_forward_timing(self) -> bool:
        """Whether to time an evaluation batch now (``FORWARD_AT``): no validation timed yet, and the steps
        counted since the first reach the next of FORWARD_AT."""
        return (not self.validated and self.forward_timings < len(FORWARD_AT)
                and len(self.steps) >= FORWARD_AT[self.forward_timings])

    def timed_forward(self, seconds: float, image_views: int) -> None:
        """An evaluation batch of ``image_views`` timed at ``seconds``: the fastest of these timings is the end's
        estimate an image-view (a busy machine only makes a timing slower)."""
        self.forward_timings += 1
        if image_views > 0 and not self.validated:
            now = seconds / image_views
            self.forward = now if self.forward is None else min(self.forward, now)

    def timed_save(self, seconds: float) -> None:
        self.save = max(self.save or 0.0, seconds)

    def forward_seconds(self, batch_size: int) -> float:
        """An image-view's forward pass: as timed in an evaluation, else a share of a step's time an image."""
        if self.forward is not None:
            return self.forward
        return self.step_seconds() * FORWARD_SHARE / max(batch_size, 1)

    def end_seconds(self, image_views: int, batch_size: int, saves: int, save_bytes: int, plots: bool) -> float:
        """The run's end: ``image_views`` forward passes, ``saves`` checkpoint writes of ``save_bytes`` each
        (at the longest timed) and the plots when drawn."""
        save = self.save if self.save is not None else save_bytes / SAVE_BYTES_PER_S
        plot = (self.plot if self.plot is not None else PLOT_SECONDS) if plots else 0.0
        return image_views * self.forward_seconds(batch_size) * END_MARGIN + saves * save + plot

    def training_seconds(self, reserve: float) -> float:
        """The training time the budget leaves once the time outside training and ``reserve`` (the end
        work and one step) are taken out; at least a millisecond (a run spent stops at its next check)."""
        return max(self.seconds - self.outside - reserve, 1e-3)


__all__ = ["RunBudget", "eval_views", "fewer_views", "views_words", "FORWARD_SHARE", "FORWARD_TIMINGS",
           "SAVE_BYTES_PER_S", "PLOT_SECONDS", "RECENT_STEPS", "FORWARD_AT", "END_MARGIN", "END_TOLERANCE"]
