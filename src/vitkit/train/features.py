"""The pooled features of a frozen backbone (what the model feeds its head: after the pooling, fc_norm
and pre-logits) for the images of a run's splits, computed once and kept on disk: what a linear probe
trains on (train/probe.py).

``compute_features`` runs the model in eval mode, without gradients, batch by batch, on each image as
evaluation prepares it (``data.eval_batch``: resized and centre cropped at the model's size, normalised
with the model's mean and std; no augmentation), under the run's precision.

``FeatureCache(folder)`` keeps them under ``folder/features/``, beside the decoded images
(``data.cache``), one safetensors file per split: the float32 (N, D) features and the int64 labels. The
key of an entry hashes the backbone's tensors (the head left out: it is what the probe trains), the
model's config, its preprocessing, the precision, this format's version and the images themselves (their
pixels when held in memory, else each file's name, size and modification time and the decode settings):
other weights, other data, another size or another preprocessing is another entry. Entries are written
atomically (``io.atomic``); one read back is checked (its key, its tensors' names, dtypes and shapes, the
labels, a checksum of the features) and computed afresh when anything is off, never trusted. A new entry
of the same weights, data and split replaces the older ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.errors import ConfigError, TrainingError, VitkitError
from ..core.files import fd_path, open_regular
from ..core.progress import Progress
from ..data import eval_batches
from ..infer.paths import autocast
from ..io.atomic import atomic_path

VERSION = 1  # of the entry format and of what a feature is; a change makes every old entry a miss
MIN_PER_CLASS = 2  # training images a class below which a probe within a time budget is refused


@dataclass
class FeatureSet:
    """A split's features, float32 (N, D), and labels, int64 (N,): to ``BatchLoader`` and the trainer
    they are a set of images held in memory (``images``)."""

    images: torch.Tensor
    labels: torch.Tensor
    in_memory: bool = True

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@torch.no_grad()
def compute_features(model, images, device: torch.device, precision: str = "fp32", batch_size: int = 64,
                     task=None) -> torch.Tensor:
    """float32 (N, D) on the CPU: ``model``'s pooled features (the input of its head) of every image of
    ``images`` (an ImageSet), as evaluation prepares it; ``task``: a progress task advanced per batch."""
    was_training = model.training
    model.eval()
    out = []
    try:
        for x, _ in eval_batches(images, model.cfg.img_size, model.preprocess, device, batch_size):
            with autocast(device, precision):
                f = model.forward_head(model.forward_features(x), pre_logits=True)
            if f.ndim != 2:
                raise TrainingError(f"tune: 'probe' trains on one feature vector an image; this model's pooling "
                                    f"(global_pool {model.cfg.global_pool!r}) gives {tuple(f.shape[1:])} an image")
            out.append(f.float().cpu())
            if task is not None:
                task.update(advance=len(f))
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.empty(0, model.num_features)


def _update_tensor(h, name: str, t: torch.Tensor) -> None:
    """Add tensor ``t``'s name, dtype, shape and bytes to hash ``h``."""
    t = t.detach().cpu().contiguous()
    h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy())


def backbone_digest(model, precision: str) -> str:
    """A hash of what a feature depends on besides the image: the model's tensors but the head's, its
    config (the head's size left out), its preprocessing, the precision and ``VERSION``."""
    arch = {k: v for k, v in model.cfg.to_dict().items() if k != "num_classes"}
    what = {"config": arch, "preprocess": model.preprocess.to_dict(), "precision": precision, "version": VERSION}
    h = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode())
    for name, t in model.state_dict().items():
        if not name.startswith("head."):
            _update_tensor(h, name, t)
    return h.hexdigest()


def images_digest(images) -> str:
    """A hash of an ImageSet's labels and images: their pixels when held in memory, else each file's name,
    size and modification time, and the settings it is decoded with."""
    h = hashlib.sha256()
    _update_tensor(h, "labels", images.labels)
    if images.images is not None:
        _update_tensor(h, "images", images.images)
    elif images.ragged is not None:
        _update_tensor(h, "shapes", images.ragged.shapes)
        _update_tensor(h, "pixels", images.ragged.pixels)
    else:
        how = (images.size, images.short_side, images.channels, images.max_pixels)
        h.update(repr(how).encode())
        for p in images.paths:
            try:
                st = os.stat(p)
                stamp = (st.st_size, st.st_mtime_ns)
            except OSError:
                stamp = (-1, -1)  # decoding names the problem
            h.update(f"\0{os.fspath(p)}\0{stamp}".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


class FeatureCache:
    """Features of image sets under ``folder``/features/: ``load`` reads an entry back (None on a miss or a
    damaged, stale or misshapen file), ``store`` writes one (a note on failure: a cache never fails a run)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder).expanduser() / "features"

    def __repr__(self) -> str:
        return f"FeatureCache({self.folder})"

    def file(self, where: str, key: str) -> Path:
        """The entry of ``key``; its name's first part (``where``: the weights, the data and the split) is
        shared by the entries that a newer one replaces."""
        return self.folder / f"{hashlib.sha256(where.encode()).hexdigest()[:16]}-{key[:32]}.safetensors"

    def load(self, file: Path, key: str, labels: torch.Tensor, dim: int) -> torch.Tensor | None:
        """The float32 (len(labels), dim) features stored in ``file`` under ``key`` with these labels, or None."""
        from safetensors import safe_open

        try:
            with open_regular(file) as own, safe_open(fd_path(own, file), framework="pt") as f:  # never a FIFO
                meta = f.metadata() or {}
                if meta.get("key") != key or set(f.keys()) != {"features", "labels"}:
                    return None
                feats, got = f.get_tensor("features"), f.get_tensor("labels")
        except Exception:  # noqa: BLE001 - missing, truncated, a folder, not safetensors at all: a miss
            return None
        if feats.dtype != torch.float32 or tuple(feats.shape) != (len(labels), dim):
            return None
        if got.dtype != torch.int64 or not torch.equal(got, labels.cpu()):
            return None
        if meta.get("crc") != str(zlib.crc32(feats.contiguous().numpy())):
            return None
        return feats

    def store(self, file: Path, key: str, features: torch.Tensor, labels: torch.Tensor) -> str | None:
        """Write an entry and remove the older ones it replaces; a note saying why not, if it could not."""
        from safetensors.torch import save_file

        features, labels = features.contiguous(), labels.cpu().contiguous()
        meta = {"key": key, "crc": str(zlib.crc32(features.numpy()))}
        try:
            with atomic_path(file) as tmp:
                save_file({"features": features, "labels": labels}, os.fspath(tmp), metadata=meta)
        except (VitkitError, OSError) as e:
            return f"features not cached ({e})"
        prefix = file.name.split("-", 1)[0]
        for old in self.folder.glob(f"{prefix}-*.safetensors"):
            if old != file and (old.is_symlink() or not old.is_dir()):
                with contextlib.suppress(OSError):
                    old.unlink()
        return None


def balanced_subset(images, per_class: int, seed: int = 0):
    """The ImageSet of at most ``per_class`` images of each class of ``images`` (all of a class that has
    fewer), drawn in a seeded order, kept in their order."""
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    labels = images.labels[order]
    keep = torch.cat([order[labels == c][:per_class] for c in range(len(images.classes))])
    return images.subset(keep.sort().values)


def budgeted_pass(model, todo: dict, seconds: float, *, device: torch.device, precision: str,
                  batch_size: int) -> tuple[dict, dict, str | None]:
    """The parts of ``todo`` (name -> ImageSet) whose features fit ``seconds``, as timed on a first batch (of
    a validation or test part when one is to compute: they are computed whole): all of them, else the
    training part cut to the images a class that fit, classes balanced, and a line saying so. A ConfigError
    when fewer than MIN_PER_CLASS a class fit. Also the timed batch's features, by part (kept, not computed
    again)."""
    part = min(todo, key=lambda p: p == "train")
    n = min(batch_size, len(todo[part]))
    t0 = time.perf_counter()
    first = compute_features(model, todo[part].subset(torch.arange(n)), device, precision, batch_size)
    per_image = (time.perf_counter() - t0) / max(n, 1)
    left = seconds - (time.perf_counter() - t0)
    total = sum(len(images) for images in todo.values())
    if (total - n) * per_image <= left:
        return todo, {part: first}, None
    train = todo.get("train")
    whole = total - (len(train) if train is not None else 0) - (n if part != "train" else 0)
    per_class = int((left - whole * per_image) / per_image) // len(train.classes) if train is not None else 0
    if per_class < MIN_PER_CLASS:
        raise ConfigError(f"--max-minutes: the probe's features of {total} images take about {total * per_image:.0f} s "
                          f"here ({per_image * 1000:.1f} ms an image), and {MIN_PER_CLASS} training images a class "
                          f"beside the evaluation's do not fit the {max(seconds, 0):.0f} s the budget leaves them; "
                          f"raise --max-minutes")
    subset = balanced_subset(train, per_class)
    note = (f"the budget fits the features of {per_class} training images a class ({len(subset)} of {len(train)}, "
            f"classes balanced; about {total * per_image:.0f} s for all of them, {max(seconds, 0):.0f} s left)")
    return {**todo, "train": subset}, ({part: first} if part != "train" else {}), note


def _entry(cache: FeatureCache | None, base: str, where: str, part: str, images) -> tuple:
    """The cache file and key of a part's images ((None, None): no cache)."""
    if cache is None:
        return None, None
    key = hashlib.sha256(f"{base}\0{images_digest(images)}".encode()).hexdigest()
    return cache.file(f"{base}\0{where}\0{part}", key), key


def split_features(model, splits: dict, *, device: torch.device, precision: str = "fp32", batch_size: int = 64,
                   cache_dir: str | os.PathLike | None = None, where: str = "", progress: Progress | None = None,
                   seconds: float | None = None) -> tuple[dict[str, FeatureSet], dict]:
    """The features of each ImageSet of ``splits`` (name -> set), read from ``cache_dir``'s entries or
    computed (with ``model`` on ``device``) and stored there; ``where`` names the data (its folder);
    ``seconds``: the time the pass may take (``budgeted_pass``: the training images cut to fit, or refused).
    Also what happened: ``feature_cache`` ('hit': every split read back, 'miss': one computed and stored,
    'miss, not cached': one could not be stored, 'off': no cache), ``feature_seconds`` and ``notes``."""
    t0, progress = time.perf_counter(), progress or Progress()
    cache = FeatureCache(cache_dir) if cache_dir is not None else None
    base = backbone_digest(model, precision) if cache is not None else ""
    model.to(device)
    out, todo = {}, {}
    for part, images in splits.items():
        file, key = _entry(cache, base, where, part, images)
        feats = cache.load(file, key, images.labels, model.num_features) if cache is not None else None
        if feats is None:
            todo[part] = images
        else:
            out[part] = FeatureSet(feats, images.labels.cpu())
    first, notes, uncached = {}, [], False
    if seconds is not None and todo:
        todo, first, note = budgeted_pass(model, todo, seconds - (time.perf_counter() - t0), device=device,
                                          precision=precision, batch_size=batch_size)
        notes += [note] if note else []
    for part, images in todo.items():
        done = first.get(part, torch.empty(0, model.num_features))
        rest = images.subset(torch.arange(len(done), len(images))) if len(done) else images
        with progress.task(f"features of the {part} images", len(images), unit="images", done=len(done)) as task:
            feats = torch.cat([done, compute_features(model, rest, device, precision, batch_size, task)])
        note = None if cache is None else cache.store(*_entry(cache, base, where, part, images), feats, images.labels)
        if note:
            notes.append(note)
            uncached = True
        out[part] = FeatureSet(feats, images.labels.cpu())
    status = "off" if cache is None else ("miss, not cached" if uncached else "miss") if todo else "hit"
    return ({part: out[part] for part in splits},
            {"feature_cache": status, "feature_seconds": round(time.perf_counter() - t0, 2), "notes": notes})


__all__ = ["FeatureSet", "FeatureCache", "compute_features", "backbone_digest", "images_digest", "split_features",
           "balanced_subset", "budgeted_pass", "VERSION", "MIN_PER_CLASS"]
