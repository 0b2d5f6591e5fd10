"""Class folders (``folder``: root/<class>/*) and split folders (``split-folder``: train/, val/, test/ of
class folders): opening them (decoding in parallel, in memory, ragged or streamed, through the cache) and
describing them for a recipe from a few image headers (``describe_folder``)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import torch

from ..core.errors import DataError
from ..core.hardware import usable_cpus
from ..core.progress import Task
from .cache import CacheMiss
from .images import decode_array, header_size, pil_limits, short_side_size, show_path, walk_images
from .ragged import RaggedImages
from .sets import DataFacts, ImageSet, OpenOptions, list_entries

MEMORY_BUDGET = 2 << 30  # in_memory=None holds a dataset in memory when its uint8 pixels fit in 2 GiB
VAL_NAMES = ("val", "valid", "validation")
TEST_NAMES = ("test",)
HEADERS_SAMPLED = 32  # image headers read to tell the size and channels of a folder


def _class_items(root: Path, classes: list[str] | None, skipped: list) -> tuple[list[str], list[tuple[Path, int]]]:
    """(classes, [(file, label)]) of a class-folder tree. Files at the top level are ignored (noted in
    ``skipped``); with ``classes`` given (a val/test part), a folder name outside them is an error."""
    dirs, files = list_entries(root)
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


def open_folder(root: Path, fmt: str, o: OpenOptions):
    skipped: list[tuple[str, str]] = []
    classes, items = _class_items(root, None, skipped)
    train = _materialize(items, classes, o, skipped, where=root)
    return train, None, None, skipped


def _split_parts(by: dict[str, Path]) -> dict[str, Path]:
    """The folders of a split folder's validation and test parts ('val', 'test'), where it has them, from its
    subfolders by lower-cased name: the first of VAL_NAMES, and of TEST_NAMES, that is there."""
    found = {kind: next((by[n] for n in names if n in by), None) for kind, names in (("val", VAL_NAMES),
                                                                                     ("test", TEST_NAMES))}
    return {kind: d for kind, d in found.items() if d is not None}


def open_split_folder(root: Path, fmt: str, o: OpenOptions):
    skipped: list[tuple[str, str]] = []
    dirs, files = list_entries(root)
    by = {d.name.lower(): d for d in dirs}
    if "train" not in by:
        raise DataError(f"{show_path(root)}: no train/ folder (a split-folder dataset has train/ and val/ or test/)")
    classes, items = _class_items(by["train"], None, skipped)
    parts = {kind: _class_items(d, classes, skipped)[1] for kind, d in _split_parts(by).items()}
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


def _materialize(items: list[tuple[Path, int]], classes: list[str], o: OpenOptions, skipped: list, where: Path,
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


def _fits_in_memory(items: list[tuple[Path, int]], channels: int, o: OpenOptions) -> bool:
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


def _decode_items(paths: list[Path], channels: int, in_memory: bool, o: OpenOptions, where: Path, part: str) -> list:
    """[(array or header size, None) | (None, error)] of each path: decoded (``in_memory``; read back from
    the cache when it holds them, else stored there) or its header read, counted on a progress task."""
    kind = "decode" if in_memory else "header"
    if kind == "decode" and o.cache is not None:
        settings = {"channels": channels, "size": o.img_size, "short_side": o.short_side, "max_pixels": o.max_pixels}
        entry = o.cache.key(o.root, paths, settings, part=f"{where}:{part}")
        fits = functools.partial(_decoded_fits, channels, o)
        found = o.cache.load(*entry, len(paths), fits=fits)
        if found is not None:
            o.cache_used.append("hit")
            return found
        if o.cached_only:
            raise CacheMiss(f"{show_path(where)}{f' ({part})' if part else ''}: not in the cache {o.cache.folder}")
        waiting = functools.partial(o.progress.task, f"waiting while another process decodes {show_path(where)}"
                                    + (f" ({part})" if part else ""), len(paths), unit="images", rate=False,
                                    closing=False)  # shown while it waits; the run's loading line says the rest
        with o.cache.decoding(entry[0], waiting):  # another process decoding the same folder: wait, then read it
            found = o.cache.load(*entry, len(paths), fits=fits)
            if found is None:
                return _decode_now(paths, channels, kind, o, where, part, entry)
        o.cache_used.append("shared")
        return found
    return _decode_now(paths, channels, kind, o, where, part, None)


def _decode_now(paths: list[Path], channels: int, kind: str, o: OpenOptions, where: Path, part: str,
                entry: tuple[str, str] | None) -> list:
    """``_decode_items``' work where the cache did not have it: decode (or read the headers), in parallel,
    and store what decoding gave under ``entry`` (None: no cache)."""
    in_memory = kind == "decode"
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


def _decoded_fits(channels: int, o: OpenOptions, h: int, w: int, c: int) -> bool:
    """Whether an h x w x c image is one that decoding with ``o``'s settings can give (a cache entry's)."""
    if c != channels:
        return False
    if o.img_size is not None:
        return (h, w) == tuple(o.img_size)
    return o.short_side is None or min(h, w) <= o.short_side


# ---------------------------------------------------------------------------- describing a folder
def describe_folder(root: Path, fmt: str) -> DataFacts:
    """The DataFacts of class folders at ``root`` (a split folder: its train/): the images counted, the size
    and channels of a few headers spread over the classes, and the images of a split folder's val/ and test/
    (class folders alone have none)."""
    if fmt != "split-folder":
        return dataclasses.replace(_probe_folder(root, fmt), scored=0)
    by = {d.name.lower(): d for d in _subfolders(root)}
    scored = sum(len(walk_images(d)) for part in _split_parts(by).values() for d in _subfolders(part))
    return dataclasses.replace(_probe_folder(by["train"], fmt), scored=scored)


def _subfolders(root: Path) -> list[Path]:
    return sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))


def _probe_folder(root: Path, fmt: str) -> DataFacts:
    """Class folders: the images counted, the size and channels of a few spread over the classes."""
    files = [walk_images(d) for d in _subfolders(root)]
    total = sum(len(f) for f in files)
    if not total:
        raise DataError(f"{show_path(root)}: no class folders with images")
    per = max(1, HEADERS_SAMPLED // len(files))  # headers read per class, spread over its files
    sample = [p for f in files for p in f[:: max(len(f) // per, 1)][:per]]
    sizes, channels = [], 1
    for p in sample:
        try:
            sizes.append(header_size(p, None))
            channels = max(channels, _channels(p))
        except DataError:
            continue  # unreadable: the run reports it
    if not sizes:
        raise DataError(f"{show_path(root)}: none of {len(sample)} sampled images could be read")
    size = max(sizes, key=lambda hw: max(hw))
    return DataFacts(fmt, size, channels, total, sum(1 for f in files if f))


def _channels(path: Path) -> int:
    """1 for a greyscale file, else 3 (as the images are decoded), from its header."""
    from PIL import Image

    with Image.open(path) as im:
        return 1 if im.mode in ("1", "L", "LA", "I", "I;16", "F") else 3


__all__ = ["open_folder", "open_split_folder", "describe_folder", "VAL_NAMES", "TEST_NAMES", "MEMORY_BUDGET"]
