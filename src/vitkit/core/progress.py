"""Progress of long work (training, decoding a folder, evaluating, predicting), shown one way everywhere.

A library call takes a ``Progress`` and opens a ``Task`` for each stretch of work it can count:

    with progress.task("decoding photos/", total=len(files), unit="images") as task:
        for chunk in chunks:
            ...
            task.update(advance=len(chunk))

What is shown is the caller's choice, never the library's: ``Progress()`` shows nothing (the default of
every library call), ``ProgressBar`` draws a tqdm bar (for a terminal), ``ProgressLines`` writes a line
every few seconds (for a log file, nohup, SLURM or CI) and one at the end of a task that took a while.
``make_progress`` picks one of them from what the command line knows about its output.

A task's ETA is the work left at the rate so far; a task given a time ``budget`` (training with a time
cap) ends when the budget is spent if that comes sooner, and says so. Only the process that reports
(rank 0 of a distributed run) is given a Progress that shows anything.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence, TextIO

Clock = Callable[[], float]


def eta_seconds(left: float, rate: float, budget_left: float | None = None) -> tuple[float | None, bool]:
    """Seconds until work of ``left`` more items at ``rate`` items/s is done, and whether a time budget
    with ``budget_left`` seconds to go (None: none) ends it first. (None, False) while the rate is unknown
    and there is no budget."""
    eta = left / rate if rate > 0 else None
    if budget_left is None:
        return eta, False
    budget_left = max(budget_left, 0.0)
    if eta is None or budget_left < eta:
        return budget_left, True
    return eta, False


def duration(seconds: float) -> str:
    """A short duration: '42s', '3m12s', '1h05m'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Task:
    """One stretch of countable work: ``total`` items (None: unknown) of ``unit``, ``done`` of them so far.

    ``update`` moves it on (``done=`` the count reached, or ``advance=`` more) and may set ``info``,
    short notes shown with the counts (e.g. 'loss 0.81'). ``budget``: seconds from now after which the
    work stops whatever is left (training's time cap). ``rate``: show the items per second (off where
    the notes carry a better speed). ``closing``: end with a line saying how long the task took (where
    the Progress writes lines). Used as a context manager, it closes itself; an exception ends it
    without a closing line.
    """

    def __init__(self, progress: "Progress", what: str, total: int | None, unit: str, done: int,
                 budget: float | None, rate: bool, closing: bool):
        self.progress = progress
        self.what = what
        self.total = total
        self.unit = unit
        self.done = done
        self.first = done  # where this task started (a resumed run starts past 0)
        self.info: Sequence[str] = ()
        self.show_rate = rate
        self.closing = closing
        self.start = progress.clock()
        self.deadline = None if budget is None else self.start + budget
        progress.begin(self)

    def update(self, done: int | None = None, *, advance: int = 0, info: Sequence[str] | None = None) -> None:
        if done is not None:
            self.done = done
        self.done += advance
        if info is not None:
            self.info = info
        self.progress.show(self)

    def elapsed(self) -> float:
        return self.progress.clock() - self.start

    def rate(self) -> float:
        """Items per second since the task started."""
        return (self.done - self.first) / max(self.elapsed(), 1e-9)

    def eta(self) -> tuple[float | None, bool]:
        """``eta_seconds`` of what is left: (seconds or None, whether the time budget ends the task)."""
        left = None if self.deadline is None else self.deadline - self.progress.clock()
        if self.total is None:
            return (left, True) if left is not None else (None, False)
        return eta_seconds(self.total - self.done, self.rate(), left)

    def status(self) -> str:
        """The notes, speed, elapsed time and ETA: what follows the counts on a line or a bar."""
        parts = list(self.info)
        if self.show_rate and self.done > self.first:
            parts.append(f"{self.rate():.0f} {self.unit}/s")
        eta, capped = self.eta()
        parts.append(f"{duration(self.elapsed())} elapsed")
        if eta is not None:
            parts.append(f"ETA {duration(eta)}" + (" (time cap)" if capped else ""))
        return ", ".join(parts)

    def capped(self) -> bool:
        """Whether the time budget, not the count, is to end the task, at the speed so far (False before
        the task has a speed)."""
        return self.deadline is not None and self.done > self.first and self.eta()[1]

    def projected_total(self) -> int | None:
        """The count the task will have reached when it ends: its total, or where the time cap stops it at
        the speed so far (None: unknown)."""
        if not self.capped():
            return self.total
        left = max(self.deadline - self.progress.clock(), 0.0)
        return self.done + int(self.rate() * left)

    def line(self) -> str:
        """A progress line: 'decoding photos/: 1024/5000 images (20.5%), 512 images/s, 2s elapsed, ETA 8s';
        when the time cap is to end the task first: 'train: 600 steps (33.3% of 3m00s), ...'."""
        if self.capped():
            budget = self.deadline - self.start
            return (f"{self.what}: {self.done} {self.unit} ({100 * self.elapsed() / budget:.1f}% of "
                    f"{duration(budget)}), {self.status()}")
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        pct = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        return f"{self.what}: {count} {self.unit}{pct}, {self.status()}"

    def closing_line(self) -> str:
        """The last line: 'decoding photos/: 5000 images in 9s (531 images/s)'."""
        took = self.elapsed()
        speed = f" ({(self.done - self.first) / max(took, 1e-9):.0f} {self.unit}/s)" if self.done > self.first else ""
        return f"{self.what}: {self.done} {self.unit} in {took:.1f}s{speed}"

    def close(self, completed: bool = True) -> None:
        self.progress.end(self, completed)

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.close(completed=kind is None)


class Progress:
    """Shows nothing: what a library call reports to when its caller asked for no progress. The
    subclasses show it; they override ``begin``, ``show`` and ``end``, which a Task calls."""

    def __init__(self, clock: Clock = time.perf_counter):
        self.clock = clock

    def task(self, what: str, total: int | None = None, *, unit: str = "items", done: int = 0,
             budget: float | None = None, rate: bool = True, closing: bool = True) -> Task:
        """Start a task (see ``Task``)."""
        return Task(self, what, total, unit, done, budget, rate, closing)

    def begin(self, task: Task) -> None:
        pass

    def show(self, task: Task) -> None:
        pass

    def end(self, task: Task, completed: bool) -> None:
        pass


class ProgressLines(Progress):
    """A line to ``stream`` every ``every`` seconds while a task runs, for output that is not a terminal
    (a log file). A completed task that printed a line, or ran ``min(every, QUICK_S)`` seconds or more,
    ends with a closing line saying how long it took; quick work stays silent."""

    QUICK_S = 5.0

    def __init__(self, stream: TextIO, every: float = 30.0, clock: Clock = time.perf_counter):
        super().__init__(clock)
        self.stream = stream
        self.every = every
        self.last: dict[int, float] = {}  # task id -> when its last line was written (or it began)
        self.printed: set[int] = set()

    def write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def begin(self, task: Task) -> None:
        self.last[id(task)] = task.start

    def show(self, task: Task) -> None:
        now = self.clock()
        if now - self.last[id(task)] >= self.every:
            self.last[id(task)] = now
            self.printed.add(id(task))
            self.write(task.line())

    def end(self, task: Task, completed: bool) -> None:
        shown = id(task) in self.printed
        self.last.pop(id(task), None)
        self.printed.discard(id(task))
        if completed and task.closing and (shown or task.elapsed() >= min(self.every, self.QUICK_S)):
            self.write(task.closing_line())


class ProgressBar(Progress):
    """A tqdm bar on ``stream`` (a terminal) for each task, removed when the task ends. The bar shows the
    task's notes and its own ETA (which honours a time budget) in place of tqdm's."""

    FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}"  # tqdm puts ", " before the postfix
    REFRESH_S = 0.5  # how often the notes and the ETA are recomputed and drawn

    def __init__(self, stream: TextIO, clock: Clock = time.perf_counter):
        super().__init__(clock)
        self.stream = stream
        self.bars: dict[int, object] = {}
        self.refreshed: dict[int, float] = {}

    def begin(self, task: Task) -> None:
        from tqdm import tqdm

        self.bars[id(task)] = tqdm(total=task.total, initial=task.done, desc=task.what, unit=task.unit,
                                   file=self.stream, dynamic_ncols=True, leave=False, bar_format=self.FORMAT)
        self.refreshed[id(task)] = -float("inf")

    def show(self, task: Task) -> None:
        bar = self.bars[id(task)]
        bar.update(task.done - bar.n)  # tqdm redraws at most every 0.1 s
        now = self.clock()
        if now - self.refreshed[id(task)] >= self.REFRESH_S:
            self.refreshed[id(task)] = now
            bar.total = task.projected_total()  # where a time cap ends the bar, at the speed so far
            bar.set_postfix_str(task.status())  # and redraws

    def end(self, task: Task, completed: bool) -> None:
        self.refreshed.pop(id(task), None)
        bar = self.bars.pop(id(task), None)
        if bar is not None:
            bar.close()


def make_progress(stream: TextIO, *, tty: bool, every: float = 30.0, quiet: bool = False) -> Progress:
    """What a command shows on ``stream``: nothing when ``quiet``; a bar on a terminal (``tty``); else a
    line every ``every`` seconds (0: none)."""
    if quiet:
        return Progress()
    if tty:
        return ProgressBar(stream)
    return ProgressLines(stream, every) if every > 0 else Progress()


__all__ = ["Progress", "ProgressLines", "ProgressBar", "Task", "make_progress", "eta_seconds", "duration"]
