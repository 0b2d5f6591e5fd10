"""Whether mirroring keeps an image's class: the check behind a recipe's left-right flips.

Flip augmentation (and flip-averaged test-time views) assumes that the mirror image of a picture of a class is
a picture of the same class. True of most photos; false of traffic signs ('keep right' mirrored is 'keep left'),
digits and text. Trained with flips on such data, a model is taught both that a sign means 'keep right' and that
its mirror, which the data calls 'keep left', does too.

``mirror_check`` measures it on the training images themselves, before a run trains: a ridge-regression
classifier on each image at 16x16 (standardised per image), fitted on four fifths of the images and scored on
the fifth, five times over, scores every image as it is and mirrored. Where mirroring keeps classes (and the data
holds both orientations, as photos do) it scores both the same; where it does not, the mirrored images lose most
of what it gets right, and many of one class land in another. The check refuses flips when the mirrored
images keep less than ``KEPT_MIN`` of its accuracy above chance, and the loss is past the noise (``Z_MIN``
standard errors of the paired difference or more). Measured on four sets (benchmarks/mirror_check.py;
docs/experiments.md, "Mirrored images"), the share kept was 0.99 for CIFAR-10 and 1.16 for catsdogs photos,
0.37 for traffic signs and 0.36 for digits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

SIDE = 16  # images are compared at SIDE x SIDE
MAX_IMAGES = 10_000  # at most this many images are checked (a seeded sample): about half a second on two cores
MAX_STREAMED = 2_000  # ... where the images are decoded from their files on demand (a few seconds of large photos)
MIN_IMAGES = 100  # fewer images than this are too few to tell: flips are kept
FOLDS = 5
RIDGE = 1e-2  # the ridge penalty, per image
KEPT_MIN = 0.8  # flips are refused where mirrored images keep less than this share of the accuracy above chance
Z_MIN = 3.0  # ... and the loss is this many standard errors of the paired difference, or more


@dataclass(frozen=True)
class MirrorCheck:
    """What the check found: ``images`` scored, ``plain`` and ``mirrored`` the accuracy on them as they are and
    mirrored, ``chance`` the accuracy of always answering the largest class, ``z`` the loss in standard errors of
    the paired difference; ``pair``: the class whose mirrored images most often land in one other class, that
    class and the share (None where no mirrored image of a class lands elsewhere more than as it is)."""

    images: int
    plain: float
    mirrored: float
    chance: float
    z: float
    pair: tuple[str, str, float] | None = None

    @property
    def kept(self) -> float:
        """The share of the accuracy above chance that mirroring keeps (1.0 where there is none to keep)."""
        above = self.plain - self.chance
        return 1.0 if above <= 0 else (self.mirrored - self.chance) / above

    @property
    def refuses(self) -> bool:
        """Whether mirroring changes the class too often for flips to be trained or averaged."""
        return self.kept < KEPT_MIN and self.z >= Z_MIN

    def describe(self) -> str:
        """The measurements in words, for a run's line."""
        text = (f"a linear classifier on {self.images:,} training images at {SIDE}x{SIDE} scores "
                f"{100 * self.plain:.1f}% of them as they are and {100 * self.mirrored:.1f}% mirrored "
                f"(chance {100 * self.chance:.1f}%: mirroring keeps {max(self.kept, 0):.2f} of what it gets right)")
        if self.pair is not None and self.refuses:
            a, b, share = self.pair
            text += f"; {100 * share:.0f}% of mirrored {a!r} images are taken for {b!r}"
        return text


def features(images) -> torch.Tensor:
    """float (N, C*SIDE*SIDE) of uint8 images (a (N, C, H, W) tensor or a list of (C, h, w)): each brought to
    SIDE x SIDE by area averaging, less its own mean, over its own standard deviation."""
    if isinstance(images, torch.Tensor):
        x = F.interpolate(images.float(), size=(SIDE, SIDE), mode="area") if images.shape[-2:] != (SIDE, SIDE) \
            else images.float()
    else:
        x = torch.stack([F.interpolate(im[None].float(), size=(SIDE, SIDE), mode="area")[0] for im in images])
    x = x.flatten(1)
    x = x - x.mean(1, keepdim=True)
    return x / (x.std(1, keepdim=True) + 1.0)  # +1 on the 0..255 scale: a flat image stays near zero


def mirrored(plain: torch.Tensor, channels: int) -> torch.Tensor:
    """``features`` of the mirror images, from those of the images: area averaging and the per-image standardising
    commute with a left-right flip, so the features' SIDE x SIDE grid is flipped, nothing computed again."""
    return plain.view(len(plain), channels, SIDE, SIDE).flip(-1).flatten(1)


def check_arrays(plain: torch.Tensor, channels: int, labels: torch.Tensor, classes: list[str],
                 seed: int = 0) -> MirrorCheck:
    """The check on the ``features`` of images of ``channels`` channels, with their integer ``labels``: a ridge
    classifier fitted on the features of all folds but one, scored on the held fold's as they are and mirrored."""
    n, k = len(labels), len(classes)
    ones = torch.ones(n, 1)
    a = torch.cat([plain, ones], 1).double()
    m = torch.cat([mirrored(plain, channels), ones], 1).double()
    targets = F.one_hot(labels.long(), k).double()
    fold = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) % FOLDS
    grams = [a[fold == f].T @ a[fold == f] for f in range(FOLDS)]
    cross = [a[fold == f].T @ targets[fold == f] for f in range(FOLDS)]
    gram, xy = sum(grams), sum(cross)
    pred_plain = torch.empty(n, dtype=torch.long)
    pred_mirror = torch.empty(n, dtype=torch.long)
    for f in range(FOLDS):
        held = fold == f
        fitted = int((~held).sum())
        g = gram - grams[f] + RIDGE * max(fitted, 1) * torch.eye(a.shape[1], dtype=torch.float64)
        w = torch.linalg.solve(g, xy - cross[f])
        pred_plain[held] = (a[held] @ w).argmax(1)
        pred_mirror[held] = (m[held] @ w).argmax(1)
    right, right_m = pred_plain == labels, pred_mirror == labels
    lost, gained = int((right & ~right_m).sum()), int((~right & right_m).sum())
    z = (lost - gained) / math.sqrt(lost + gained) if lost + gained else 0.0
    chance = float(torch.bincount(labels.long(), minlength=k).max()) / max(n, 1)
    return MirrorCheck(n, float(right.double().mean()), float(right_m.double().mean()), chance, z,
                       _worst_pair(labels.long(), pred_plain, pred_mirror, classes))


def _worst_pair(labels, pred_plain, pred_mirror, classes) -> tuple[str, str, float] | None:
    """(a, b, share): the class a and other class b where the share of a's mirrored images taken for b most
    exceeds that of a's images as they are."""
    k = len(classes)
    count = torch.bincount(labels, minlength=k).clamp(min=1).double()
    plain = torch.bincount(labels * k + pred_plain, minlength=k * k).view(k, k).double()  # confusion counts
    mirror = torch.bincount(labels * k + pred_mirror, minlength=k * k).view(k, k).double()
    more = (mirror - plain) / count[:, None]
    more.fill_diagonal_(-1.0)
    a, b = divmod(int(more.argmax()), k)
    return (classes[a], classes[b], float(mirror[a, b] / count[a])) if more[a, b] > 0 else None


def mirror_check(images, seed: int = 0) -> MirrorCheck:
    """The check on an ImageSet's images (``data.sets.ImageSet``): at most MAX_IMAGES of them (MAX_STREAMED where
    they are decoded from their files), a seeded sample."""
    n = len(images)
    cap = MAX_IMAGES if images.in_memory else MAX_STREAMED
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:cap] if n > cap else torch.arange(n)
    plain, labels = [], []
    for chunk in idx.split(2048):
        x, y = images.get_batch(chunk)
        plain.append(features(x))
        labels.append(y)
    return check_arrays(torch.cat(plain), images.channels, torch.cat(labels), list(images.classes), seed)


__all__ = ["MirrorCheck", "mirror_check", "check_arrays", "features", "mirrored", "SIDE", "MAX_IMAGES", "MAX_STREAMED",
           "MIN_IMAGES",
           "KEPT_MIN", "Z_MIN", "FOLDS", "RIDGE"]
