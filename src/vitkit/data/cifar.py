"""CIFAR-10 and CIFAR-100 as the official python pickles (``cifar10``, ``cifar100``): read safely (numpy
arrays and plain types only), opened as an ImageSet, described for a recipe."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import torch

from ..core.errors import DataError
from .images import show_path
from .sets import DataFacts, OpenOptions, array_set, list_entries, read_bytes

CIFAR_DIRS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}  # what the tarballs unpack to
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


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
    raw = read_bytes(path)
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


def open_cifar(root: Path, fmt: str, o: OpenOptions):
    if fmt == "cifar10":
        n_cls, key = 10, "labels"
        train_files = sorted((p for p in list_entries(root)[1] if re.fullmatch(r"data_batch_\d+", p.name)),
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
    train = array_set(torch.from_numpy(imgs), torch.from_numpy(labs), classes, o, 3)
    test = None
    if test_file.is_file():
        ti, tl = _cifar_part(test_file, key, n_cls)
        test = array_set(torch.from_numpy(ti), torch.from_numpy(tl), classes, o, 3)
    return train, None, test, []


def describe_cifar(root: Path, fmt: str) -> DataFacts:
    sub = root / CIFAR_DIRS[fmt]
    root = sub if sub.is_dir() else root  # the folder the official tarball unpacks to
    if fmt == "cifar10":
        parts = sorted(p for p in root.iterdir() if p.name.startswith("data_batch_"))
        labels_key, classes, test = "labels", 10, root / "test_batch"
    else:
        parts, labels_key, classes, test = [root / "train"], "fine_labels", 100, root / "test"
    images = sum(len(safe_unpickle(p).get(labels_key, [])) for p in parts if p.is_file())
    scored = len(safe_unpickle(test).get(labels_key, [])) if test.is_file() else 0
    return DataFacts(fmt, (32, 32), 3, images, classes, scored=scored)


__all__ = ["CIFAR_DIRS", "safe_unpickle", "open_cifar", "describe_cifar"]
