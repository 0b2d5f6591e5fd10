"""The recipe a run starts from when it is given data and no config: chosen from what the data is.

``vitkit train --data DIR`` with no ``--config`` looks at the data first (``probe_data``: its format,
image size, channels, number of training images and classes, read from the file listing, a few image
headers or the array files' headers; nothing is decoded) and picks one recipe by these rules, in order:

    1. grey images (1 channel) of at most SMALL_SIDE px   -> 'digits': the demo's model (RunConfig's defaults)
    2. colour images of at most SMALL_SIDE px a side and
       at most SMALL_IMAGES training images                -> 'small-data' (SMALL_DATA): a hybrid ViT with a
                                                              whitening conv tokenizer, trained at 32 px
    3. images larger than SMALL_SIDE px (photos)          -> 'photos' (PHOTOS): the same kind of model with
                                                              a deeper tokenizer, trained on random resized
                                                              crops of the whole images at a resolution
                                                              chosen for the budget (PHOTO_SIZES)
    4. anything else (more small images)                  -> 'default': RunConfig's defaults

The model's input channels always follow the data's (a colour folder never trains a grey model).

The budget: a recipe's run is bounded by the clock (``--max-minutes``; 'small-data' and 'photos' have a
default, SMALL_DATA_MINUTES) unless ``--epochs`` is given; a run bounded by the clock gets CLOCK_EPOCHS epochs,
so that the clock, not the epochs, ends it, and its learning-rate schedule (warmup, decay) is fitted
to the time (``schedule.Schedule``). 'small-data' trains 2 of its model's 4 blocks, narrower, behind a
wider tokenizer, with Muon; a budget of at most SHORT_MINUTES trains without an EMA and with one 3x3 conv at
each of the tokenizer's resolutions, not two (SHORT_RUN). On a CPU of two or more cores a run bounded by the clock trains as two
processes of one thread (CPU_PROCESSES), unless ``--nproc`` says otherwise. Whatever the recipe sets, flags and
``--set`` overrides are laid over it, and ``--config`` replaces it: they always win. ``vitkit train`` with no
``--data`` stays the digits demo on the built-in set.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import DataError
from ..data.datasets import DataFacts, probe_data
from ..data.splits import HELD_OUT
from .budget import FORWARD_SHARE, PLOT_SECONDS, eval_views
from .config import merge
from .speed import share_words

SMALL_SIDE = 64  # images whose longer side is at most this many pixels are "small" (rules 1 and 2)
SMALL_IMAGES = 100_000  # ... and a colour set of at most this many training images takes 'small-data'
SMALL_DATA_MINUTES = 30.0  # the 'small-data' budget when neither --max-minutes nor --epochs is given
CLOCK_EPOCHS = 1000  # the epochs of a run the clock ends: more than any budget here reaches
SHORT_MINUTES = 10.0  # a 'small-data' budget of at most this many minutes trains SHORT_RUN's way
# A short budget: no EMA, so that the run ends with the weights that saw the last, lowest learning rates
# rather than an average lagging them (5 min, seed 0: no EMA 72.24% against 70.94%, within one seed's noise;
# ablate_small_data.jsonl: no-ema, base). One 3x3 conv at each of the tokenizer's two resolutions, not the
# long budget's two: a second conv costs epochs that a short run cannot spare (5 min, seed 0: two at the grid
# 76.34% in 5.1 epochs against one's 77.06% in 6.7; ablate_small_data.jsonl: stem-64-2, stem-64). The
# evidence, budget by budget: docs/experiments.md, "The small-data recipe, part by part".
SHORT_RUN: dict[str, Any] = {"ema": None, "model_args": {"stem_convs": 1, "stem_early_convs": 1}}
SHORT_WHY = "no EMA, one 3x3 conv at each of the tokenizer's resolutions"
# On a CPU of 2 or more cores, a run the clock bounds trains as 2 data-parallel processes of one thread each
# (--batch-size is the global batch, so the steps are the same): small models leave the threads of one
# process waiting on each other, and there images per second are accuracy (1.18x and 1.13x the images/s of
# 1 process x 2 threads; results/processes_threads.jsonl). A run of fixed epochs stays one process, so that
# what it computes does not depend on the machine's cores (each process draws its own augmentations).
CPU_PROCESSES = 2
# On a CPU with AMX, 'small-data' trains in bf16 autocast: AMX multiplies bf16 matrices fast enough to pay
# (a step at 2.15-2.34x fp32's images/s, results/fastpath_bf16_train_amx.json; 5 min on CIFAR-10 84.96%
# against fp32's 82.72%, ablate_small_data.jsonl: base (bf16, AMX), fp32). With AVX512-BF16 but no AMX bf16
# is slower than fp32 (0.64x), and without either it is emulated: fp32 there.
AMX_PRECISION: dict[str, Any] = {"precision": "bf16"}
AMX_WHY = "the CPU has AMX"

# The small-data recipe (CIFAR-size data; configs/small-data.toml holds the same values): the parts of the
# fastest CIFAR-10 trainers (airbench, Page's ResNet-9, CCT), each kept for accuracy per CPU-second as
# benchmarks/ablate_small_data.py measured it (docs/experiments.md, "The small-data recipe, part by part").
SMALL_DATA: dict[str, Any] = {
    "model": "vit_hybrid_whiten_patch4_32",
    # 2 encoder blocks of width 96 (3 heads), not the model's 4 of width 128: a cheaper model sees the data
    # more often in the time (30 min, seed 0: depth 2 80.76% against depth 4's 77.84%; ablate_small_data.jsonl:
    # depth-2). A wider tokenizer, 128 channels at the grid (stem_width=64): more accuracy per epoch, which
    # pays more the longer the run (5 min, seed 0: 77.06% against 76.62%; ablate_small_data.jsonl: stem-64).
    # Two stride-1 3x3 convs at the tokenizer's first grid (stem_early_convs; 16x16 for 32-px images) and two
    # at its 8x8 grid (stem_convs), as airbench's blocks have: without them the frozen whitening filters are
    # all the tokenizer sees at 16x16 (30 min in fp32: 88.68%, 88.38%, 88.32% on seeds 0-2 against one conv at
    # 16x16's 88.44%, 87.72%, 87.92%; ablate_small_data.jsonl: early-conv-2, fp32). 0.58M parameters; a budget
    # of at most SHORT_MINUTES keeps one conv at each (SHORT_RUN).
    "model_args": {"depth": 2, "embed_dim": 96, "num_heads": 3, "stem_width": 64, "stem_early_convs": 2,
                   "stem_convs": 2},
    "epochs": 30,  # with no time limit (--max-minutes 0); a run bounded by the clock gets CLOCK_EPOCHS
    "batch_size": 128,
    "ema": 0.999,
    "tta": True,
    # flips and two copies moved 1 px diagonally, each flip-averaged (six forward passes, once at the end):
    # on kept 30-minute runs 86.80% and 86.54% against the flips' 85.82% and 85.66% (seeds 0 and 1); 2 px
    # gains less (results/tta_views.jsonl)
    "tta_shift": 1,
    "eval_every": 0,
    "precision": "fp32",  # on a CPU with AVX512-BF16 but no AMX, where "auto" picks bf16, this model trained at
    #   0.64x the speed of fp32 (`vitkit bench vit_hybrid_whiten_patch4_32 --dtype fp32,bf16 --mode train
    #   --batch-sizes 128 --threads 2`); on CUDA its matrices are too small for bf16 to matter much. On a CPU
    #   with AMX the recipe trains in bf16 (AMX_PRECISION), 2.2-2.3x as fast
    # flips where mirroring keeps the class, which the run checks on its training images first (mirror_check,
    # data/mirror.py): GTSRB's traffic signs at 5 minutes read 97.50% on their 12,630 test images without flips
    # against 95.91% with them (time_to_accuracy.jsonl; docs/experiments.md, "Mirrored images")
    "augment": {"crop": "pad", "pad": 2, "hflip": 0.5, "flip_mode": "alternate", "mirror_check": True, "auto": "none",
                "mixup_alpha": 0.0, "cutmix_alpha": 0.0, "label_smoothing": 0.2, "erase_prob": 0.0},
    # Muon for the blocks' weight matrices, AdamW for the rest, one lr and weight decay (5 min: 76.62% and
    # 76.18% against AdamW's 75.02% and 74.94%, seeds 0 and 1; ablate_small_data.jsonl: muon, base), and for
    # the tokenizer's conv filters, each flattened to (out, in*3*3) (muon_convs; 5 min: 78.64% and 78.68%
    # against 77.06% and 76.10%; ablate_small_data.jsonl: muon-convs)
    "optim": {"name": "muon", "muon_convs": True, "lr": 0.002, "weight_decay": 0.05, "clip_grad": 1.0},
    "schedule": {"decay": "linear", "warmup_fraction": 0.03, "warmup_steps": 0, "min_lr_ratio": 0.0},
}


# The photos recipe (images larger than SMALL_SIDE px): the small-data recipe's kind of model (a frozen
# patch-whitening layer, strided 3x3 convs and one at the grid, then a few blocks of width 128 with 2D sin-cos
# positions and average pooling), its tokenizer one stride-2 conv deeper (patch 8: an 8x8 grid at 64 px),
# trained on random resized crops of the whole images (kept at the eval short side, data.crop_pct) with
# flips, evaluated on the centre crop with flip averaging. Measured at 5 and 30 minutes on one photo set
# (catsdogs; results/time_to_accuracy.jsonl, docs/experiments.md "The photos recipe against timm").
PHOTOS: dict[str, Any] = {
    "model": "vit_hybrid_whiten_patch8_64",
    "model_args": {},
    "epochs": 30,  # with no time limit; a run bounded by the clock gets CLOCK_EPOCHS
    "batch_size": 64,
    "ema": 0.999,
    "tta": True,
    "eval_every": 0,
    "precision": "fp32",
    "augment": {"crop": "rrc", "rrc_scale": [0.25, 1.0], "hflip": 0.5, "flip_mode": "random", "mirror_check": True,
                "auto": "none", "mixup_alpha": 0.0, "cutmix_alpha": 0.0, "label_smoothing": 0.1, "erase_prob": 0.0},
    "optim": {"name": "adamw", "lr": 0.002, "weight_decay": 0.05, "clip_grad": 1.0},
    "schedule": {"decay": "cosine", "warmup_fraction": 0.05, "warmup_steps": 0, "min_lr_ratio": 0.0},
}
# the training resolution and depth by budget: (at most this many minutes, img_size, depth); a run of
# fixed epochs (or no limit) takes the last row
PHOTO_SIZES = ((SHORT_MINUTES, 64, 2), (float("inf"), 96, 4))


# ------------------------------------------------------------------------------- budgets in work
# A run bounded by the clock measures how fast this machine trains each candidate of its recipe
# (train/speed.py), turns its minutes into the epochs each would reach, and trains the candidate with the best
# carve accuracy at that many epochs in the table of measured points (``choose_by_work``). Each point is
# (epochs reached, validation-carve accuracy in %, where it was measured: benchmarks/results/<file>, variant,
# budget, seed; seed 0's carve of 10% of CIFAR-10's training images, or of catsdogs' 3,000 photos).
REACH = 1.25  # a candidate is chosen only for at least its fewest measured epochs / REACH (none below them)


@dataclass(frozen=True)
class Candidate:
    """One way a recipe may train: ``overrides`` laid over its base, and the accuracy measured at some
    numbers of epochs (``points``: (epochs, accuracy %, source))."""

    name: str
    what: str
    overrides: dict
    points: tuple[tuple[float, float, str], ...]
    accelerator: bool = False  # a candidate for a run on a GPU alone (a run on the CPU never measures it)
    min_images: int = 0  # ... and for data of at least this many training images alone
    # an earlier candidate whose step does a part of this one's work, at the same batch: it trains at least as
    # fast, so its epochs bound this one's, and where this one's table cannot take so few, it is not measured
    slower_than: str | None = None

    def fits(self, on_cpu: bool, images: int) -> bool:
        """Whether a run on the CPU (``on_cpu``) or a GPU, of ``images`` training images, may train it."""
        return not (self.accelerator and on_cpu) and images >= self.min_images

    def predict(self, epochs: float) -> float | None:
        """The accuracy (%) expected after ``epochs``: linear in log epochs between the measured points, the
        last point's beyond them (no gain assumed past what was measured), and below the first down to
        1 / REACH of it, the first segment's line (or the first point alone); None further down."""
        pts = sorted((e, a) for e, a, _ in self.points)
        if epochs < pts[0][0] / REACH:
            return None
        if epochs >= pts[-1][0]:
            return pts[-1][1]
        if len(pts) == 1:
            return pts[0][1]
        i = next((k for k in range(1, len(pts)) if epochs < pts[k][0]), len(pts) - 1)
        (e0, a0), (e1, a1) = pts[i - 1], pts[i]
        return a0 + (a1 - a0) * (math.log(epochs) - math.log(e0)) / (math.log(e1) - math.log(e0))


@dataclass(frozen=True)
class WorkChoice:
    """What ``choose_by_work`` chose: the candidate, the epochs each candidate would reach and the accuracy
    its table predicts there (None: fewer epochs than it was measured at), the images per second, and the
    images of an epoch. A candidate left unmeasured (its ``slower_than`` reaches too few epochs for its table)
    has None for its images per second and, for its epochs, the most it could reach: its faster one's."""

    candidate: Candidate
    epochs: dict[str, float]
    predicted: dict[str, float | None]
    images_per_s: dict[str, float | None]
    images: int
    bound: dict[str, str] = field(default_factory=dict)  # an unmeasured candidate -> the faster one bounding it
    share: tuple[float, int] | None = None  # (the share of their expected epochs recent runs here reached, runs)

    @property
    def expected(self) -> float:
        """The chosen candidate's epochs as the measured speed alone counts them (before ``share``)."""
        return self.epochs[self.candidate.name] / (self.share[0] if self.share else 1.0)

    def line(self, where: str) -> str:
        """What the run's first line says of the choice: the measured speeds, the epochs, the choice."""
        parts = []
        for name, e in self.epochs.items():
            p, rate = self.predicted[name], self.images_per_s[name]
            if rate is None:
                parts.append(f"{name} not measured: at most {e:.1f} epochs, slower than {self.bound[name]} "
                             "(table: none so few)")
                continue
            parts.append(f"{name} {rate:,.0f} img/s -> {e:.1f} epochs"
                         + (f" (table: {p:.1f}%)" if p is not None else " (table: none so few)"))
        scaled = f" {share_words(self.share)}" if self.share else ""
        return (f"measured on {where}, epochs of {self.images:,} images{scaled}: {'; '.join(parts)}; chose "
                f"{self.candidate.name}: {self.candidate.what}")


END_KEYS = ("tta", "tta_shift", "tta_flip", "plots")  # the values ``end_seconds`` reads


def end_seconds(cfg: dict, images_per_s: float, scored: int) -> float:
    """The seconds a run of ``cfg`` (a recipe's dict), training at ``images_per_s``, is expected to spend after
    its last step: scoring ``scored`` images in its test-time views, each view at FORWARD_SHARE of a training
    step's time an image, and drawing its plots (as ``budget.RunBudget`` reckons them before it has timed
    them; without its safety margin: this is the expected time, not a bound)."""
    views = eval_views(bool(cfg.get("tta", False)), int(cfg.get("tta_shift") or 0), bool(cfg.get("tta_flip", True)))
    plots = PLOT_SECONDS if cfg.get("plots", True) else 0.0
    return scored * views * FORWARD_SHARE / max(images_per_s, 1e-9) + plots


def choose_by_work(candidates: tuple[Candidate, ...], base: dict, seconds: float, images: int,
                   speed: Callable[[dict], float], scored: int = 0,
                   clock: Callable[[], float] = time.perf_counter, end: dict | None = None,
                   share: tuple[float, int] | None = None) -> WorkChoice:
    """The candidate that ``seconds`` of a budget buys the best accuracy with, training on ``images`` images
    an epoch and scoring ``scored`` at the end: each candidate's speed (``speed(config)``: images per second
    of ``base`` with its overrides) turned into the epochs that the budget leaves it once measuring (timed
    by ``clock``) and its end's evaluation (``end_seconds``) are taken out, and those into the accuracy its
    points predict. Where no candidate was measured at so few epochs, the one measured at the fewest. ``end``:
    the run's own values of what the end costs (END_KEYS: --no-tta, --tta-shift, plots), over each candidate's.
    A candidate ``slower_than`` one measured before it is not measured where even that one's speed would not
    reach its table's fewest epochs: it could not be chosen, and measuring it would spend the budget. ``share``:
    (the share of their expected epochs that recent runs on this machine reached, how many runs;
    ``speed.reached_share``), which scales every candidate's epochs alike."""
    start = clock()
    configs = {c.name: merge(copy.deepcopy(base), copy.deepcopy(c.overrides)) for c in candidates}
    own = {k: v for k, v in (end or {}).items() if k in END_KEYS}

    scale = share[0] if share else 1.0

    def reach(name: str, rate: float, left: float) -> float:
        return scale * rate * max(left - end_seconds({**configs[name], **own}, rate, scored), 0.0) / max(images, 1)

    rates: dict[str, float | None] = {}  # measured; None: left unmeasured
    bound: dict[str, str] = {}
    counted: dict[str, float] = {}  # the rate each candidate's epochs are counted at: its own, or its bound's
    for c in candidates:
        faster = counted.get(c.slower_than) if c.slower_than else None
        # the time left only shrinks and a slower rate reaches fewer epochs (its end takes longer): an upper bound
        if faster is not None and c.predict(reach(c.name, faster, seconds - (clock() - start))) is None:
            rates[c.name], bound[c.name], counted[c.name] = None, c.slower_than, faster
            continue
        rates[c.name] = counted[c.name] = speed(configs[c.name])
    left = seconds - (clock() - start)
    epochs = {name: reach(name, counted[name], left) for name in rates}
    predicted = {c.name: c.predict(epochs[c.name]) for c in candidates}  # None for an unmeasured one: fewer still
    ranked = [c for c in candidates if predicted[c.name] is not None]
    if ranked:
        best = max(ranked, key=lambda c: predicted[c.name])
    else:
        best = min(candidates, key=lambda c: min(e for e, _, _ in c.points))
    return WorkChoice(best, epochs, predicted, rates, images, bound, share)


def work_images(facts: DataFacts) -> tuple[int, int]:
    """(the images a run on data of ``facts`` trains on an epoch, the images it scores at its end): where the
    data has no validation or test part the run holds out HELD_OUT of its training images and scores those
    (``data.splits.held_out``); where the parts were not counted, the training images and none."""
    if facts.scored is None:
        return facts.images, 0
    if facts.scored == 0:
        carve = round(facts.images * HELD_OUT)
        return facts.images - carve, carve
    return facts.images, facts.scored


ABLATE = "ablate_small_data.jsonl"
TTA = "time_to_accuracy.jsonl"
GPU = "gpu_budget.jsonl"
# 'small-data': the short model (one 3x3 conv at each of the tokenizer's resolutions, no EMA) and the long one
# (two at each, EMA 0.999, SMALL_DATA's own model_args)
# At the fewest epochs a higher learning rate pays most: at 2 epochs 0.002 read 73.92%, 0.004 75.84%, 0.006
# 77.20%, 0.008 77.30%, 0.01 77.26% (ablate_small_data.py --epochs 2, seed 0's carve); the rise flattens at
# 0.006. Each learning rate is a candidate of its own, chosen only where its table says it wins. Screened at 2
# epochs and kept out, each losing in the time it takes: batch 64, batch 256, a longer warmup, no label smoothing, Muon's
# momentum 0.9, no conv at 16x16, a wider tokenizer, 24-px images, identity-initialised convs, progressive
# resizing (3 epochs whose first part is at 16 or 24 px, in the time of 2 at 32 px: 75.36%, 76.56%); reading less at 2
# epochs: no gradient clipping, LayerScale, timm's init, weight decay 0 or 0.1, label smoothing 0.3, 2 heads (whose
# step was not timed); at 10 epochs the
# short model with the EMA (86.08%, against 85.98% without); at 5 epochs the short model with a second conv at
# the grid or at 16x16 (84.12%, 83.96%: between the short and the long model, in accuracy and in time)
# (docs/experiments.md, "The budget in work").
SHORT_LR2 = merge(copy.deepcopy(SHORT_RUN), {"optim": {"lr": 0.004}})
SHORT_LR3 = merge(copy.deepcopy(SHORT_RUN), {"optim": {"lr": 0.006}})
# The short model with one encoder block, not two: about 1.3x its images/s on the AVX2 CPU (speed_measurement.jsonl,
# `--on model_args.depth=1`), and about as good an epoch (seed 0 at 1, 3, 4, 5 and 10 epochs: 70.52%, 79.64%,
# 80.88%, 82.68%, 85.36% against the two blocks' 70.62%, 78.78%, 81.28%, 82.80%, 85.98%; seed 1 at 3: 79.26%
# against 78.64%), 0.44 points less at 2. So in the same time it reaches about 1.3x the epochs, and its table wins
# where the two-block model would reach fewer than about 6 (docs/experiments.md, "The budget in work").
ONE_BLOCK_LR3 = merge(copy.deepcopy(SHORT_LR3), {"model_args": {"depth": 1}})
# ... and at 4x the learning rate (0.008), which one block takes better than two from 2 epochs (seed 0 at 1, 2, 3
# and 4 epochs: 70.10%, 77.62%, 79.96% and 81.44% against 0.006's 70.52%, 76.74%, 79.64% and 80.88%; seed 1 at 3:
# 80.38% against 79.26%; two blocks at 2 epochs: 77.30% against 77.20%); a candidate of its own, chosen where its
# table wins. Each reading less against it at 2 epochs (77.62%): no translations, lr 0.01, label smoothing 0.1,
# AdamW's beta2 0.95, no warmup, width 128, 6 heads, no learned scale after the whitening filters (75.42%), and
# LayerNorm on the queries and keys (76.76% against 77.50% the same day, fp32 on an AMX CPU); an EMA read 77.86% and
# 76.52% against 77.50% and 76.74% on seeds 0 and 1 (0.07 points on average). A narrower tokenizer
# (48 and 96 channels) at 0.008 reads 0.8-2.0 points less at the same epochs and, in two pairs of 2.6-minute runs
# held to AVX2, reached about 1.22x one block's epochs: 75.18% on the test images against 75.04% on average, alike
# within their noise (docs/experiments.md)
ONE_BLOCK_LR4 = merge(copy.deepcopy(ONE_BLOCK_LR3), {"optim": {"lr": 0.008}})
SMALL_DATA_CANDIDATES = (
    Candidate("one-block-lr-3x", "the short model with one encoder block (not two) at 3x the learning rate "
              "(0.006)", ONE_BLOCK_LR3, (
        (1.0, 70.52, f"{ABLATE}: short-lr-3x --on model_args.depth=1, 1 epoch, seed 0"),
        (2.0, 76.74, f"{ABLATE}: short-lr-3x --on model_args.depth=1, 2 epochs, seed 0"),
        (3.0, 79.64, f"{ABLATE}: short-lr-3x --on model_args.depth=1, 3 epochs, seed 0"),
        (4.0, 80.88, f"{ABLATE}: short-lr-3x --on model_args.depth=1, 4 epochs, seed 0"),
        (5.0, 82.68, f"{ABLATE}: short-lr-3x --on model_args.depth=1, 5 epochs, seed 0"),
        (10.0, 85.36, f"{ABLATE}: short-lr-3x --on model_args.depth=1, 10 epochs, seed 0"))),
    Candidate("one-block-lr-4x", "the short model with one encoder block (not two) at 4x the learning rate "
              "(0.008)", ONE_BLOCK_LR4, (
        (1.0, 70.10, f"{ABLATE}: short-lr-4x --on model_args.depth=1, 1 epoch, seed 0"),
        (2.0, 77.62, f"{ABLATE}: short-lr-4x --on model_args.depth=1, 2 epochs, seed 0"),
        (3.0, 79.96, f"{ABLATE}: short-lr-4x --on model_args.depth=1, 3 epochs, seed 0"),
        (4.0, 81.44, f"{ABLATE}: short-lr-4x --on model_args.depth=1, 4 epochs, seed 0"))),
    Candidate("short-lr-3x", "the short model at 3x the learning rate (0.006)", SHORT_LR3, (
        (1.0, 70.62, f"{ABLATE}: short-lr-3x, 1 epoch, seed 0"),
        (2.0, 77.20, f"{ABLATE}: short-lr-3x, 2 epochs, seed 0"),
        (3.0, 78.78, f"{ABLATE}: short-lr-3x, 3 epochs, seed 0"),
        (4.0, 81.28, f"{ABLATE}: short-lr-3x, 4 epochs, seed 0"),
        (5.0, 82.80, f"{ABLATE}: short-lr-3x, 5 epochs, seed 0"),
        (10.0, 85.98, f"{ABLATE}: short-lr-3x, 10 epochs, seed 0")), slower_than="one-block-lr-3x"),
    Candidate("short-lr-2x", "the short model at 2x the learning rate (0.004)", SHORT_LR2, (
        (2.0, 75.84, f"{ABLATE}: short-lr-2x, 2 epochs, seed 0"),
        (4.0, 80.30, f"{ABLATE}: short-lr-2x, 4 epochs, seed 0"),
        (10.0, 85.42, f"{ABLATE}: short-lr-2x, 10 epochs, seed 0")), slower_than="one-block-lr-3x"),
    Candidate("short", "one 3x3 conv at each of the tokenizer's resolutions, no EMA", SHORT_RUN, (
        (2.0, 73.92, f"{ABLATE}: short, 2 epochs, seed 0"),
        (2.436, 75.00, f"{ABLATE}: base, 2 min, seed 0"),
        (5.986, 81.58, f"{ABLATE}: fp32, 5 min, seed 0"),
        (7.368, 82.98, f"{ABLATE}: early-conv, 5 min, seed 0"),
        (10.587, 84.96, f"{ABLATE}: base (bf16, AMX), 5 min, seed 0"),
        (11.764, 85.04, f"{ABLATE}: base, 10 min, seed 0"),
        (20.758, 86.44, f"{ABLATE}: base (bf16, AMX), 10 min, seed 0")), slower_than="one-block-lr-3x"),
    # The long model with one encoder block: 1.11-1.23x its images/s alone on the AVX2 CPU, 1.17-1.18x as the run's
    # two DDP processes in two rounds of three (0.83x in the third; speed_measurement.jsonl, --candidate long-lr-3x
    # --on model_args.depth=1), for 0.28 and 0.36 points less at 5 and 10 epochs (seed 1 at 10: 87.32% against
    # 87.48%, 0.16 less): in the time of 8.5 epochs of two blocks it reaches about 10, where its table reads 87.2%
    # against their 86.8%. It trains from about 4 of its own epochs (5.0 / REACH) until two blocks would reach about
    # 9.3, where their table passes its last point, held (docs/experiments.md, "The budget in work"). At lr 0.008 it
    # read 84.88% at 5 epochs, against 0.006's 85.16% the same day (fp32 on an AMX CPU; `--variants
    # long-lr-4x,long-lr-3x --on model_args.depth=1`). Its step does all of the one-block short model's work and
    # more (the second conv at each resolution), so that model's speed bounds it; not the two-block short model's,
    # whose second block it lacks (on a CPU with AMX the two measured 2,134 and 2,158 images/s).
    Candidate("long-one-block-lr-3x", "two 3x3 convs at each of the tokenizer's resolutions, EMA 0.999, one "
              "encoder block (not two), at 3x the learning rate (0.006)",
              {"optim": {"lr": 0.006}, "model_args": {"depth": 1}}, (
        (5.0, 84.80, f"{ABLATE}: long-lr-3x --on model_args.depth=1, 5 epochs, seed 0"),
        (10.0, 87.24, f"{ABLATE}: long-lr-3x --on model_args.depth=1, 10 epochs, seed 0")),
              slower_than="one-block-lr-3x"),
    Candidate("long-lr-3x", "two 3x3 convs at each of the tokenizer's resolutions, EMA 0.999, at 3x the "
              "learning rate (0.006)", {"optim": {"lr": 0.006}}, (
        (5.0, 85.08, f"{ABLATE}: long-lr-3x, 5 epochs, seed 0"),
        (7.444, 86.08, f"{TTA}: cifar10, 14.3 min held to AVX2, seed 0"),
        (7.778, 86.32, f"{TTA}: cifar10, 14.3 min held to AVX2, seed 0, a second run"),
        (10.0, 87.60, f"{ABLATE}: long-lr-3x, 10 epochs, seed 0"),
        (15.587, 88.28, f"{TTA}: cifar10, 30 min on a 2-core Zen 3 (AVX2), seed 0")),
              slower_than="long-one-block-lr-3x"),
    Candidate("long", "two 3x3 convs at each of the tokenizer's resolutions, EMA 0.999", {}, (
        (26.057, 88.68, f"{ABLATE}: early-conv-2, 30 min, seed 0"),), slower_than="short-lr-3x"),
    # On a GPU a step of these models is bound by its launches, not its arithmetic: at batch 128 an H200 trained the
    # long model at about 5,600 images/s alone, where batch 512 takes about a quarter of the steps for the same
    # images (44.7 epochs in 4 minutes against 13.2 at batch 128, each beside 5 other runs). A wider model costs
    # more there too (4 blocks of width 192 reached 25.6 epochs beside them), but learns more an epoch. Measured
    # there (gpu_budget.jsonl: 4 blocks of width 192 at batch 512 read 88.16% at 25.6 epochs, 88.82% at 34.2; the
    # long model at batch 512 88.36% at 44.7, width 192 at batch 1024 88.38% at 49.5, 6 blocks of width 256 at batch
    # 512 87.64% at 24.0; docs/experiments.md, "On a GPU"). On a CPU a larger batch is no faster an image (batch
    # 256: screened above), and this model's blocks do 7.3 times the long model's matrix products (a long step's
    # 23% on an AVX2 CPU: about 2.5 times its step, estimated), so no CPU budget here reaches the 20 epochs its
    # table starts at: it is never measured there. Its points had 87 steps an epoch (45,000 images): data of
    # fewer than 40 batches does not take it.
    Candidate("wide-b512", "4 blocks of width 192 (3 heads), two 3x3 convs at each of the tokenizer's resolutions, "
              "EMA 0.999, batch 512 at 2x the learning rate (0.004)",
              {"batch_size": 512, "optim": {"lr": 0.004},
               "model_args": {"depth": 4, "embed_dim": 192, "num_heads": 3}}, (
        (25.598, 88.16, f"{GPU}: wide-4x192-b512, 4 min on an H200 beside 5 other runs, seed 0"),
        (34.172, 88.82, f"{GPU}: wide-4x192-b512, 5 min on an H200 beside 3 other runs, seed 0")),
              accelerator=True, min_images=40 * 512),
)
# 'photos': the training resolution and depth (PHOTO_SIZES' rows)
PHOTO_CANDIDATES = (
    Candidate("64px-2-blocks", "64 px, 2 blocks", {"img_size": 64, "model_args": {"depth": 2}}, (
        (10.0, 75.00, f"{ABLATE}: photos-64px-2-blocks, catsdogs, 10 epochs, seed 0"),
        (20.0, 82.67, f"{ABLATE}: photos-64px-2-blocks, catsdogs, 20 epochs, seed 0"),
        (67.762, 87.33, f"{TTA}: catsdogs, 5 min, seed 0"))),
    Candidate("96px-4-blocks", "96 px, 4 blocks", {"img_size": 96, "model_args": {"depth": 4}}, (
        (20.0, 84.67, f"{ABLATE}: photos-96px-4-blocks, catsdogs, 20 epochs, seed 0"),
        (40.0, 86.00, f"{ABLATE}: photos-96px-4-blocks, catsdogs, 40 epochs, seed 0"),
        (103.857, 88.33, f"{TTA}: catsdogs, 30 min, seed 0")), slower_than="64px-2-blocks"),
)

@dataclass(frozen=True)
class Recipe:
    """A recipe chosen for some data: its name, why, and the config values it lays over the defaults."""

    name: str
    reason: str
    base: dict = field(default_factory=dict)

    @property
    def line(self) -> str:
        """The line a run opens with."""
        return f"recipe {self.name}: {self.reason}"


def choose_recipe(facts: DataFacts, max_minutes: float | None = None, epochs: int | None = None,
                  cpus: int | None = None, processes: int | None = None, model: str | None = None,
                  cpu_bf16: str | None = None, speed: Callable[[dict], float] | None = None,
                  where: str = "this machine", end: dict | None = None,
                  share: Callable[[int], tuple[float, int] | None] | None = None) -> Recipe:
    """The recipe for data described by ``facts`` (the rules in the module docstring). ``max_minutes`` and
    ``epochs``: the run's own budget, if given (None: not given; they win over the recipe's). ``cpus``: the
    CPUs a run on the CPU may use (None: the run trains on a GPU), for the processes (CPU_PROCESSES).
    ``processes``: the run's own process count (--nproc), if given; the recipe then chooses none.
    ``model``: the run's own model (--model), if given: another than the recipe's trains as registered, the
    recipe's model sizes (its model_args, made for its own model) left out, all but the data's channels.
    ``cpu_bf16``: the CPU's bf16 matrix instructions ('amx', 'avx512bf16' or 'none', as
    ``core.hardware.cpu_bf16_kind`` answers) when the run trains on the CPU; with AMX, 'small-data'
    trains in bf16 (AMX_PRECISION). ``speed``: images per second of a run of a config (a dict), measured on
    the run's device (``where`` names it): a run bounded by the clock then trains the recipe's candidate that
    its budget in epochs buys the best accuracy with (``choose_by_work``, told the run's own ``end`` values);
    None: by the minutes alone (at most SHORT_MINUTES: SHORT_RUN; the photos: PHOTO_SIZES). ``share``: the run's
    processes -> the share of their expected epochs that recent runs of as many processes here reached, and how
    many runs (``speed.reached_share``; None: none recorded), which scales every candidate's epochs alike; the
    recipe records the chosen candidate's epochs before it (``expected_epochs``)."""
    small = max(facts.size) <= SMALL_SIDE
    if small and facts.channels == 1:
        base: dict = {}
        clock = f"; {_clock(base, max_minutes, epochs, 0)}" if max_minutes else ""
        return Recipe("digits", f"{facts.describe()}: grey images of at most {SMALL_SIDE} px take the demo's "
                      f"digits model (the defaults){clock}", base)
    if small and facts.images <= SMALL_IMAGES:
        return _small_data(facts, max_minutes, epochs, cpus, processes, model, cpu_bf16, speed, where, end, share)
    if not small:
        return _photos(facts, max_minutes, epochs, cpus, processes, model, speed, where, end, share)
    base = {"model_args": {"in_chans": facts.channels}}  # the data's channels, not the demo model's
    clock = f"; {_clock(base, max_minutes, epochs, 0)}" if max_minutes else ""
    return Recipe("default", f"{facts.describe()}: more than {SMALL_IMAGES:,} images, for which no recipe is "
                  "tuned; the defaults (consider --config configs/pretrain.toml, or vitkit finetune from pretrained "
                  f"weights){clock}", base)


def _small_data(facts: DataFacts, max_minutes, epochs, cpus, processes, model, cpu_bf16, speed, where,
                end=None, share=None) -> Recipe:
    """The 'small-data' recipe for ``facts`` (``choose_recipe``'s arguments)."""
    base = copy.deepcopy(SMALL_DATA)
    clock = _clock(base, max_minutes, epochs, SMALL_DATA_MINUTES)
    if cpus is not None and cpu_bf16 == "amx":
        base.update(AMX_PRECISION)
        clock += f"; {AMX_PRECISION['precision']}: {AMX_WHY}"
    procs = _processes(base, cpus, processes)  # before measuring: a step's cost depends on them
    minutes = base.get("max_minutes", 0)
    if minutes and speed is not None and model in (None, base["model"]):
        base, line = _by_work(SMALL_DATA_CANDIDATES, facts, base, minutes, cpus is not None, speed, where, end, share)
        clock += f"; {line}"
    elif 0 < minutes <= SHORT_MINUTES:
        base = merge(base, copy.deepcopy(SHORT_RUN))
        clock += _named_model(base, model) + f"; at most {SHORT_MINUTES:g} min: {SHORT_WHY}"
    else:
        clock += _named_model(base, model)
    return Recipe("small-data", f"{facts.describe()}: CIFAR-size data (at most {SMALL_SIDE} px, "
                  f"{SMALL_IMAGES:,} images), trained at 32 px; {clock}{procs}", base)


def _by_work(pool: tuple[Candidate, ...], facts: DataFacts, base: dict, minutes: float, on_cpu: bool, speed,
             where: str, end: dict | None, share) -> tuple[dict, str]:
    """``base`` with the candidate of ``pool`` that ``minutes`` buy the best accuracy with laid over it
    (``choose_by_work``, at the reached share for the processes ``base`` trains as: ``choose_recipe``'s ``share``),
    and the epochs it counted before that share; and the line that says so."""
    candidates = tuple(c for c in pool if c.fits(on_cpu, facts.images))
    images, scored = work_images(facts)
    reached = share(int(base.get("processes", 1))) if share is not None else None
    choice = choose_by_work(candidates, base, minutes * 60, images, speed, scored=scored, end=end, share=reached)
    base = merge(base, {**copy.deepcopy(choice.candidate.overrides), "expected_epochs": round(choice.expected, 3)})
    return base, choice.line(where)


def _processes(base: dict, cpus: int | None, processes: int | None) -> str:
    """A run bounded by the clock on a CPU of CPU_PROCESSES or more cores trains as that many processes
    (in ``base``), unless the run gives its own (--nproc); says so."""
    if processes is not None:
        return f"; {processes} process{'es' if processes != 1 else ''} (--nproc)"
    if cpus is not None and cpus >= CPU_PROCESSES and base.get("max_minutes", 0) > 0:
        base["processes"] = CPU_PROCESSES
        return f"; {CPU_PROCESSES} processes on the CPU"
    return ""


def _photos(facts: DataFacts, max_minutes: float | None, epochs: int | None, cpus: int | None,
            processes: int | None, model: str | None, speed=None, where: str = "this machine",
            end: dict | None = None, share=None) -> Recipe:
    """The 'photos' recipe for ``facts``: PHOTOS at the resolution and depth its budget buys the best accuracy
    with (``choose_by_work`` over PHOTO_CANDIDATES), or without a speed, PHOTO_SIZES' by the minutes."""
    base = copy.deepcopy(PHOTOS)
    base["model_args"]["in_chans"] = facts.channels
    clock = _clock(base, max_minutes, epochs, SMALL_DATA_MINUTES)
    procs = _processes(base, cpus, processes)  # before measuring: a step's cost depends on them
    minutes = base.get("max_minutes", 0) if epochs is None else 0
    if minutes and speed is not None and model in (None, base["model"]):
        base, line = _by_work(PHOTO_CANDIDATES, facts, base, minutes, cpus is not None, speed, where, end, share)
        clock += f"; {line}"
    else:
        size, depth = next((s, d) for limit, s, d in PHOTO_SIZES if 0 < minutes <= limit or limit == float("inf"))
        base["img_size"] = size
        base["model_args"]["depth"] = depth
        clock += f"; trained at {size} px" + (_named_model(base, model) or f", {depth} blocks")
    return Recipe("photos", f"{facts.describe()}: images larger than {SMALL_SIDE} px; {clock}{procs}", base)


def _named_model(base: dict, model: str | None) -> str:
    """For a run that names ``model``, not ``base``'s: ``base``'s model sizes left out (in place), all but the
    data's channels; says so ("" when the run trains the recipe's own model)."""
    if model is None or model == base.get("model"):
        return ""
    base["model_args"] = {k: v for k, v in base.get("model_args", {}).items() if k == "in_chans"}
    return f"; --model {model} at its own sizes"


# what a recipe's line says already: how long (epochs, max_minutes), the processes, the model and its resolution
SAID_KEYS = ("model", "model_args", "img_size", "epochs", "max_minutes", "processes")


def laid_over_model(recipe: Recipe, model: str | None, given: set[str]) -> Recipe:
    """``recipe`` for a run that names its own ``model`` (not the recipe's): its line lists every training setting
    the recipe lays over that model, each as --set takes it, but for those the run gives itself (``given``:
    dotted keys) and those its line says already (SAID_KEYS). Unchanged for a run of the recipe's own model."""
    from .config import RunConfig

    if model is None or model == recipe.base.get("model", model):
        return recipe
    defaults = _leaves(RunConfig().to_dict())
    laid = [f"{k}={_shown(v)}" for k, v in _leaves(recipe.base).items()
            if k.split(".")[0] not in SAID_KEYS and k not in given and defaults.get(k) != v]
    if not laid:
        return recipe
    return Recipe(recipe.name, f"{recipe.reason}; over --model {model} it sets {', '.join(laid)} (--recipe none: "
                  "RunConfig's defaults)", recipe.base)


def _leaves(node: dict, prefix: str = "") -> dict:
    """A nested dict's values by dotted key."""
    out: dict = {}
    for k, v in node.items():
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


def _shown(value) -> str:
    """A value as --set takes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _clock(base: dict, max_minutes: float | None, epochs: int | None, default_minutes: float) -> str:
    """Bound ``base``'s run by the clock unless ``epochs`` is given; says how the run's length is set."""
    if epochs is not None:
        return f"{epochs} epochs (--epochs)" + (f" within {max_minutes:g} min" if max_minutes else "")
    minutes = max_minutes if max_minutes is not None else default_minutes
    if not minutes:
        return "no time limit (--max-minutes 0): the recipe's epochs"
    base.update(max_minutes=minutes, epochs=CLOCK_EPOCHS)
    given = "--max-minutes" if max_minutes is not None else "the recipe's default budget"
    return f"schedule fitted to {minutes:g} min ({given})"


def recipe_for(path: str | os.PathLike, fmt: str | None = None, max_minutes: float | None = None,
               epochs: int | None = None, cpus: int | None = None, processes: int | None = None,
               model: str | None = None, cpu_bf16: str | None = None, speed: Callable[[dict], float] | None = None,
               where: str = "this machine", batch_size: int | None = None, end: dict | None = None,
               share: Callable[[int], tuple[float, int] | None] | None = None) -> Recipe:
    """The recipe for the data at ``path``: ``probe_data`` then ``choose_recipe``. Data that cannot be
    inspected gets 'default', and the run that opens it says what is wrong in its own words. A given
    ``batch_size`` larger than all the images measures no speed (a measurement holds one such batch in
    memory, which can be more than the machine has): the run that opens the data refuses it."""
    try:
        facts = probe_data(path, fmt)
    except DataError as e:
        return Recipe("default", f"the data could not be inspected ({e}); the defaults")
    if batch_size is not None and batch_size > facts.images:
        speed = None
    return choose_recipe(facts, max_minutes, epochs, cpus, processes, model, cpu_bf16, speed, where, end, share)


__all__ = ["DataFacts", "Recipe", "choose_recipe", "probe_data", "recipe_for", "SMALL_DATA", "PHOTOS", "PHOTO_SIZES",
           "SMALL_SIDE", "SMALL_IMAGES", "laid_over_model", "SAID_KEYS",
           "SMALL_DATA_MINUTES", "CLOCK_EPOCHS", "SHORT_MINUTES", "SHORT_RUN", "CPU_PROCESSES",
           "AMX_PRECISION", "Candidate", "WorkChoice", "choose_by_work", "end_seconds", "END_KEYS", "work_images",
           "SMALL_DATA_CANDIDATES", "PHOTO_CANDIDATES",
           "REACH"]
