"""BatchNorm statistics of the final model, re-estimated on training images as they are evaluated.

A model with BatchNorm (the hybrid models' conv stems) is evaluated with running statistics that
training gathered on *augmented* crops (random resized crops zoom in: objects look larger than in the
evaluation's centre crop, the train/test discrepancy FixRes describes), with a momentum that weighs the
last steps, and, with an EMA, averaged over weights of many steps. Once training ends, the final model's
statistics are computed again: the running mean and variance are reset and averaged (a cumulative
average, momentum None) over ``images`` training images prepared with the evaluation transform (resize,
centre crop, normalise, no augmentation), only the BatchNorm layers in training mode (dropout and drop
path stay off). No validation image is used.

Measured (benchmarks/fixres.py): on the photos recipe at 5 minutes on catsdogs, trained on random resized
crops, +2.0 and +3.7 points of validation accuracy at the training resolution (two carves); on the
small-data recipe at 30 minutes (32-px CIFAR images, padded crops: no change of scale), -1.28 points. So a
run re-estimates them by default only when it trained on random resized crops (RunConfig.bn_recalibrate).
Testing at a higher resolution than training (72-96 px for a 64 px model) gained nothing more once the
statistics were re-estimated, so the test resolution stays the training one.
"""

from __future__ import annotations

import torch
from torch import nn

from ..data import eval_batches
from ..infer.paths import autocast
from ..io import checkpoint as ckpt_io

CALIBRATION_IMAGES = 1024  # training images the statistics are re-estimated on


def batchnorms(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm layers of ``model`` that keep running statistics and train: a frozen one (a
    fine-tuning run's frozen stem, ``train.tune``) keeps the statistics it was trained with."""
    return [m for m in ckpt_io.unwrap(model).modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
            and not _frozen(m)]


def _frozen(m: nn.Module) -> bool:
    params = list(m.parameters())
    return bool(params) and not any(p.requires_grad for p in params)


@torch.no_grad()
def recalibrate_bn(model: nn.Module, images, device: torch.device, precision: str = "fp32", count: int = CALIBRATION_IMAGES,
                   seed: int = 0, batch_size: int = 256) -> int:
    """Re-estimate the running statistics of ``model``'s BatchNorm layers (in place) on ``count`` images of
    the ImageSet ``images`` (a seeded choice: every process picks the same ones, so no collective is
    needed), prepared as ``evaluate_split`` prepares them. Returns the number of images used (0: the model
    has no BatchNorm, or ``count`` is 0)."""
    base = ckpt_io.unwrap(model)
    layers = batchnorms(base)
    if not layers or count <= 0 or len(images) == 0:
        return 0
    was_training = base.training
    saved = [(m, m.momentum) for m in layers]
    base.eval()
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches
        m.train()
    pick = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))[:count]
    try:
        for x, _ in eval_batches(images, base.cfg.img_size, base.preprocess, device, batch_size, pick.sort().values):
            with autocast(device, precision):
                base(x)
    finally:
        for m, momentum in saved:
            m.momentum = momentum
        base.train(was_training)
    return int(len(pick))


__all__ = ["CALIBRATION_IMAGES", "batchnorms", "recalibrate_bn"]
