"""A linear probe: the head alone, trained on the frozen backbone's features, computed once.

``vitkit finetune WEIGHTS --tune probe`` (or ``--tune auto`` where train/tune.py's rule chooses it)
freezes everything but the head (``tune.freeze_for``). The backbone's output for an image then never
changes, so instead of running it on every image of every epoch the run computes each image's pooled
features once (train/features.py: the input of the head, of the image as evaluation prepares it, no
augmentation, in eval mode, at the run's precision), for the training, validation and test images, keeps
them in the cache folder beside the decoded images (``<cache_dir>/features/``; none with ``--no-cache``
or ``--cache-dir none``), so that the next probe of the same weights on the same data starts training at
once, and trains the head on them.

``ProbeTrainer`` is the ``Trainer`` with the features as its images, so the rest is a run's as any other:
the optimizer (AdamW, SGD, Lion as optim says), the schedule (fitted to ``max_minutes`` when the clock
bounds the run; the run also ends when its epochs are done), the batch size, label smoothing, the head's
dropout, validation every ``eval_every`` epochs with the best kept, an interrupt and ``--resume``,
config.json, metrics.jsonl, summary.json, and last/ and best/ as full models with the new head, which
`vitkit eval`, `predict`, `explain` and `export` read as any run's. The image augmentation (crops, flips,
mixup, cutmix, test-time flips) has no part in it: a feature is of the evaluated image.

What differs from a run on images: last/ is written when the run ends or stops (and every ``ckpt_every``
steps) rather than at each epoch's end, and the best head is kept in memory and written to best/ then,
since a probe's epochs take milliseconds and a checkpoint holds the whole model; the plots are drawn at
the end. The features pass is counted, as decoding the data is, in the time budget (``--max-minutes``: the
wall-clock the user waits) and not in the training time: it may take FEATURE_SHARE of what the budget has
left when it starts, timed on a first batch; when the whole pass does not fit, the training images are cut
to as many a class as fit, classes balanced, with a line saying so (``features.budgeted_pass``), and when
fewer than ``features.MIN_PER_CLASS`` a class fit, the run is refused in one line before the pass. The run's
header says how the features were had, and its summary records it: ``probe``
('trained on cached features', or on features computed once and not cached), ``feature_cache`` ('hit',
'miss', 'miss, not cached', 'off') and ``feature_seconds``.

A probe runs in one process: with several (``--nproc N``, a torchrun launch) it is refused with one line
(``RunConfig.validate``, ``probe_trainer``); its work after the features pass is seconds.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch
from torch import nn

from ..data.augment import one_hot
from ..infer.paths import autocast
from ..infer.scoring import Tally
from ..io import checkpoint as ckpt_io
from .checkpoint import save_checkpoint
from .features import FeatureSet, split_features
from .loader import check_batches
from .trainer import Trainer, main_log
from .tune import probe_processes_error

FEATURE_SHARE = 0.8  # of the budget left when the features pass starts; the rest trains and scores the head


class _Head(nn.Module):
    """A head and the class names: what scoring on features needs of a model (best/ kept in memory)."""

    def __init__(self, head: nn.Module, labels):
        super().__init__()
        self.head = head
        self.labels = labels


class ProbeTrainer(Trainer):
    """A ``Trainer`` of ``model``'s head on ``features`` ('train', and 'val' and 'test' when the data has
    them: ``FeatureSet``s); ``info``: how the features were had, for the summary."""

    epoch_files = False

    def __init__(self, cfg, model: nn.Module, features: dict[str, FeatureSet], run_dir: str | Path, *,
                 info: dict, **kwargs):
        kwargs.update(channels_last=False, test_set=features.get("test"))  # (N, D) features
        super().__init__(cfg, model, features["train"], run_dir, val_set=features.get("val"), **kwargs)
        self.tta, self.tta_shift = False, 0  # a feature is of the evaluated image: one view
        self.net = self._head_logits  # each step runs the head alone, on a batch of features
        self.augment = self._targets
        self.first_flips = None
        self.test_features = features.get("test")
        self.info = info
        self.best: tuple[dict, dict] | None = None  # the best head's weights and its checkpoint's info

    def validate(self, model: nn.Module) -> dict:
        """As a run validates; its line only when the head improves (a probe's epochs take milliseconds, and
        a budget gives it hundreds: the summary says where it ended)."""
        say, lines = self.say, []
        best = self.state.best_acc
        self.say = lines.append
        try:
            r = super().validate(model)
        finally:
            self.say = say
        if r["acc"] > best:
            for line in lines:
                say(line)
        return r

    def time_forward(self) -> None:
        """Nothing to time: the end scores features (a head's product, as a step's)."""

    def _head_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.head(self.model.head_drop(x))

    def _targets(self, x: torch.Tensor, labels: torch.Tensor, generator, flips, size=None):
        """A batch's features as they are (computed once, at the model's size: ``size`` does not apply), and its
        targets: smoothed as augment.label_smoothing says."""
        smoothing = self.cfg.augment.label_smoothing
        return x, one_hot(labels, self.model.head.out_features, smoothing) if smoothing else labels

    @torch.no_grad()
    def _score(self, model: nn.Module, images: FeatureSet, confusion: bool = False) -> dict:
        """Loss and top-1 accuracy of ``model``'s head on a split's features (and the confusion matrix)."""
        head = ckpt_io.unwrap(model).head
        tally = Tally(head.out_features, confusion=confusion)
        for start in range(0, len(images), self.eval_batch_size):
            x = images.images[start : start + self.eval_batch_size].to(self.device)
            with autocast(self.device, self.precision):
                logits = head(x)
            tally.add(logits.float(), images.labels[start : start + self.eval_batch_size].to(self.device))
        loss, hits, n = tally.sums().tolist()
        out = {"loss": loss / max(n, 1), "acc": hits / max(n, 1), "n": int(n)}
        if confusion:
            out["confusion"] = tally.conf.tolist()
        return out

    def save(self, name: str, extra: dict | None = None, model: nn.Module | None = None) -> None:
        """last/ as any run saves it; best/ kept in memory (the head, which alone changes: ``model``'s as
        validated, else the run's) until the run ends or stops (``write_best``)."""
        if name != "best":
            return super().save(name, extra, model)
        head = ckpt_io.unwrap(model if model is not None else self.eval_model()).head
        info = {"train": {"step": self.state.step, "epoch": self.state.epoch, **(extra or {})}}
        self.best = ({k: v.detach().clone() for k, v in head.state_dict().items()}, info)

    def _load_best(self) -> nn.Module:
        if self.best is None:  # a resumed run that has not improved on best/ yet
            return super()._load_best()
        head = copy.deepcopy(self.model.head)
        head.load_state_dict(self.best[0])
        return _Head(head, self.model.labels)

    def write_best(self) -> None:
        """Write best/: the model with the best head, if one is kept in memory."""
        if self.best is None or not self.dist.is_main:
            return
        weights, info = self.best
        head = self.model.head
        current = {k: v.clone() for k, v in head.state_dict().items()}
        head.load_state_dict(weights)
        try:
            save_checkpoint(self.run_dir, "best", self.model, None, extra=info)
        finally:
            head.load_state_dict(current)

    def complete(self, test_set=None) -> dict:
        """As a run completes (its test split scored on its features), then best/ written."""
        summary = super().complete(self.test_features)
        self.write_best()
        return {**summary, **self.info}

    def interrupt(self) -> dict:
        summary = super().interrupt()
        self.write_best()
        return {**summary, **self.info}


def probe_trainer(cfg, model: nn.Module, splits, run_dir: str | Path, cache_dir=None, *, val_set=None,
                  started: float | None = None, **kwargs) -> ProbeTrainer:
    """The ``ProbeTrainer`` of a run (``kwargs``: the ``Trainer``'s), once the features of ``splits``' train
    and test parts and of ``val_set`` are computed, or read from ``cache_dir`` (None: no cache); with a
    time budget, within FEATURE_SHARE of what is left of it since ``started`` (``time.perf_counter()``)."""
    dist, device = kwargs["dist"], kwargs["device"]
    if dist.enabled:
        raise probe_processes_error(dist.world_size)
    check_batches(len(splits.train), cfg.batch_size, 1, cfg.accum_steps)  # before the pass over the data
    say = main_log(kwargs.get("log"), dist)
    parts = {"train": splits.train, "val": val_set, "test": splits.test}
    seconds = None
    if cfg.max_minutes and started is not None:
        seconds = FEATURE_SHARE * (cfg.max_minutes * 60 - (time.perf_counter() - started))
    where = str(Path(cfg.data.path).expanduser().resolve()) if cfg.data.path else "built-in"
    features, info = split_features(model, {k: v for k, v in parts.items() if v is not None}, device=device,
                                    precision=kwargs.get("precision", "fp32"),
                                    batch_size=max(cfg.batch_size // cfg.accum_steps, 64), cache_dir=cache_dir,
                                    where=where, progress=kwargs.get("progress"), seconds=seconds)
    for note in info.pop("notes"):
        say(f"warning: {note}")
    say(probe_line(features, info, cache_dir))
    kept = info["feature_cache"] in ("hit", "miss")
    info["probe"] = "trained on cached features" if kept else "trained on features computed once (not cached)"
    return ProbeTrainer(cfg, model, features, run_dir, info=info, **kwargs)


def probe_line(features: dict[str, FeatureSet], info: dict, cache_dir) -> str:
    """'probe: the head trains on the backbone's features, computed once (...) in 0.4 s (from the cache in
    DIR)'."""
    counts = ", ".join(f"{part} {len(f)}" for part, f in features.items())
    how = {"hit": f"read from the cache in {cache_dir}", "miss": f"computed, cached in {cache_dir}",
           "miss, not cached": f"computed, not cached in {cache_dir}"}.get(info["feature_cache"], "computed, no cache")
    return (f"probe: the head trains on the frozen backbone's features ({counts}; dimension "
            f"{next(iter(features.values())).images.shape[1]}), {how} in {info['feature_seconds']:.1f} s")


__all__ = ["ProbeTrainer", "probe_trainer", "probe_line", "FEATURE_SHARE"]
