"""How a dataset's parts are split, and the size evaluation resizes images to: one owner for each.

- The validation carve: a run whose data has neither a validation nor a test part holds out
  ``HELD_OUT`` of its training images, stratified and seeded (``carve_validation``); ``vitkit eval`` on
  the run's own data makes the same carve again from the run's config.
- The eval size: an image is resized so that it covers the model's size / crop_pct, then centre-cropped
  (timm's eval transform); ``eval_resize`` is that size, and image folders are kept at its short side
  (``decode_short_side``) so that evaluation crops them without resizing again.
"""

from __future__ import annotations

import math

import torch

from ..core.errors import DataError

HELD_OUT = 0.1  # the share of its training images a run holds out for validation when its data has neither a
#   val nor a test part (and data.val_fraction is 0), so that it reports an accuracy


def eval_resize(img_size: tuple[int, int], crop_pct: float) -> tuple[int, int]:
    """The size an image is resized to cover before the centre crop of ``img_size``: floor(size / crop_pct)
    a side (never below the size; the small epsilon keeps 224 / 0.875 at 256 in floating point)."""
    return tuple(max(s, math.floor(s / crop_pct + 1e-9)) for s in img_size)


def decode_short_side(img_size: tuple[int, int], crop_pct: float) -> int:
    """The short side image folders are kept at for a model of ``img_size``: the size evaluation resizes
    to, so that it crops the stored image without resizing it again."""
    return max(eval_resize(img_size, crop_pct))


def carve_validation(splits, fraction: float, seed: int, where: str, required: bool = True) -> bool:
    """Give ``fraction`` of ``splits.train`` (a DataSplits) to ``splits.val``, stratified and seeded, when
    the data has no validation part; True where it did. A class of one image cannot give one: an error
    where the carve is ``required`` (asked for), else no carve (the run's own hold-out, HELD_OUT)."""
    if splits.val is not None or not fraction:
        return False
    if not required and lone_class(splits.train) is not None:
        return False
    splits.train, splits.val = split_stratified(splits.train, fraction, seed, where=where)
    splits.held_out = fraction
    return True


def held_out(splits, seed: int, where: str) -> str | None:
    """A run's own hold-out: HELD_OUT of the training images for validation when the data has neither a
    validation nor a test part, so that the run reports an accuracy; the line that says what was done
    (None where the data has a part to score on)."""
    if splits.test is not None or splits.val is not None:
        return None
    if carve_validation(splits, HELD_OUT, seed, where, required=False):
        return (f"no validation or test part in the data: {HELD_OUT:.0%} of the training images are held out for "
                "validation")
    return (f"no validation or test part in the data, and class {lone_class(splits.train)!r} has one image, so none "
            "are held out: the run reports no accuracy (add images, or a val/ or test/ folder)")


def lone_class(images) -> str | None:
    """The name of the first class of ``images`` with exactly one image, or None."""
    return next((images.classes[c] for c, n in enumerate(images.class_counts()) if n == 1), None)


def split_stratified(images, fraction: float, seed: int, where: str = "dataset") -> tuple:
    """Split ``fraction`` of every class off as a validation set (at least one image per class), with a
    seeded shuffle; both parts keep the original order. Needs 2+ images in every class."""
    g = torch.Generator().manual_seed(int(seed))
    counts = images.class_counts()
    for c, n in enumerate(counts):
        if n == 1:
            raise DataError(f"{where}: class {images.classes[c]!r} has {n} image; a validation split needs at "
                            f"least 2 per class (add images, or set val_fraction to 0: nothing is held out then)")
    # images per class for val: floor(n * fraction) within [1, n - 1], then the largest remainders get
    # one more until the total is round(N * fraction) (8,000 images at 0.1 -> exactly 800)
    want = {c: n * fraction for c, n in enumerate(counts) if n}
    take = {c: min(n - 1, max(1, int(want[c]))) for c, n in enumerate(counts) if n}
    spare = round(sum(counts) * fraction) - sum(take.values())
    for c in sorted(take, key=lambda c: (-(want[c] - int(want[c])), c)):
        if spare <= 0:
            break
        if take[c] < counts[c] - 1 and take[c] <= want[c]:
            take[c] += 1
            spare -= 1
    train_idx, val_idx = [], []
    for c, k in take.items():
        idx = torch.nonzero(images.labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        val_idx.append(idx[:k])
        train_idx.append(idx[k:])
    tr = torch.cat(train_idx).sort().values
    va = torch.cat(val_idx).sort().values
    return images.subset(tr), images.subset(va)


__all__ = ["HELD_OUT", "eval_resize", "decode_short_side", "carve_validation", "held_out", "lone_class",
           "split_stratified"]
