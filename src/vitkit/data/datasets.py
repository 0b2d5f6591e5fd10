"""Datasets: the front over the formats, each owned by one module that opens it and describes it for a
recipe (``FORMAT_MODULES``): class folders and split folders (``folders``), MNIST IDX files and the
built-in demo digits (``mnist``), CIFAR python batches (``cifar``); what they give is ``sets``'.

``open_dataset`` looks at a folder, tells its layout from the content (``detect_dataset_format``), and
returns ``DataSplits`` of ``ImageSet``s; ``probe_data`` describes it (``DataFacts``) from listings and
headers, nothing decoded. Small datasets are decoded once (in parallel) and held in memory as one uint8
tensor (N, C, H, W), or, decoded at a short side (whole images, their aspect ratios kept), as a
``RaggedImages`` store when their sizes differ; large ones keep file paths and decode on demand, e.g. in
DataLoader workers through ``ImageSet.as_dataset()``. With a ``cache_dir``, what decoding a folder gave
is kept there (``data.cache``) and a second opening of the same files with the same settings reads it
back. Unreadable files are skipped and listed in ``DataSplits.skipped`` (or, with ``strict=True``, the
first one is an error). Decoding a folder is counted on the ``progress`` given. Every error is a
one-line DataError naming the file or folder at fault.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..core.errors import DataError
from ..core.progress import Progress
from ..core.strict import to_hw
from .cache import DecodeCache, check_outside
from .cifar import CIFAR_DIRS, describe_cifar, open_cifar
from .folders import TEST_NAMES, VAL_NAMES, describe_folder, open_folder, open_split_folder
from .images import DEFAULT_MAX_PIXELS, is_image_name, show_path
from .mnist import IDX_RE, describe_mnist, open_mnist
from .ragged import RaggedImages
from .sets import DataFacts, DataSplits, ImageSet, OpenOptions, list_entries
from .splits import split_stratified

DEMO_DIR = Path(__file__).resolve().parent / "demo"
# the formats, each owned by one module: name -> (open(root, fmt, options), describe(root, fmt) -> DataFacts)
FORMAT_MODULES = {
    "folder": (open_folder, describe_folder),
    "split-folder": (open_split_folder, describe_folder),
    "mnist": (open_mnist, lambda root, fmt: describe_mnist(root)),
    "cifar10": (open_cifar, describe_cifar),
    "cifar100": (open_cifar, describe_cifar),
    "demo": (open_mnist, lambda root, fmt: describe_mnist(root)),
}
FORMATS = tuple(FORMAT_MODULES)


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
    cached_only: bool = False,
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
    cache. ``DataSplits.cache`` says whether it was used. cached_only: with ``cache_dir``, read only what the
    cache holds: a part it would decode raises ``data.cache.CacheMiss`` (a distributed run's processes read a
    filled cache side by side, and leave a miss to one of them).
    """
    if fmt is not None and fmt not in FORMATS:
        raise DataError(f"fmt: unknown dataset format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if channels is not None and channels not in (1, 3):
        raise DataError(f"channels: must be 1 (grey) or 3 (RGB), got {channels!r}")
    if not isinstance(val_fraction, (int, float)) or not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction: must be in [0, 1), got {val_fraction!r}")
    img_size = _check_sizes(img_size, short_side)
    cache = DecodeCache(cache_dir) if cache_dir is not None else None
    opts = OpenOptions(channels, img_size, strict, in_memory, max_pixels, num_workers, progress or Progress(),
                       short_side, cache, cached_only=cached_only and cache is not None)

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
            fmt, root = detect_dataset_format(root)
        elif fmt == "demo":
            raise DataError(f"fmt='demo' is the built-in set; it takes no path (got {show_path(root)})")
        else:
            sub = CIFAR_DIRS.get(fmt)
            if sub and (root / sub).is_dir():  # the folder the official tarball unpacks to
                root = root / sub

    loader = FORMAT_MODULES[fmt][0]
    opts.root = root
    train, val, test, skipped = loader(root, fmt, opts)

    held_out = val_fraction if val is None and val_fraction > 0 else 0.0
    if held_out:
        train, val = split_stratified(train, val_fraction, seed, where=show_path(root))
    return DataSplits(train=train, val=val, test=test, classes=list(train.classes), format=fmt,
                      skipped=skipped, cache=opts.cache_summary(), cache_notes=opts.cache_notes, held_out=held_out)


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



def _check_folder(root: Path) -> None:
    if root.is_symlink() and not root.exists():
        raise DataError(f"{show_path(root)}: broken symbolic link")
    if not root.exists():
        raise DataError(f"{show_path(root)}: no such folder")
    if not root.is_dir():
        raise DataError(f"{show_path(root)}: is a file; expected a dataset folder")


# ==================================================================================================
# format detection


def detect_dataset_format(root: Path) -> tuple[str, Path]:
    """(format, folder to read) from a folder's content; DataError when nothing fits."""
    dirs, files = list_entries(root)
    names = {p.name for p in files}
    dnames = {p.name.lower(): p for p in dirs}
    if any(n.startswith("data_batch_") for n in names) or "test_batch" in names:
        return "cifar10", root
    if {"train", "test"} <= names or ("meta" in names and ({"train", "test"} & names)):
        return "cifar100", root
    if any(IDX_RE.search(n) for n in names):
        return "mnist", root
    for sub in CIFAR_DIRS.values():
        if sub in dnames:
            return detect_dataset_format(dnames[sub])
    # train/ with class folders inside, next to val/ or test/ (or alone). A class that happens to be
    # called "train" holds images, not folders, so a class-folder tree is not mistaken for this.
    if "train" in dnames and list_entries(dnames["train"])[0]:
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


def probe_data(path: str | os.PathLike, fmt: str | None = None) -> DataFacts:
    """The facts of the dataset at ``path`` (``fmt``: its format, else detected), read from listings
    and headers. Problems open_dataset would report (a missing folder, an unknown layout) are
    DataErrors here too; unreadable images are passed over (the run reports them)."""
    root = Path(path).expanduser()
    _check_folder(root)
    if fmt is None:
        fmt, root = detect_dataset_format(root)
    return FORMAT_MODULES[fmt][1](root, fmt)


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


__all__ = ["ImageSet", "DataSplits", "DataFacts", "open_dataset", "detect_dataset_format", "probe_data", "join_sets",
           "FORMATS", "FORMAT_MODULES", "DEMO_DIR"]
