"""The Trainer: one run's model, optimizer, gradient scaler, EMA, schedule, state, processes and run
directory, and what is done with them, step by step.

    data (ImageSet, uint8) -> BatchLoader (seeded order, rank slice) -> BatchAugment (seeded per step)
      -> autocast forward/backward (micro-batches) -> clip -> one collective -> optimizer step -> EMA
      -> metrics.jsonl (and the loggers), progress, checkpoints (last/ periodically, best/ on validation)

A step is two calls. ``train_step(batch)`` computes it: forward, backward, clipping, and the step's
one collective, which sums the loss, a non-finite flag, a stop request and the time over the
processes, so that every process decides alike. It returns a ``StepResult``, and ``apply`` takes it:
the optimizer step, or ``skip_step`` for a non-finite one, then the counters, the log and the
periodic checkpoint. ``fit`` runs the epochs; ``run_epoch`` says how an epoch ended (``EpochEnd``).

Exact resume: the data order depends on (seed, epoch), the augmentation of step s on (seed, s, rank),
and the dropout RNG, optimizer and EMA states are saved with every checkpoint, so a run stopped at
any checkpoint and resumed reaches the same weights as an uninterrupted run (no wall-clock budget).
Each step's share of the time budget is saved too, so that a replay (``follow``) takes a run's steps
as the clock gave them (train/replay.py).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import TrainingError
from ..core.progress import Progress
from ..data import BatchAugment, eval_batches
from ..data.augment import alternating_flips, first_flips, move_batch
from ..infer.paths import autocast, model_logits
from ..infer.scoring import Tally
from ..io import checkpoint as ckpt_io
from ..model.vit import count_params
from .budget import END_TOLERANCE, FORWARD_TIMINGS, RunBudget, eval_views, fewer_views, views_words
from .checkpoint import checkpoint_step, find_checkpoint, rng_state, save_checkpoint, set_rng_state, write_json
from .config import RunConfig
from .distributed import DistInfo, all_gather_object, all_reduce_sum, barrier, broadcast_object, broadcast_weights
from .ema import EMA
from .fsdp import full_optimizer_state, full_tensor, full_weights, load_optimizer_state, plain_copy, shard_model
from .loader import BatchLoader, loader_workers, micro_batches
from .metrics import CONFUSION_LOGGERS, MetricsLog, StepWindow, open_loggers, write_plots
from .optim import MuonAdamW, build_optimizer, follow_param_layout
from .precise_bn import CALIBRATION_IMAGES, batchnorms, recalibrate_bn
from .replay import CLOCK_KEY, PLAN_KEY, Plan
from .schedule import Schedule
from .state import TrainerState
from .sync_bn import sync_batchnorm, wants_sync_bn


def aug_seed(seed: int, step: int, rank: int) -> int:
    """The seed of the augmentation of step ``step`` on process ``rank``."""
    return (seed * 2_654_435_761 + step * 40_503 + rank * 9_973 + 1) % (2**63 - 1)


def seed_process(seed: int, rank: int) -> None:
    """Seed the global RNGs (dropout and drop path draw from them): per process; resume restores them."""
    torch.manual_seed(seed + 1000 * rank + 1)
    random.seed(seed + rank)
    np.random.seed((seed + rank) % 2**32)


def main_log(log: Callable[[str], None] | None, dist: DistInfo) -> Callable[[str], None]:
    """``log`` (default: print) on the main process; nothing on the others."""
    if not dist.is_main:
        return lambda message: None
    return log or (lambda message: print(message, flush=True))


@torch.no_grad()
def evaluate_split(model, images, device: torch.device, precision: str = "fp32", batch_size: int = 256,
                   dist: DistInfo = DistInfo(), tta: bool = False, confusion: bool = False,
                   tta_shift: int = 0, tta_flip: bool = True) -> dict:
    """Loss and top-1 accuracy of ``model`` on an ImageSet (sharded over processes, summed); ``tta``: of
    the mean logits of each image and its mirror (not with ``tta_flip`` False), and with ``tta_shift`` of its
    shifted copies too (``infer.paths.model_logits``). ``confusion``: also the
    confusion matrix, (K, K) int64 counts (rows: true class, columns: predicted)."""
    base = ckpt_io.unwrap(model)
    was_training = base.training
    base.eval()
    broadcast_weights(base, dist)  # every shard is scored with the weights rank 0's checkpoint holds
    shard = torch.arange(dist.rank, len(images), dist.world_size)
    tally = Tally(base.cfg.num_classes, confusion=confusion)
    for x, y in eval_batches(images, base.cfg.img_size, base.preprocess, device, batch_size, shard):
        y = y.to(device)
        with autocast(device, precision):
            logits = model_logits(base, x, tta, tta_shift, tta_flip)
        tally.add(logits.float(), y)
    sums = tally.sums()  # loss sum, correct, count: on the CPU (collectives_for)
    all_reduce_sum(sums, dist)
    base.train(was_training)
    count = max(sums[2].item(), 1)
    out = {"loss": sums[0].item() / count, "acc": sums[1].item() / count, "n": int(sums[2].item())}
    if confusion:
        K = base.cfg.num_classes
        out["confusion"] = all_reduce_sum(tally.conf.double().flatten(), dist).long().reshape(K, K).tolist()
    return out


@dataclass(frozen=True)
class StepResult:
    """One computed training step, as every process agrees on it after the step's collective."""

    loss: float  # the step's loss, averaged over the processes
    nonfinite: bool  # the loss or the gradient norm is NaN/inf on some process: the step is not applied
    stop: bool  # some process was asked to stop (Ctrl-C, SIGTERM)
    seconds: float  # training time so far, averaged over the processes
    correct: float = 0.0  # this process's correct top-1 predictions
    seen: int = 0  # this process's images
    grad_norm: float = 0.0  # this process's gradient norm before clipping (0 when clipping is off)
    reserve: float = 0.0  # the seconds a budget keeps for the run's end and one more step, averaged (train/budget.py)


class EpochEnd(Enum):
    """How ``run_epoch`` ended."""

    FINISHED = "finished"  # the epoch ran to its end
    SPENT = "spent"  # the steps or the time budget of the run are spent
    STOPPED = "stopped"  # a stop was requested


class Trainer:
    """Trains ``model`` on ``train_set`` as ``cfg`` says, writing ``run_dir``.

    ``model`` is ready to train (its head, labels and preprocess set: ``build.prepare_model``); the
    trainer moves it to ``device`` (``channels_last``, as ``runtime.training_path`` chooses: with its conv
    weights channels-last, and every batch made so) and builds the rest. ``log`` prints the main process's lines
    (default: print); ``stop`` is polled once per step; ``progress`` shows the steps (the main process's
    only); ``test_set``: the split the run's end scores, counted in a time budget. Constructing a trainer
    seeds this process's global RNGs; ``restore`` continues a saved run.
    """

    epoch_files = True  # each epoch's end writes last/ and refreshes the plots (a probe's epochs take milliseconds)
    views_cut = False  # the run's end scores fewer test-time views than asked, for the budget (fit_views)

    def __init__(self, cfg: RunConfig, model: nn.Module, train_set, run_dir: str | Path, *, val_set=None, test_set=None,
                 dist: DistInfo = DistInfo(), device: torch.device = torch.device("cpu"), precision: str = "fp32",
                 channels_last: bool = False, log: Callable[[str], None] | None = None,
                 stop: Callable[[], bool] | None = None, progress: Progress | None = None, loggers: Sequence = ()):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.dist = dist
        self.device = device
        self.precision = precision
        self.channels_last = channels_last
        self.say = main_log(log, dist)
        self.stop_requested = stop or (lambda: False)
        self.progress = progress if progress is not None and dist.is_main else Progress()
        self.model = model.to(device).train()
        if channels_last:  # before DDP builds its gradient buckets, the optimizer its state and the EMA its copy
            model.to(memory_format=torch.channels_last)
        self.train_set = train_set
        self.val_set = val_set
        self.test_set = test_set
        self.tta, self.tta_shift = self.planned = (cfg.tta, cfg.tta_shift)  # the views scored; a budget's plan
        self.loader = BatchLoader(train_set, cfg.batch_size, cfg.seed, dist, cfg.accum_steps,
                                  loader_workers(cfg.data.workers, dist.world_size))
        self.total_steps = cfg.epochs * len(self.loader)
        budget = cfg.max_minutes * 60 if cfg.max_minutes else None
        self.schedule = Schedule(cfg.schedule, cfg.optim.lr, self.total_steps, budget)
        self.budget = RunBudget(budget) if budget else None  # the whole run's wall-clock: its training time follows
        self._end_fixed: tuple[int, int] | None = None  # end_seconds' parts that do not change during the run
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.augment = BatchAugment(cfg.augment, model.cfg.img_size, model.preprocess, model.cfg.num_classes)
        alternate = cfg.augment.flip_mode == "alternate" and cfg.augment.hflip > 0
        self.first_flips = first_flips(len(train_set), cfg.seed) if alternate else None  # alternating flips
        self.state = TrainerState()
        seed_process(cfg.seed, dist.rank)
        self.sharded = cfg.strategy == "fsdp"
        self.net = self._wrap(model)  # sharding replaces the parameters: the optimizer and the EMA follow it
        self.optimizer = build_optimizer(model, cfg.optim, device.type)
        if isinstance(self.optimizer, MuonAdamW) and dist.enabled and not self.sharded:  # the same gradients everywhere
            self.optimizer.share_work(dist.rank, dist.world_size, lambda t: all_reduce_sum(t, dist))
        self.ema = EMA(model, cfg.ema) if cfg.ema else None
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.generator = torch.Generator(device=device)
        self.eval_batch_size = max(cfg.batch_size // cfg.accum_steps, 64)
        loggers = open_loggers(cfg.loggers, self.run_dir, cfg.to_dict(), loggers) if dist.is_main else []
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", enabled=dist.is_main, loggers=loggers)
        self.window = StepWindow()
        self.lr = 0.0  # the learning rate of the last step
        self.share = math.nan  # the share of the budget spent that the last step's learning rate was given
        self.clock: list[float] = []  # that share at each step of the run (saved with last/: train/replay.py)
        self.plan: Plan | None = None  # a replay: the steps and clock it follows instead of the clock (``follow``)
        self.task = Progress().task("train")  # the steps' progress, while fit runs
        self.clock_start = time.perf_counter()  # when training began, less the time spent before a resume
        self.session_start = time.perf_counter()  # when this segment of the run began (train.loop: its start)
        self.wall_before = 0.0  # the earlier segments' wall-clock, up to the checkpoint resumed

    def _wrap(self, model: nn.Module) -> nn.Module:
        """The module that runs the steps: sharded in place (FSDP: cfg.strategy), compiled (cfg.compile),
        wrapped for DDP (several processes, the default strategy), its BatchNorm layers sharing their
        statistics across the processes (cfg.sync_bn; in place, the same parameters and buffers)."""
        if wants_sync_bn(self.cfg.sync_bn, model, self.dist.world_size, self.device):
            model = sync_batchnorm(model, self.device)
        if self.sharded:
            shard_model(model, self.device)
        net = torch.compile(model) if self.cfg.compile else model
        if self.dist.enabled and not self.sharded:
            from torch.nn.parallel import DistributedDataParallel as DDP

            net = DDP(net, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        return net

    # --------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """trainer.pt: the state, the optimizer, scaler and EMA states and every process's RNG states
        (gathered: a collective, so every process takes part). Under FSDP the optimizer and EMA states
        are gathered from their shards into the same layout (complete on rank 0, which writes them)."""
        self.state.wall_seconds = self.wall_seconds()
        rngs = all_gather_object(rng_state(), self.dist)
        optimizer = full_optimizer_state(self.model, self.optimizer) if self.sharded else self.optimizer.state_dict()
        return {
            **self.state.to_dict(),
            "optimizer": optimizer,
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "rng": rngs,
            "classes": list(self.model.labels),
            "total_steps": self.total_steps,
            CLOCK_KEY: torch.tensor(self.clock, dtype=torch.float64),
            **({PLAN_KEY: self.plan.to_dict()} if self.plan is not None else {}),
        }

    def restore(self, saved: dict) -> None:
        """Continue from a trainer.pt dict (``state_dict``); the weights are the model's already (under
        FSDP sharded from the checkpoint's full weights, as the optimizer and EMA states are here)."""
        if self.sharded:
            load_optimizer_state(self.model, self.optimizer, saved["optimizer"])
        else:
            self.optimizer.load_state_dict(saved["optimizer"])
            follow_param_layout(self.optimizer)
        if saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        if self.ema is not None and saved.get("ema") is not None:
            self.ema.load_state_dict(saved["ema"])
        self.state = TrainerState.load(saved)
        self.clock = saved[CLOCK_KEY].tolist() if CLOCK_KEY in saved else []  # absent: a run of an earlier vitkit
        if PLAN_KEY in saved:  # a replay continued: the plan it started with
            self.follow(Plan.from_dict(saved[PLAN_KEY]))
        self.wall_before = self.state.wall_seconds
        rngs = saved["rng"]
        set_rng_state(rngs[min(self.dist.rank, len(rngs) - 1)])

    def follow(self, plan: Plan) -> None:
        """Replay ``plan``'s steps: each step's learning rate at the share of the budget the run it replays
        recorded, and the end where that run ended, instead of the clock (train/replay.py)."""
        plan.check(len(self.loader))
        self.plan = plan
        self.budget = None  # bound by no clock: nothing to time or keep for the end

    def open_run(self, resumed: bool = False) -> None:
        """Write the run's config.json and classes.json, drop the log records past the state's step (a
        resumed run writes them again), and say what is trained."""
        if not self.dist.is_main:
            return
        write_json(self.run_dir / "config.json", self.cfg.to_dict())
        write_json(self.run_dir / "classes.json", list(self.model.labels))
        self.metrics.open(self.state.step)
        cfg, mcfg = self.cfg, self.model.cfg
        self.say(
            f"{'resuming' if resumed else 'training'} {cfg.init_from or cfg.model} "
            f"({count_params(self.model) / 1e6:.2f}M params, {mcfg.img_size[0]}x{mcfg.img_size[1]}) on "
            f"{len(self.train_set)} images, {mcfg.num_classes} classes; {self.device.type} {self.precision}, "
            f"{self.dist.world_size} process(es){' (fsdp)' if self.sharded else ''}, batch {cfg.batch_size}, "
            f"{cfg.epochs} epochs x {len(self.loader)} steps"
            + (f", budget {cfg.max_minutes:g} min" if self.schedule.budget and self.plan is None else "")
            + (f"; replays the {self.plan.step} steps of {self.plan.run}" if self.plan is not None else "")
            + (f"; from step {self.state.step}" if resumed else "")
        )

    # ---------------------------------------------------------------------------------- the epochs
    def fit(self) -> str:
        """Train until the epochs or the time budget are spent ('completed') or a stop is requested
        ('interrupted'); last/ is saved at the end of each epoch and every ckpt_every steps."""
        self.clock_start = time.perf_counter() - self.state.seconds
        self.start_budget()
        self.window = StepWindow()
        with self.progress_task() as self.task:
            end = self.run_epochs()
        self.state.seconds = self.elapsed()
        return "interrupted" if end is EpochEnd.STOPPED else "completed"

    def run_epochs(self) -> EpochEnd:
        """Epochs until cfg.epochs are done, the run is spent or a stop is requested; how the last ended."""
        while self.state.epoch < self.cfg.epochs:
            end = self.run_epoch()
            if end is not EpochEnd.FINISHED:
                return end
            self.end_epoch()
        return EpochEnd.FINISHED

    def run_epoch(self) -> EpochEnd:
        """The rest of the current epoch, step by step, until it ends, the run is spent or a stop is requested."""
        st = self.state
        for pos, images, labels in self.loader.epoch(st.epoch, st.pos):
            # one process alone reads its clock before a step (and may stop: resuming a run whose budget is
            # spent); processes together step and stop on the time they agreed on at the last step's
            # collective, so that a budget gives every one the same learning rate
            if not self.dist.enabled:
                st.seconds = self.elapsed()
            if (not self.dist.enabled or self.plan is not None) and self.spent():  # a replay ends alike everywhere
                return EpochEnd.SPENT
            result = self.train_step((images, labels))
            self.apply(result, pos)
            if result.stop:
                return EpochEnd.STOPPED
            if self.spent():
                return EpochEnd.SPENT
        return EpochEnd.FINISHED

    def spent(self) -> bool:
        """Whether the run's steps or its time are spent; a replay's: whether it stands where the run it
        replays ended."""
        st = self.state
        if self.plan is not None:
            return self.plan.ended(st.step, st.epoch, st.pos)
        return self.schedule.done(st.step, st.seconds)

    def end_epoch(self) -> None:
        """An epoch record, a validation when one is due (not after the last epoch: the final one
        follows) and the plots it refreshes, and last/."""
        st, cfg = self.state, self.cfg
        st.epoch += 1
        st.pos = 0
        self.metrics.append({"type": "epoch", "epoch": st.epoch, "step": st.step, "seconds": round(st.seconds, 2),
                             "lr": self.lr})
        if cfg.eval_every and self.val_set is not None and st.epoch % cfg.eval_every == 0 and st.epoch < cfg.epochs:
            self.validate(self.eval_model())
            if self.epoch_files:
                self.plot()
        if self.epoch_files:
            self.save("last")

    def wall_seconds(self) -> float:
        """The run's wall-clock so far: this segment's since it began and the earlier segments' up to the
        checkpoint it resumed (as ``state.seconds`` counts the training time)."""
        return self.wall_before + time.perf_counter() - self.session_start

    def elapsed(self) -> float:
        """Training seconds so far, on this process's clock (the earlier segments of a resumed run included)."""
        return time.perf_counter() - self.clock_start

    # ------------------------------------------------------------------------------------ the budget
    def start_budget(self) -> None:
        """With a time budget: the run's wall-clock spent outside training so far (the slowest process's: data,
        model, loggers, a probe's features, earlier segments), and the training time the schedule plans for."""
        if self.budget is None:
            return
        outside = max(self.wall_seconds() - self.state.seconds, 0.0)
        if self.dist.enabled:
            outside = max(all_gather_object(outside, self.dist))
        self.budget.outside = outside
        self.planned = (self.tta, self.tta_shift)
        self.schedule.budget = self.budget.training_seconds(self.reserve())

    def reserve(self) -> float:
        """The seconds a budget keeps from training: one more step and the run's end (``end_seconds``) at the
        most planned views that fit the budget beside the time outside training; fewer views, once the steps'
        time is settled, are planned from then on."""
        if self.budget is None:
            return 0.0
        step = self.budget.step_seconds()
        views = self.views_that_fit(self.budget.seconds - self.budget.outside - step, *self.planned)
        if self.budget.settled():
            self.planned = views
        return self.end_seconds(self.views(*views)) + step

    @torch.no_grad()
    def time_forward(self) -> None:
        """Time the model's forward pass as the end's evaluation runs it: in eval mode, on validation (else test)
        images as evaluation prepares them, one batch of the size each process scores there (the evaluation
        batch, or its share of a smaller split), a warm-up and then FORWARD_TIMINGS times, the fastest kept (the
        end scores batch after batch at its steady speed; one batch timed alone may catch the machine busy, and
        an estimate too high takes its seconds from training). The processes score their shares side by side,
        so an image-view's wall-clock is the batch's seconds over the images of all of them. What the end's
        estimate rests on until a validation is timed; done twice (``budget.FORWARD_AT``), the faster kept."""
        images = self.val_set if self.val_set is not None else self.test_set
        if images is None or not len(images):
            return
        size = min(self.eval_batch_size, -(-len(images) // self.dist.world_size))
        base = ckpt_io.unwrap(self.model)
        was_training = base.training
        base.eval()
        times = []
        try:
            for x, _ in eval_batches(images, base.cfg.img_size, base.preprocess, self.device, size,
                                     torch.arange(size).repeat(1 + FORWARD_TIMINGS)):
                t0 = time.perf_counter()
                with autocast(self.device, self.precision):
                    model_logits(base, x).float().sum().item()  # read back: an accelerator has finished it
                times.append(time.perf_counter() - t0)
        finally:
            base.train(was_training)
        self.budget.timed_forward(min(times[1:]), size * self.dist.world_size)

    def views(self, tta: bool, shift: int) -> int:
        """The forward passes an image's scoring takes with these views, mirrored or not as the run scores."""
        return eval_views(tta, shift, self.cfg.tta_flip)

    def views_that_fit(self, seconds: float, tta: bool, shift: int) -> tuple[bool, int]:
        """(tta, tta_shift): the most of these test-time views whose end fits ``seconds``, else one view."""
        options = fewer_views(tta, shift, self.cfg.tta_flip)
        return next((o for o in options if self.end_seconds(self.views(*o)) <= seconds), options[-1])

    def end_seconds(self, views: int) -> float:
        """The estimated seconds of ``complete`` scoring ``views`` views an image: the BatchNorm re-estimation,
        the final validation, the test split (twice when best/ may hold an earlier model), the confusion
        matrix, last/ and best/ written and read back, and the plots."""
        if self._end_fixed is None:  # the same at every step: the calibration images and a checkpoint's bytes
            weights_moments_ema = 4 * sum(p.numel() * p.element_size() for p in self.model.parameters())
            self._end_fixed = (self.calibration_images(), weights_moments_ema)
        images, save_bytes = self._end_fixed
        if self.val_set is not None:
            images += len(self.val_set) * views
        if self.test_set is not None:
            images += len(self.test_set) * views * (2 if self.val_set is not None and self.state.history else 1)
        scored = self.test_set if self.test_set is not None else self.val_set
        if scored is not None and any(name in CONFUSION_LOGGERS for name in self.cfg.loggers):
            images += len(scored) * views
        return self.budget.end_seconds(images, self.cfg.batch_size, 3, save_bytes, self.cfg.plots)

    def fit_views(self) -> None:
        """With a time budget, the test-time views the run's end scores: fewer when all of them would overrun
        the time left, the most that fit (rank 0 decides), with a line saying so; a line when one overruns."""
        asked = (self.tta, self.tta_shift)
        if self.plan is not None:  # a replay, bound by no clock, scores the views its run scored
            options = fewer_views(*asked, self.cfg.tta_flip)
            self.tta, self.tta_shift = next((o for o in options if self.views(*o) == self.plan.views), asked)
            self.views_cut = (self.tta, self.tta_shift) != asked
            return
        if self.budget is None:
            return
        left = self.budget.seconds - self.wall_seconds()
        allowed = left + END_TOLERANCE * self.budget.seconds
        self.tta, self.tta_shift = broadcast_object(self.views_that_fit(allowed, *self.planned), self.dist)
        need = self.end_seconds(self.views(self.tta, self.tta_shift))
        self.views_cut = (self.tta, self.tta_shift) != asked
        if self.views_cut:
            flip = self.cfg.tta_flip
            self.say(f"budget: evaluating with {views_words(self.tta, self.tta_shift, flip)} rather than "
                     f"{views_words(*asked, flip)}, about {need:.1f} s for the {max(left, 0):.1f} s left")
        elif need > allowed:
            self.say(f"warning: budget: the evaluation takes about {need:.1f} s, past the {max(left, 0):.1f} s left")

    def progress_task(self):
        """The progress of the steps: towards the last step, or the end of the time budget if it comes first.
        It shows the speed of the step records (images/s, all processes) and has no closing line (the run
        says how it ended)."""
        budget = self.schedule.budget - self.state.seconds if self.schedule.budget and self.plan is None else None
        total = self.plan.step if self.plan is not None else self.total_steps
        return self.progress.task("train", total, unit="steps", done=self.state.step, budget=budget,
                                  rate=False, closing=False)

    # ------------------------------------------------------------------------------------ one step
    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> StepResult:
        """Forward and backward of this process's share of one global batch (uint8 images, int64 labels)
        in accum_steps micro-batches, gradient clipping, and the step's collective; nothing is applied."""
        cfg, st = self.cfg, self.state
        self.share = self.plan.clock[st.step] if self.plan is not None else self.schedule.share(st.seconds)
        self.lr = self.schedule.apply(self.optimizer, st.step, share=self.share)
        self.generator.manual_seed(aug_seed(cfg.seed, st.step, self.dist.rank))
        images, labels = move_batch(batch[0], self.device), batch[1].to(self.device, non_blocking=True)
        low = cfg.augment.low_at(self.schedule.progress(st.step, share=self.share))
        x, targets = self.augment(images, labels, self.generator, self.batch_flips(),
                                  size=cfg.augment.low_size if low else None)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        parts = micro_batches(x, targets, cfg.accum_steps)
        loss = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device)
        for i, (xm, tm) in enumerate(parts):
            with self._reduce_gradients(i == len(parts) - 1):
                part_loss, hits = self._forward_backward(xm, tm, len(parts))
            loss += part_loss / len(parts)
            correct += hits
        return self._agree(loss, correct, len(images), self._clip_gradients())

    def batch_flips(self) -> torch.Tensor | None:
        """With alternating flips, which images of the current batch to flip (None: random flips)."""
        if self.first_flips is None:
            return None
        idx = self.loader.batch_indices(self.state.epoch, self.state.pos)
        return alternating_flips(self.first_flips[idx], self.state.epoch)

    def _reduce_gradients(self, last: bool):
        """The context of a micro-batch's backward: the gradients are reduced across the processes once,
        at the last micro-batch of the step (DDP: ``no_sync`` before it; FSDP: the unsharded gradients
        are kept until then, ``set_requires_gradient_sync``)."""
        if self.sharded:
            self.model.set_requires_gradient_sync(last)
        elif self.dist.enabled and not last:
            return self.net.no_sync()
        return contextlib.nullcontext()

    def _forward_backward(self, x: torch.Tensor, targets: torch.Tensor, parts: int):
        """The loss of a micro-batch (backpropagated, scaled by 1 / parts) and its correct predictions."""
        with autocast(self.device, self.precision):
            logits = self.net(x)
        logits = logits.float()
        if targets.dtype == torch.int64:
            loss, hard = F.cross_entropy(logits, targets), targets
        else:  # soft targets: label smoothing, mixup, cutmix
            loss, hard = torch.sum(-targets * F.log_softmax(logits, -1), -1).mean(), targets.argmax(-1)
        self.scaler.scale(loss / parts).backward()
        return loss.detach(), (logits.detach().argmax(-1) == hard).sum()

    def _clip_gradients(self) -> torch.Tensor:
        """The gradients' global norm before clipping them to optim.clip_grad (0 when clipping is off)."""
        if not self.cfg.optim.clip_grad:
            return torch.zeros((), device=self.device)
        self.scaler.unscale_(self.optimizer)
        # sharded gradients: the norm of all the shards, as a replicated DTensor
        return full_tensor(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.clip_grad))

    def _agree(self, loss: torch.Tensor, correct: torch.Tensor, seen: int, grad_norm: torch.Tensor) -> StepResult:
        """The step's one collective: the loss, a non-finite flag, the stop request and the time, summed
        over the processes (the loss and the time then averaged), so that every process decides alike."""
        # one read-back of the step's numbers (float32, as .item() read them one by one)
        local, hits, gnorm = torch.stack([loss.float(), correct.float(), grad_norm.float()]).tolist()
        bad_grad = not math.isfinite(gnorm) and not self.scaler.is_enabled()  # fp16: the scaler skips it
        now = self.elapsed()
        if self.budget is not None:
            self.budget.add_step(now - self.state.seconds)
            if self.budget.wants_forward_timing():
                self.time_forward()
        flags = torch.tensor([local, float(not math.isfinite(local) or bad_grad), float(bool(self.stop_requested())),
                              now, self.reserve()], dtype=torch.float64)  # on the CPU, as collectives_for serves
        all_reduce_sum(flags, self.dist)
        w = self.dist.world_size
        loss_sum, nonfinite, stop, seconds, reserve = flags.tolist()
        return StepResult(loss=loss_sum / w, nonfinite=nonfinite > 0, stop=stop > 0, seconds=seconds / w,
                          correct=hits, seen=seen, grad_norm=gnorm, reserve=reserve / w)

    def apply(self, result: StepResult, pos: int) -> None:
        """Take a computed step (batch ``pos`` of the epoch): the optimizer step, or ``skip_step`` for a
        non-finite one; then the counters, the log, the progress and the periodic last/."""
        st, cfg = self.state, self.cfg
        st.seconds = result.seconds
        if self.budget is not None:  # the training time the budget leaves, as every process agreed
            self.schedule.budget = self.budget.training_seconds(result.reserve)
        if result.nonfinite:
            self.skip_step(result)
        else:
            self.optimizer_step()
            self.window.add(result.loss, result.correct, result.seen)
        self.clock.append(self.share)
        st.step += 1
        st.pos = pos + 1
        if st.step % cfg.log_every == 0 and self.window.steps:
            self.log_step()
        self.task.update(st.step)
        if cfg.ckpt_every and st.step % cfg.ckpt_every == 0:
            self.save("last")

    def optimizer_step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model, self.state.step)

    def skip_step(self, result: StepResult) -> None:
        """A non-finite step: its gradients are dropped and it is counted. Past cfg.skip_nonfinite such
        steps the run stops with an error naming the step and the last good checkpoint."""
        st = self.state
        self.optimizer.zero_grad(set_to_none=True)
        st.skipped += 1
        if st.skipped > self.cfg.skip_nonfinite:
            raise self.nonfinite_error(result)
        self.say(f"warning: non-finite loss/gradients at step {st.step + 1}; step skipped "
                 f"({st.skipped}/{self.cfg.skip_nonfinite})")

    def nonfinite_error(self, result: StepResult) -> TrainingError:
        st = self.state
        last = find_checkpoint(self.run_dir, "last")
        keep = (f"the last good checkpoint {last} (step {checkpoint_step(last)}) is kept" if last
                else "no checkpoint had been saved yet")
        what, value = ("loss", result.loss) if not math.isfinite(result.loss) else ("gradient norm", result.grad_norm)
        return TrainingError(f"{what} is {value} at step {st.step + 1} (epoch {st.epoch + 1}); stopped; {keep}. "
                             "Lower --lr, or allow skipping with --skip-nonfinite N")

    def log_step(self) -> None:
        st = self.state
        rec, speed = self.window.close(st.step, st.epoch, self.lr, st.seconds, self.dist.world_size)
        self.metrics.append(rec)
        epoch = f"epoch {st.epoch + 1}" + ("" if self.task.capped() else f"/{self.cfg.epochs}")  # the clock ends it
        self.task.info = (epoch, f"loss {rec['loss']:.4f}",
                          f"train acc {rec['train_acc'] * 100:.1f}%", f"lr {self.lr:.2e}", f"{speed:.0f} img/s")

    # --------------------------------------------------------------------- validation, checkpoints
    def eval_model(self) -> nn.Module:
        """The model validation scores and best/ holds: a copy holding the EMA when there is one. Under
        FSDP an unsharded copy on every process (gathered: a collective), EMA or not."""
        if self.ema is not None:
            return self.ema.averaged_copy(self.model)
        return plain_copy(self.model, full_weights(self.model, everywhere=True)) if self.sharded else self.model

    def validate(self, model: nn.Module) -> dict:
        """Score ``model`` on the validation split: an eval record (log and history), a line, and best/
        when it is the best so far."""
        st = self.state
        t0 = time.perf_counter()
        r = self._score(model, self.val_set)
        if self.budget is not None:
            self.budget.timed_eval(time.perf_counter() - t0, len(self.val_set) * self.views(self.tta, self.tta_shift))
        improved = r["acc"] > st.best_acc
        if improved:
            st.best_acc, st.best_step = r["acc"], st.step
        rec = {"type": "eval", "split": "val", "epoch": st.epoch, "step": st.step, "loss": round(r["loss"], 5),
               "acc": round(r["acc"], 5), "seconds": round(st.seconds, 2)}
        st.history.append(rec)
        self.metrics.append(rec)
        done = self.epochs_done()
        epochs = f"{done:.0f}" if done.is_integer() else f"{done:.2f}"  # '7', or '7.74' part way through the eighth
        self.say(f"epoch {epochs}: val loss {r['loss']:.4f} acc {r['acc'] * 100:.2f}%"
                 + (" (best)" if improved else f" (best {st.best_acc * 100:.2f}% at step {st.best_step})"))
        if improved:
            self.save("best", extra={"val_acc": r["acc"]}, model=model)
        return r

    def epochs_done(self) -> float:
        """The epochs trained so far, the part of the current one included (a time cap may end a run
        part way through an epoch)."""
        return self.state.epoch + self.state.pos / max(len(self.loader), 1)

    def save(self, name: str, extra: dict | None = None, model: nn.Module | None = None) -> None:
        """Save ``last`` (the weights and the trainer state, to resume from) or ``best`` (the weights to
        use: ``model`` as validated, else the EMA's when there is one; no trainer state). Every process
        takes part."""
        resumable, t0 = name == "last", time.perf_counter()
        state = self.state_dict() if resumable else None  # a collective in DDP and FSDP
        best, model, weights = model, self.model, None
        if not resumable and (self.sharded or self.dist.is_main):
            model = best if best is not None else self.eval_model()  # under FSDP gathered by every process
        elif resumable and self.sharded:
            weights = full_weights(self.model)  # gathered by every process; rank 0 receives them
        if self.dist.is_main:
            info = {"train": {"step": self.state.step, "epoch": self.state.epoch, **(extra or {})}}
            save_checkpoint(self.run_dir, name, model, state, extra=info, weights=weights)
        barrier(self.dist)
        if self.budget is not None:
            self.budget.timed_save(time.perf_counter() - t0)

    # --------------------------------------------------------------------------------------- the end
    def interrupt(self) -> dict:
        """A stopped run: last/ saved, the plots, a line saying how to continue; the short summary."""
        st = self.state
        self.save("last")
        self.plot()
        self.say(f"stopped at step {st.step} (epoch {st.epoch + 1}); saved {self.run_dir / 'last'}; "
                 f"continue with: vitkit train --resume {self.run_dir}")
        return {"status": "interrupted", "step": st.step, "epoch": st.epoch, "run_dir": str(self.run_dir),
                "train_seconds": round(st.seconds, 2)}

    def complete(self, test_set=None) -> dict:
        """A finished run: last/ saved, the final model (the EMA when there is one) validated, best/
        saved, the test split scored; the summary."""
        st = self.state
        start = time.perf_counter()
        self.fit_views()
        # what the budget keeps for all of this (the plots included), at the views the end scores
        estimate = self.end_seconds(self.views(self.tta, self.tta_shift)) if self.budget is not None else None
        self.save("last")
        final = self.eval_model()
        calibrated = self.recalibrate(final)
        summary: dict = {"status": "completed", "run_dir": str(self.run_dir), "step": st.step,
                         "epochs": round(self.epochs_done(), 3),
                         "train_seconds": round(st.seconds, 2), "device": self.device.type,
                         "precision": self.precision, "processes": self.dist.world_size}
        if self.views_cut:  # fewer test-time views, for the budget
            summary["eval_views"] = self.views(self.tta, self.tta_shift)
        if self.val_set is not None:
            last = st.history[-1] if st.history else None  # the epoch's validation, when the run ended with it
            scored = last is not None and last["step"] == st.step and not calibrated
            r = last if scored else self.validate(final)
            summary.update(val_acc=round(r["acc"], 5), val_loss=round(r["loss"], 5), best_val_acc=round(st.best_acc, 5))
        else:
            self.save("best", model=final)
        if test_set is not None:
            summary.update(self._test(final, test_set))
        self._log_confusion(final, test_set)
        if estimate is not None:  # how the end's estimate held (the plots follow: write_summary)
            summary.update(end_seconds=round(time.perf_counter() - start, 2), end_estimate_seconds=round(estimate, 2))
        return summary

    def recalibrate(self, final: nn.Module) -> int:
        """Re-estimate the final model's BatchNorm statistics (``precise_bn``) when it has any and
        cfg.bn_recalibrate says so (auto: after random-resized-crop training); the images used (0: none)."""
        if not self.calibration_images(final):
            return 0
        n = recalibrate_bn(final, self.train_set, self.device, self.precision, CALIBRATION_IMAGES, self.cfg.seed,
                           self.eval_batch_size)
        self.say(f"BatchNorm statistics re-estimated on {n} training images as they are evaluated")
        return n

    def calibration_images(self, model: nn.Module | None = None) -> int:
        """The training images ``recalibrate`` re-estimates ``model``'s (default: the run's) BatchNorm statistics on:
        0 unless it has BatchNorm layers and cfg.bn_recalibrate says so (auto: after random-resized-crop training)."""
        wanted = self.cfg.bn_recalibrate
        if wanted is None:
            wanted = self.cfg.augment.crop == "rrc"
        return min(CALIBRATION_IMAGES, len(self.train_set)) if wanted and batchnorms(model or self.model) else 0

    def _log_confusion(self, final: nn.Module, test_set) -> None:
        """The confusion matrix of the run's model (best/'s, as ``_test`` scores it) on the test split, else
        the validation split, for the loggers that show one; computed only for them (on every process)."""
        images, split = (test_set, "test") if test_set is not None else (self.val_set, "val")
        if images is None or not any(name in CONFUSION_LOGGERS for name in self.cfg.loggers):
            return
        best = self.val_set is not None and self.state.best_step != self.state.step
        model = self._load_best() if best else final
        r = self._score(model, images, confusion=True)
        if self.dist.is_main:
            classes = ckpt_io.unwrap(model).labels or [str(i) for i in range(len(r["confusion"]))]
            self.metrics.confusion(r["confusion"], classes, split, self.state.step)

    def _test(self, final: nn.Module, test_set) -> dict:
        # the test accuracy of what `vitkit.load(run_dir)` gives (best/), and the final model's when best/
        # holds an earlier one
        out = {}
        if self.val_set is not None and self.state.best_step != self.state.step:
            r = self._score(self._load_best(), test_set)
            out["test_acc_final"] = round(self._score(final, test_set)["acc"], 5)
        else:
            r = self._score(final, test_set)
        out.update(test_acc=round(r["acc"], 5), test_loss=round(r["loss"], 5))
        return out

    def _score(self, model: nn.Module, images, confusion: bool = False) -> dict:
        return evaluate_split(model, images, self.device, self.precision, self.eval_batch_size, self.dist,
                              self.tta, confusion=confusion, tta_shift=self.tta_shift,
                              tta_flip=self.cfg.tta_flip)

    def _load_best(self) -> nn.Module:
        barrier(self.dist)  # rank 0 has written best/
        return ckpt_io.load(self.run_dir / "best", self.device)

    def write_summary(self, summary: dict) -> None:
        """The final record, summary.json and the plots; on the main process."""
        if not self.dist.is_main:
            return
        self.metrics.append({"type": "final", **summary})
        write_json(self.run_dir / "summary.json", summary)
        note = self.plot()
        if note:
            self.say(note)

    def plot(self) -> str | None:
        """Write (or refresh) the plots of metrics.jsonl when cfg.plots asks for them, on the main process;
        a note when matplotlib is missing. Called after each periodic validation, on a stop and at the end."""
        if not (self.cfg.plots and self.dist.is_main):
            return None
        t0 = time.perf_counter()
        note = write_plots(self.run_dir)
        if self.budget is not None:
            self.budget.plot = time.perf_counter() - t0
        return note

    def close(self) -> None:
        """Close the loggers (their files are complete after this); on every exit of a run."""
        self.metrics.close()


__all__ = ["Trainer", "StepResult", "EpochEnd", "evaluate_split", "aug_seed", "seed_process", "main_log"]
