"""MNIST's IDX files (``mnist``; the built-in demo digits are such files): reading them, opening them as
an ImageSet, describing them for a recipe."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch

from ..core.errors import DataError
from .images import show_path
from .sets import DataFacts, OpenOptions, array_set, list_entries, read_bytes

IDX_RE = re.compile(r"idx[13]", re.IGNORECASE)  # an IDX file's name: ...-idx3-ubyte (images), -idx1- (labels)


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file (gzip or raw) of unsigned bytes with ``ndim`` dimensions as a numpy array."""
    raw = read_bytes(path)
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


def open_mnist(root: Path, fmt: str, o: OpenOptions):
    files = [p for p in list_entries(root)[1]]
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
        sets[part] = array_set(images, torch.from_numpy(labs.astype(np.int64)), classes, o, 1)
    return sets["train"], None, sets.get("test"), []


# --------------------------------------------------------------------------------------------------
# CIFAR python batches (pickles), read without executing code


def describe_mnist(root: Path) -> DataFacts:
    labels = [p for p in root.iterdir() if "idx1" in p.name.lower() and not p.name.lower().startswith(("t10k", "test"))]
    images = [p for p in root.iterdir() if "idx3" in p.name.lower() and not p.name.lower().startswith(("t10k", "test"))]
    tests = [p for p in root.iterdir() if "idx1" in p.name.lower() and p.name.lower().startswith(("t10k", "test"))]
    n = len(read_idx(labels[0], 1)) if labels else 0
    size = tuple(read_idx(images[0], 3).shape[1:]) if images else (28, 28)
    return DataFacts("mnist", size, 1, n, 10, scored=len(read_idx(tests[0], 1)) if tests else 0)


__all__ = ["IDX_RE", "read_idx", "open_mnist", "describe_mnist"]
