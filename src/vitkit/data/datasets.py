"""Datasets: class-folder trees, train/val folders, MNIST IDX files, CIFAR python batches, the demo set.

``open_dataset`` looks at a folder, tells its layout from the content, and returns ``DataSplits`` of
``ImageSet``s. Small datasets are decoded once (in parallel) and held in memory as one uint8 tensor
(N, C, H, W), or, decoded at a short side (whole images, their aspect ratios kept), as a ``RaggedImages``
store when their sizes differ; large ones keep file paths and decode on demand, e.g. in DataLoader
workers through ``ImageSet.as_dataset()``. With a ``cache_dir``, what decoding a folder gave is kept
there (``data.cache``) and a second opening of the same files with the same settings reads it back.
Unreadable files are skipped and listed in ``DataSplits.skipped`` (or, with ``strict=True``, the
first one is an error). Decoding a folder is counted on the ``progress`` given.
Every error is a one-line DataError naming the file or folder at fault.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import math
import os
import pickle
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..core.errors import DataError
from ..core.hardware import usable_cpus
from ..core.progress import Progress, Task
from ..core.strict import to_hw
from .cache import DecodeCache, check_outside
from .images import (
    DEFAULT_MAX_PIXELS,
    decode_array,
    header_size,
    is_image_name,
    open_regular,
    pil_limits,
    short_side_size,
    show_path,
    walk_images,
)
from .ragged import RaggedImages
from .splits import split_stratified

FORMATS = ("folder", "split-folder", "mnist", "cifar10", "cifar100", "demo")
DEMO_DIR = Path(__file__).resolve().parent / "demo"
MEMORY_BUDGET = 2 << 30  # in_memory=None holds a dataset in memory when its uint8 pixels fit in 2 GiB
VAL_NAMES = ("val", "valid", "validation")
TEST_NAMES = ("test",)
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


# ==================================================================================================
# ImageSet / DataSplits
@dataclass
class ImageSet:
    labels: torch.Tensor  # int64 (N,)
    classes: list[str]  # class names; label i is classes[i]
    images: torch.Tensor | None  # uint8 (N, C, H, W) when held in memory at one size
    paths: list[Path] | None  # image files when streamed (decoded on demand at `size` or `short_side`)
    size: tuple[int, int]  # (H, W) of every image get() returns; (S, S) for images of different sizes
    channels: int  # 1 grey or 3 RGB
    max_pixels: int | None = DEFAULT_MAX_PIXELS  # decompression-bomb limit for streamed files
    ragged: RaggedImages | None = None  # in memory, images of different sizes (decoded at short_side)
    short_side: int | None = None  # decoded as whole images, short side at most this (never enlarged),
    #   aspect ratio kept: unless they share one size (`images`), get() sizes differ and get_batch() gives
    #   a list; None = every image was brought to `size`

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def in_memory(self) -> bool:
        return self.images is not None or self.ragged is not None

    def get(self, i: int) -> tuple[torch.Tensor, int]:
        """Image i as uint8 (C, H, W) and its label."""
        i = int(i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"ImageSet: index {i} out of range for {len(self)} images")
        if self.images is not None:
            return self.images[i], int(self.labels[i])
        if self.ragged is not None:
            return self.ragged[i % len(self)], int(self.labels[i])
        size = None if self.short_side else self.size
        with pil_limits(self.max_pixels):
            a = decode_array(self.paths[i], self.channels, self.max_pixels, size, short_side=self.short_side)
        return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))), int(self.labels[i])

    def get_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
        """Images ``idx`` as uint8 (B, C, H, W) (a list of (C, h, w) when short_side is set) and int64
        labels (B,)."""
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        if self.images is not None:
            return self.images[idx], self.labels[idx]
        if self.ragged is not None:
            return self.ragged.take(idx), self.labels[idx]
        images = [self.get(int(i))[0] for i in idx]
        if self.short_side:
            return images, self.labels[idx]
        if len(idx) == 0:
            return torch.empty(0, self.channels, *self.size, dtype=torch.uint8), self.labels[idx]
        return torch.stack(images), self.labels[idx]

    def as_dataset(self) -> torch.utils.data.Dataset:
        """A torch Dataset view (items: uint8 (C, H, W), int label), picklable for DataLoader workers."""
        return _ImageSetDataset(self)

    def subset(self, idx) -> "ImageSet":
        """A new ImageSet of the images ``idx`` (in that order)."""
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        return ImageSet(
            labels=self.labels[idx].clone(),
            classes=list(self.classes),
            images=None if self.images is None else self.images[idx].contiguous(),
            paths=None if self.paths is None else [self.paths[int(i)] for i in idx],
            size=self.size,
            channels=self.channels,
            max_pixels=self.max_pixels,
            ragged=None if self.ragged is None else self.ragged.subset(idx),
            short_side=self.short_side,
        )

    def class_counts(self) -> list[int]:
        return torch.bincount(self.labels, minlength=len(self.classes)).tolist()

    def describe_size(self) -> str:
        """'3x32x32', or '3 channels, short side <= 256' for whole images of different sizes."""
        if self.short_side and self.images is None:
            return f"{self.channels} channel{'s' if self.channels > 1 else ''}, short side <= {self.short_side}"
        return f"{self.channels}x{self.size[0]}x{self.size[1]}"

    def __repr__(self) -> str:
        kind = "in memory" if self.in_memory else "streamed"
        return f"ImageSet({len(self)} images, {len(self.classes)} classes, {self.describe_size()}, {kind})"


class _ImageSetDataset(torch.utils.data.Dataset):
    def __init__(self, images: ImageSet):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        return self.images.get(i)


@dataclass
class DataSplits:
    train: ImageSet
    val: ImageSet | None  # split off train with `seed` when the data has no val part
    test: ImageSet | None  # the data's own held-out part (MNIST t10k, a test/ folder), if any
    classes: list[str]
    format: str  # 'folder' | 'split-folder' | 'mnist' | 'cifar10' | 'cifar100' | 'demo'
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason), files left out
    cache: str = "off"  # the decoded-image cache: 'hit' (every decoded part read back from it), 'miss'
    #   (decoded, and stored), 'miss, not cached' (decoded; storing failed: ``cache_notes`` says why), 'off' (no
    #   cache, or nothing to decode: arrays, streamed folders)
    cache_notes: list[str] = field(default_factory=list)  # why the cache could not be written, if so

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        return self.train.channels

    @property
    def size(self) -> tuple[int, int]:
        return self.train.size

    def summary(self) -> str:
        parts = [f"{self.format}: {len(self.classes)} classes, {self.train.describe_size()}",
                 f"train {len(self.train)}"]
        if self.val is not None:
            parts.append(f"val {len(self.val)}")
        if self.test is not None:
            parts.append(f"test {len(self.test)}")
        if self.skipped:
            parts.append(f"{len(self.skipped)} skipped")
        return ", ".join(parts)


# ==================================================================================================
# public entry point
def open_dataset(
    path: str | os.PathLike | None = None,
    fmt: str | None = None,
    *,
    channels: int | None = None,
    img_size: tuple[int, int] | int | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    strict: bool = False,
    in_memory: bool | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    num_workers: int | None = None,
    progress: Progress | None = None,
    short_side: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> DataSplits:
    """Open a dataset folder (layout detected from its content, or forced with ``fmt``).

    path None: the built-in demo set (10,000 MNIST digits: 8,000 train, 2,000 test).
    channels: 1 or 3 (None: 1 for MNIST, 3 otherwise). img_size: (H, W) to store/decode at (resize the
    short side + centre crop); None keeps the native size, which all images must then share.
    val_fraction: part of train split off (stratified, with ``seed``) as val when the data has no val
    part; 0 = none. strict: the first unreadable file is an error (else skipped and listed).
    in_memory: None = auto (in memory when the pixels fit in 2 GiB). max_pixels: decompression-bomb
    limit per image (None = none). num_workers: decode processes for big folders (None = up to 8, one per
    core). progress: where decoding (or reading the headers of) image folders is counted (default: nowhere).
    short_side: instead of img_size, keep image folders' whole images, shrunk (never enlarged) so that
    their short side is at most this; images of one size share a tensor, others are held as a
    ``RaggedImages`` store (or streamed). cache_dir: keep what decoding an image folder gave in this
    folder (``data.cache``; never inside the data folder) and read it back on the next opening; None = no
    cache. ``DataSplits.cache`` says whether it was used.
    """
    if fmt is not None and fmt not in FORMATS:
        raise DataError(f"fmt: unknown dataset format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if channels is not None and channels not in (1, 3):
        raise DataError(f"channels: must be 1 (grey) or 3 (RGB), got {channels!r}")
    if not isinstance(val_fraction, (int, float)) or not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction: must be in [0, 1), got {val_fraction!r}")
    img_size = _check_sizes(img_size, short_side)
    cache = DecodeCache(cache_dir) if cache_dir is not None else None
    opts = _Opts(channels, img_size, strict, in_memory, max_pixels, num_workers, progress or Progress(),
                 short_side, cache)

    if path is None:
        if fmt not in (None, "demo"):
            raise DataError(f"fmt={fmt!r} needs a dataset path (no path = the built-in demo set)")
        fmt, root = "demo", DEMO_DIR
    else:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        root = Path(path).expanduser()
        _check_folder(root)
        if cache_dir is not None:
            check_outside(cache_dir, root)
        if fmt is None:
            fmt, root = detect_format(root)
        elif fmt == "demo":
            raise DataError(f"fmt='demo' is the built-in set; it takes no path (got {show_path(root)})")
        else:
            sub = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}.get(fmt)
            if sub and (root / sub).is_dir():  # the folder the official tarball unpacks to
                root = root / sub

    loader = {"folder": _open_folder, "split-folder": _open_split_folder, "mnist": _open_mnist,
              "demo": _open_mnist, "cifar10": _open_cifar, "cifar100": _open_cifar}[fmt]
    opts.root = root
    train, val, test, skipped = loader(root, fmt, opts)

    if val is None and val_fraction > 0:
        train, val = split_stratified(train, val_fraction, seed, where=show_path(root))
    return DataSplits(train=train, val=val, test=test, classes=list(train.classes), format=fmt,
                      skipped=skipped, cache=opts.cache_summary(), cache_notes=opts.cache_notes)


def _check_sizes(img_size, short_side) -> tuple[int, int] | None:
    """img_size as (H, W) (or None); DataError for a bad short_side, or both given."""
    if img_size is not None:
        img_size = to_hw(img_size, "img_size", DataError)
    if short_side is not None:
        if img_size is not None:
            raise DataError("short_side: give img_size (one size, centre cropped) or short_side (whole images), not both")
        if isinstance(short_side, bool) or not isinstance(short_side, int) or short_side < 1:
            raise DataError(f"short_side: must be a positive integer, got {short_side!r}")
    return img_size


@dataclass
class _Opts:
    channels: int | None
    img_size: tuple[int, int] | None
    strict: bool
    in_memory: bool | None
    max_pixels: int | None
    num_workers: int | None
    progress: Progress
    short_side: int | None = None
    cache: DecodeCache | None = None
    root: Path = Path(".")  # the dataset's folder, that cache keys name files relative to
    cache_used: list[str] = field(default_factory=list)  # 'hit' | 'miss' of each part decoded with a cache
    cache_notes: list[str] = field(default_factory=list)

    def cache_summary(self) -> str:
        """'hit' when every decoded part came from the cache, 'miss' when one was decoded (and stored), 'miss,
        not cached' when one could not be stored, else 'off'."""
        used = set(self.cache_used)
        return "hit" if used == {"hit"} else "miss, not cached" if "uncached" in used else "miss" if used else "off"


def _check_folder(root: Path) -> None:
    if root.is_symlink() and not root.exists():
        raise DataError(f"{show_path(root)}: broken symbolic link")
    if not root.exists():
        raise DataError(f"{show_path(root)}: no such folder")
    if not root.is_dir():
        raise DataError(f"{show_path(root)}: is a file; expected a dataset folder")


def _entries(root: Path) -> tuple[list[Path], list[Path]]:
    """Non-hidden (dirs, files) of a folder, sorted by name."""
    dirs, files = [], []
    try:
        it = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as e:
        raise DataError(f"{show_path(root)}: cannot list folder ({e.strerror or e})") from None
    for e in it:
        if e.name.startswith("."):
            continue
        try:
            (dirs if e.is_dir() else files).append(Path(e.path))
        except OSError:
            files.append(Path(e.path))
    return dirs, files


# ==================================================================================================
# format detection
_IDX_RE = re.compile(r"idx[13]", re.IGNORECASE)


def detect_format(root: Path) -> tuple[str, Path]:
    """(format, folder to read) from a folder's content; DataError when nothing fits."""
    dirs, files = _entries(root)
    names = {p.name for p in files}
    dnames = {p.name.lower(): p for p in dirs}
    if any(n.startswith("data_batch_") for n in names) or "test_batch" in names:
        return "cifar10", root
    if {"train", "test"} <= names or ("meta" in names and ({"train", "test"} & names)):
        return "cifar100", root
    if any(_IDX_RE.search(n) for n in names):
        return "mnist", root
    for sub in ("cifar-10-batches-py", "cifar-100-python"):
        if sub in dnames:
            return detect_format(dnames[sub])
    # train/ with class folders inside, next to val/ or test/ (or alone). A class that happens to be
    # called "train" holds images, not folders, so a class-folder tree is not mistaken for this.
    if "train" in dnames and _entries(dnames["train"])[0]:
        others = set(dnames) - {"train"}
        if others & set(VAL_NAMES + TEST_NAMES) or not others:
            return "split-folder", root
    if dirs:
        return "folder", root
    if not files:
        raise DataError(f"{show_path(root)}: empty folder (no class folders, IDX or CIFAR files)")
    n_img = sum(is_image_name(p.name) for p in files)
    if n_img:
        raise DataError(f"{show_path(root)}: {n_img} image(s) at the top level but no class folders; "
                        f"put each class's images in a subfolder named after the class")
    raise DataError(f"{show_path(root)}: cannot tell the dataset format (expected class folders, train/ + "
                    f"val/ folders, MNIST IDX files or CIFAR batches); found {len(files)} other file(s)")


# ==================================================================================================
# class folders
def _class_items(root: Path, classes: list[str] | None, skipped: list) -> tuple[list[str], list[tuple[Path, int]]]:
    """(classes, [(file, label)]) of a class-folder tree. Files at the top level are ignored (noted in
    ``skipped``); with ``classes`` given (a val/test part), a folder name outside them is an error."""
    dirs, files = _entries(root)
    for f in files:
        skipped.append((show_path(f), "file at the top level of a class-folder tree, not in a class folder; ignored"))
    if not dirs:
        raise DataError(f"{show_path(root)}: no class folders (each class's images go in a subfolder named after it)")
    names = [d.name for d in dirs]
    if classes is None:
        classes = names
    else:
        extra = [n for n in names if n not in classes]
        if extra:
            raise DataError(f"{show_path(root / extra[0])}: class {show_path(extra[0])!r} is not among the "
                            f"training classes")
    index = {c: i for i, c in enumerate(classes)}
    items: list[tuple[Path, int]] = []
    for d in dirs:
        found = walk_images(d)
        if not found:
            raise DataError(f"{show_path(d)}: class folder has no images (.jpg .png .bmp .webp .gif .tif ...)")
        items.extend((p, index[d.name]) for p in found)
    return classes, items


def _open_folder(root: Path, fmt: str, o: _Opts):
    skipped: list[tuple[str, str]] = []
    classes, items = _class_items(root, None, skipped)
    train = _materialize(items, classes, o, skipped, where=root)
    return train, None, None, skipped


def _open_split_folder(root: Path, fmt: str, o: _Opts):
    skipped: list[tuple[str, str]] = []
    dirs, files = _entries(root)
    by = {d.name.lower(): d for d in dirs}
    if "train" not in by:
        raise DataError(f"{show_path(root)}: no train/ folder (a split-folder dataset has train/ and val/ or test/)")
    classes, items = _class_items(by["train"], None, skipped)
    parts = {}
    for kind, names in (("val", VAL_NAMES), ("test", TEST_NAMES)):
        for n in names:
            if n in by:
                _, its = _class_items(by[n], classes, skipped)
                parts[kind] = its
                break
    # one size for all parts: decide it from train, then hold val/test to it
    train = _materialize(items, classes, o, skipped, where=by["train"])
    o2 = dataclasses.replace(o, channels=train.channels, img_size=None if o.short_side else o.img_size or train.size,
                             in_memory=train.in_memory if o.in_memory is None else o.in_memory)
    val = _materialize(parts["val"], classes, o2, skipped, where=root, part="val") if "val" in parts else None
    test = _materialize(parts["test"], classes, o2, skipped, where=root, part="test") if "test" in parts else None
    return train, val, test, skipped


# --------------------------------------------------------------------------------------------------
def _workers(n: int | None, count: int) -> int:
    if n is not None:
        return max(1, int(n))
    return max(1, min(8, usable_cpus(), count // 512 or 1))


def _work_chunk(args) -> list:
    """Decode (kind 'decode') or read the header of (kind 'header') each path of a chunk; runs in a worker
    process. Returns [(value, None) | (None, error message)]."""
    kind, paths, channels, max_pixels, size, short_side = args
    out = []
    with pil_limits(max_pixels):
        for p in paths:
            try:
                v = (decode_array(p, channels, max_pixels, size, short_side) if kind == "decode"
                     else header_size(p, max_pixels))
                out.append((v, None))
            except DataError as e:
                out.append((None, str(e)))
    return out


def _pmap(kind: str, paths: list[Path], channels: int, max_pixels, size, short_side, workers: int, task: Task) -> list:
    """_work_chunk over all ``paths`` in chunks, each counted on ``task`` when done: in this process for
    small jobs, else in a pool of ``workers`` processes (Pillow's per-file Python overhead holds the GIL,
    so threads would not scale)."""
    import multiprocessing as mp

    step = max(64, min(1024, len(paths) // (workers * 4)))
    jobs = [(kind, paths[i : i + step], channels, max_pixels, size, short_side) for i in range(0, len(paths), step)]
    if (workers <= 1 or len(paths) < 1024 or "fork" not in mp.get_all_start_methods()
            or mp.current_process().daemon):  # a daemon process (e.g. a DataLoader worker) may not fork
        return _gather(map(_work_chunk, jobs), task)
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as ex:
            return _gather(ex.map(_work_chunk, jobs), task)
    except (BrokenProcessPool, OSError):  # pragma: no cover - no processes available: decode here
        return _gather(map(_work_chunk, jobs), task)


def _gather(chunks, task: Task) -> list:
    """The results of ``chunks`` (in order), counted on ``task`` as each chunk comes in."""
    out: list = []
    for chunk in chunks:
        out.extend(chunk)
        task.update(len(out))
    return out


def _materialize(items: list[tuple[Path, int]], classes: list[str], o: _Opts, skipped: list, where: Path,
                 part: str = "") -> ImageSet:
    """Decode (or, for large sets, check the headers of) ``items`` into an ImageSet; ``part`` names the
    split in the progress shown when ``where`` holds several."""
    channels = o.channels or 3
    in_memory = o.in_memory if o.in_memory is not None else _fits_in_memory(items, channels, o)
    res = _decode_items([p for p, _ in items], channels, in_memory, o, where, part)
    keep, vals = [], []
    for (p, lab), (v, err) in zip(items, res):
        if err is not None:
            if o.strict:
                raise DataError(err)
            shown = show_path(p)
            skipped.append((shown, err[len(shown) + 2:] if err.startswith(shown + ": ") else err))
            continue
        keep.append((p, lab))
        vals.append(v)
    if not keep:
        raise DataError(f"{show_path(where)}: none of the {len(items)} image(s) could be read "
                        f"(first: {skipped[-len(items)][0]}: {skipped[-len(items)][1]})")
    shapes = [tuple(v.shape[:2]) if in_memory else tuple(v) for v in vals]
    labels = torch.tensor([lab for _, lab in keep], dtype=torch.long)
    common = shapes[0] if all(sh == shapes[0] for sh in shapes) else None
    if o.short_side and not in_memory:
        return ImageSet(labels, list(classes), None, [p for p, _ in keep], (o.short_side,) * 2, channels,
                        o.max_pixels, short_side=o.short_side)
    if o.short_side and common is None:  # whole images of different sizes
        return ImageSet(labels, list(classes), None, None, (o.short_side,) * 2, channels, o.max_pixels,
                        ragged=RaggedImages.from_arrays(vals), short_side=o.short_side)
    size = o.img_size or common
    if size is None:
        i = next(i for i, sh in enumerate(shapes) if sh != shapes[0])
        raise DataError(
            f"{show_path(where)}: images have different sizes ({show_path(keep[0][0])} is "
            f"{shapes[0][0]}x{shapes[0][1]}, {show_path(keep[i][0])} is {shapes[i][0]}x{shapes[i][1]}); "
            "pass img_size to resize them")
    if in_memory:
        arr = np.stack(vals)  # (N, H, W, C)
        images = torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()  # (N, C, H, W)
        return ImageSet(labels, list(classes), images, None, tuple(size), channels, o.max_pixels,
                        short_side=o.short_side)
    return ImageSet(labels, list(classes), None, [p for p, _ in keep], tuple(size), channels, o.max_pixels)


def _fits_in_memory(items: list[tuple[Path, int]], channels: int, o: _Opts) -> bool:
    """Whether the decoded pixels fit MEMORY_BUDGET, estimated from img_size or the first readable header
    (brought to short_side)."""
    probe = o.img_size
    with pil_limits(o.max_pixels):
        for p, _ in items[:16]:
            if probe is not None:
                break
            try:
                probe = header_size(p, o.max_pixels)
            except DataError:
                continue
    probe = probe or (32, 32)
    if o.short_side:
        probe = short_side_size(*probe, o.short_side)
    return len(items) * channels * probe[0] * probe[1] <= MEMORY_BUDGET


def _decode_items(paths: list[Path], channels: int, in_memory: bool, o: _Opts, where: Path, part: str) -> list:
    """[(array or header size, None) | (None, error)] of each path: decoded (``in_memory``; read back from
    the cache when it holds them, else stored there) or its header read, counted on a progress task."""
    kind = "decode" if in_memory else "header"
    entry = None
    if kind == "decode" and o.cache is not None:
        settings = {"channels": channels, "size": o.img_size, "short_side": o.short_side, "max_pixels": o.max_pixels}
        entry = o.cache.key(o.root, paths, settings, part=f"{where}:{part}")
        found = o.cache.load(*entry, len(paths), fits=functools.partial(_decoded_fits, channels, o))
        if found is not None:
            o.cache_used.append("hit")
            return found
    what = f"{'decoding' if in_memory else 'reading the headers of'} {show_path(where)}"
    what += f" ({part})" if part else ""
    with o.progress.task(what, len(paths), unit="images") as task:
        res = _pmap(kind, paths, channels, o.max_pixels, o.img_size, o.short_side,
                    _workers(o.num_workers, len(paths)), task)
    if entry is not None:
        note = o.cache.store(*entry, res)
        o.cache_used.append("uncached" if note else "miss")
        if note:
            o.cache_notes.append(note)
    return res


def _decoded_fits(channels: int, o: _Opts, h: int, w: int, c: int) -> bool:
    """Whether an h x w x c image is one that decoding with ``o``'s settings can give (a cache entry's)."""
    if c != channels:
        return False
    if o.img_size is not None:
        return (h, w) == tuple(o.img_size)
    return o.short_side is None or min(h, w) <= o.short_side


# ==================================================================================================
# arrays (MNIST, CIFAR) -> ImageSet
def _array_set(images: torch.Tensor, labels: torch.Tensor, classes: list[str], o: _Opts, native_c: int) -> ImageSet:
    """uint8 (N, C, H, W) in the data's own channels -> ImageSet at the requested channels and size."""
    channels = o.channels or native_c
    if channels != images.shape[1]:
        if channels == 3:
            images = images.expand(-1, 3, -1, -1).contiguous()
        else:  # RGB -> grey with ITU-R 601 luma, as Pillow's convert('L')
            w = torch.tensor([299, 587, 114], dtype=torch.int32).view(1, 3, 1, 1)
            images = ((images.int() * w).sum(1, keepdim=True) + 500).div(1000, rounding_mode="floor").to(torch.uint8)
    size = tuple(images.shape[-2:])
    if o.img_size is not None and tuple(o.img_size) != size:
        images = _resize_uint8(images, o.img_size)
        size = tuple(o.img_size)
    return ImageSet(labels, classes, images, None, size, channels, o.max_pixels)


def _resize_uint8(images: torch.Tensor, size: tuple[int, int], chunk: int = 4096) -> torch.Tensor:
    from .images import resize_center_crop

    out = torch.empty(images.shape[0], images.shape[1], *size, dtype=torch.uint8)
    for s in range(0, images.shape[0], chunk):
        x = resize_center_crop(images[s : s + chunk].float(), size, 1.0, "bicubic")
        out[s : s + chunk] = x.round_().clamp_(0, 255).to(torch.uint8)
    return out


# --------------------------------------------------------------------------------------------------
# MNIST IDX
def _read_bytes(path: Path) -> bytes:
    try:
        with open_regular(path) as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{show_path(path)}: cannot read ({type(e).__name__}: {e})") from None
    return raw


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file (gzip or raw) of unsigned bytes with ``ndim`` dimensions as a numpy array."""
    raw = _read_bytes(path)
    shown = show_path(path)
    if len(raw) < 4:
        raise DataError(f"{shown}: too short for an IDX file ({len(raw)} bytes)")
    magic = int.from_bytes(raw[:4], "big")
    want = 0x800 + ndim
    if magic != want:
        raise DataError(f"{shown}: bad magic number 0x{magic:08x} (expected 0x{want:08x} for an IDX "
                        f"file of unsigned bytes with {ndim} dimension(s))")
    hdr = 4 + 4 * ndim
    if len(raw) < hdr:
        raise DataError(f"{shown}: truncated IDX header ({len(raw)} bytes)")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    n = math.prod(dims)  # Python ints: a forged header cannot overflow
    if len(raw) - hdr != n:
        raise DataError(f"{shown}: wrong size: header says {'x'.join(map(str, dims))} = {n} bytes of data, "
                        f"file has {len(raw) - hdr}")
    return np.frombuffer(raw, dtype=np.uint8, offset=hdr).reshape(dims)


def _open_mnist(root: Path, fmt: str, o: _Opts):
    files = [p for p in _entries(root)[1]]
    found: dict[tuple[str, str], Path] = {}
    for p in files:
        n = p.name.lower()
        kind = "images" if "idx3" in n else "labels" if "idx1" in n else None
        if kind is None:
            continue
        part = "test" if n.startswith(("t10k", "test")) else "train"
        if (part, kind) in found:
            raise DataError(f"{show_path(p)}: a second {part} {kind} file (also {show_path(found[(part, kind)])})")
        found[(part, kind)] = p
    if ("train", "images") not in found:
        raise DataError(f"{show_path(root)}: no MNIST train images file (train-images-idx3-ubyte[.gz])")
    classes = [str(i) for i in range(10)]
    sets = {}
    for part in ("train", "test"):
        if (part, "images") not in found:
            if (part, "labels") in found:
                raise DataError(f"{show_path(found[(part, 'labels')])}: labels without a matching {part} images file")
            continue
        if (part, "labels") not in found:
            raise DataError(f"{show_path(found[(part, 'images')])}: no matching {part} labels file (*-labels-idx1-ubyte)")
        ip, lp = found[(part, "images")], found[(part, "labels")]
        imgs = read_idx(ip, 3)
        labs = read_idx(lp, 1)
        if len(imgs) != len(labs):
            raise DataError(f"{show_path(lp)}: {len(labs)} labels for {len(imgs)} images in {show_path(ip)}")
        if len(labs) == 0:
            raise DataError(f"{show_path(ip)}: no images")
        bad = np.nonzero(labs >= 10)[0]
        if len(bad):
            raise DataError(f"{show_path(lp)}: label {int(labs[bad[0]])} at index {int(bad[0])} is out of range 0..9")
        images = torch.from_numpy(imgs.copy())[:, None]  # (N, 1, H, W)
        sets[part] = _array_set(images, torch.from_numpy(labs.astype(np.int64)), classes, o, 1)
    return sets["train"], None, sets.get("test"), []


# --------------------------------------------------------------------------------------------------
# CIFAR python batches (pickles), read without executing code
class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles dicts/lists/numbers/strings and numpy arrays; any other global is refused, so a
    malicious pickle cannot run code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),  # protocol 5 arrays
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
    }

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise _Refused(f"refusing global {module}.{name}")

    def persistent_load(self, pid):
        raise _Refused("refusing persistent ids")


class _Refused(pickle.UnpicklingError):
    pass


def safe_unpickle(path: Path) -> dict:
    """A CIFAR batch file -> dict with str keys; DataError when it is not a pickle of plain data."""
    raw = _read_bytes(path)
    import io

    try:
        obj = _NumpyOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except _Refused as e:
        raise DataError(f"{show_path(path)}: not a plain-data pickle ({e}); refusing to load it") from None
    except Exception as e:  # noqa: BLE001 - truncated or garbage data
        raise DataError(f"{show_path(path)}: not a readable CIFAR batch ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{show_path(path)}: expected a pickled dict, got {type(obj).__name__}")
    return {(k.decode("latin1") if isinstance(k, bytes) else str(k)): v for k, v in obj.items()}


def _cifar_part(path: Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    d = safe_unpickle(path)
    shown = show_path(path)
    if "data" not in d:
        raise DataError(f"{shown}: no 'data' entry (keys: {', '.join(sorted(d)) or 'none'})")
    if label_key not in d:
        raise DataError(f"{shown}: no {label_key!r} entry (keys: {', '.join(sorted(d))})")
    data = d["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        what = data.dtype if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{shown}: 'data' must be a uint8 array, got {what}")
    if data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"{shown}: wrong size: 'data' has shape {tuple(data.shape)}, expected (N, 3072) = 3x32x32 images")
    try:
        labels = np.asarray(d[label_key], dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise DataError(f"{shown}: {label_key!r} is not a list of integers") from None
    if len(labels) != len(data):
        raise DataError(f"{shown}: {len(labels)} labels for {len(data)} images")
    bad = np.nonzero((labels < 0) | (labels >= num_classes))[0]
    if len(bad):
        raise DataError(f"{shown}: label {int(labels[bad[0]])} at index {int(bad[0])} is out of range "
                        f"0..{num_classes - 1}")
    return data.reshape(-1, 3, 32, 32), labels


def _names_from_meta(path: Path, key: str, n: int) -> list[str] | None:
    if not path.is_file():
        return None
    d = safe_unpickle(path)
    names = d.get(key)
    if not isinstance(names, (list, tuple)) or len(names) != n:
        raise DataError(f"{show_path(path)}: {key!r} should list {n} class names")
    return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in names]


def _open_cifar(root: Path, fmt: str, o: _Opts):
    if fmt == "cifar10":
        n_cls, key = 10, "labels"
        train_files = sorted((p for p in _entries(root)[1] if re.fullmatch(r"data_batch_\d+", p.name)),
                             key=lambda p: int(p.name.rsplit("_", 1)[1]))
        test_file = root / "test_batch"
        classes = _names_from_meta(root / "batches.meta", "label_names", 10) or list(CIFAR10_CLASSES)
        if not train_files:
            raise DataError(f"{show_path(root)}: no CIFAR-10 training batches (data_batch_1 ... data_batch_5)")
    else:
        n_cls, key = 100, "fine_labels"
        train_files = [root / "train"]
        test_file = root / "test"
        if not train_files[0].is_file():
            raise DataError(f"{show_path(root)}: no CIFAR-100 'train' file")
        classes = _names_from_meta(root / "meta", "fine_label_names", 100) or [str(i) for i in range(100)]
    parts = [_cifar_part(p, key, n_cls) for p in train_files]
    imgs = np.concatenate([p[0] for p in parts])
    labs = np.concatenate([p[1] for p in parts])
    train = _array_set(torch.from_numpy(imgs), torch.from_numpy(labs), classes, o, 3)
    test = None
    if test_file.is_file():
        ti, tl = _cifar_part(test_file, key, n_cls)
        test = _array_set(torch.from_numpy(ti), torch.from_numpy(tl), classes, o, 3)
    return train, None, test, []


# ==================================================================================================
def join_sets(parts: list[ImageSet]) -> ImageSet:
    """One ImageSet of ``parts`` in turn (the splits of one dataset: same classes, size and storage)."""
    first = parts[0]
    return ImageSet(
        labels=torch.cat([p.labels for p in parts]),
        classes=list(first.classes),
        images=None if first.images is None else torch.cat([p.images for p in parts]),
        paths=None if first.paths is None else [path for p in parts for path in p.paths],
        size=first.size,
        channels=first.channels,
        max_pixels=first.max_pixels,
        ragged=None if first.ragged is None else RaggedImages.join([p.ragged for p in parts]),
        short_side=first.short_side,
    )


__all__ = ["ImageSet", "DataSplits", "open_dataset", "detect_format", "join_sets", "read_idx",
           "safe_unpickle", "FORMATS", "DEMO_DIR"]
