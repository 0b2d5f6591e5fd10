"""What every dataset format gives and shares: ``ImageSet`` (images and labels, in memory, ragged or as
files), ``DataSplits`` (its parts), the options an opening runs with (``OpenOptions``), and the helpers
the format modules share (a folder's entries, arrays as an ImageSet, a file's bytes)."""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..core.errors import DataError
from ..core.progress import Progress
from .cache import DecodeCache
from .images import DEFAULT_MAX_PIXELS, decode_array, open_regular, pil_limits, show_path
from .ragged import RaggedImages


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
    cache: str = "off"  # the decoded-image cache: 'hit' (every decoded part read back from it), 'shared' (read
    #   back, after waiting while another process opening the same folder decoded and stored it), 'miss'
    #   (decoded, and stored), 'miss, not cached' (decoded; storing failed: ``cache_notes`` says why), 'off' (no
    #   cache, or nothing to decode: arrays, streamed folders)
    cache_notes: list[str] = field(default_factory=list)  # why the cache could not be written, if so
    held_out: float = 0.0  # the share of the training images carved off as ``val`` (the data had no val part)

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


@dataclass(frozen=True)
class DataFacts:
    """What a dataset is, as far as choosing a recipe needs: read without decoding it."""

    format: str  # as data.datasets.detect_dataset_format names it
    size: tuple[int, int]  # (H, W) of its images; for folders of mixed sizes, the largest sampled
    channels: int  # 1 (grey) or 3
    images: int  # training images (train/ of a split folder; the training batches or files)
    classes: int
    scored: int | None = None  # the images of its own validation and test parts (0: it has none, so a run holds
    #   out data.splits.HELD_OUT of its training images to score; None: not counted)

    def describe(self) -> str:
        kind = "grey" if self.channels == 1 else "RGB"
        return f"{self.size[0]}x{self.size[1]} {kind} images, {self.images:,} for training, {self.classes} classes"


@dataclass
class OpenOptions:
    channels: int | None
    img_size: tuple[int, int] | None
    strict: bool
    in_memory: bool | None
    max_pixels: int | None
    num_workers: int | None
    progress: Progress
    short_side: int | None = None
    cache: DecodeCache | None = None
    cached_only: bool = False  # a part the cache lacks raises CacheMiss instead of being decoded
    root: Path = Path(".")  # the dataset's folder, that cache keys name files relative to
    cache_used: list[str] = field(default_factory=list)  # 'hit' | 'shared' | 'miss' | 'uncached' of each part
    #   decoded with a cache
    cache_notes: list[str] = field(default_factory=list)

    def cache_summary(self) -> str:
        """'hit' when every decoded part came from the cache, 'shared' when they all did and one was decoded by
        another process while this one waited, 'miss' when one was decoded (and stored), 'miss, not cached'
        when one could not be stored, else 'off'."""
        used = set(self.cache_used)
        if used and used <= {"hit", "shared"}:
            return "shared" if "shared" in used else "hit"
        return "miss, not cached" if "uncached" in used else "miss" if used else "off"


def list_entries(root: Path) -> tuple[list[Path], list[Path]]:
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


def array_set(images: torch.Tensor, labels: torch.Tensor, classes: list[str], o: OpenOptions,
              native_c: int) -> ImageSet:
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
        images = resize_uint8(images, o.img_size)
        size = tuple(o.img_size)
    return ImageSet(labels, classes, images, None, size, channels, o.max_pixels)


def resize_uint8(images: torch.Tensor, size: tuple[int, int], chunk: int = 4096) -> torch.Tensor:
    from .images import resize_center_crop

    out = torch.empty(images.shape[0], images.shape[1], *size, dtype=torch.uint8)
    for s in range(0, images.shape[0], chunk):
        x = resize_center_crop(images[s : s + chunk].float(), size, 1.0, "bicubic")
        out[s : s + chunk] = x.round_().clamp_(0, 255).to(torch.uint8)
    return out


def read_bytes(path: Path) -> bytes:
    try:
        with open_regular(path) as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{show_path(path)}: cannot read ({type(e).__name__}: {e})") from None
    return raw


__all__ = ["ImageSet", "DataSplits", "DataFacts", "OpenOptions", "list_entries", "array_set", "resize_uint8",
           "read_bytes"]
