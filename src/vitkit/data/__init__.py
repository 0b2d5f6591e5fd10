"""Data: image decoding, datasets (class folders, MNIST IDX, CIFAR batches, the demo set) and batched
augmentations. See docs/data.md."""

from .augment import AugmentConfig, BatchAugment, eval_batch, eval_batches
from .datasets import DataSplits, ImageSet, open_dataset
from .images import DEFAULT_MAX_PIXELS, decode_image, list_images, to_model_input

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "decode_image",
    "list_images",
    "to_model_input",
    "ImageSet",
    "DataSplits",
    "open_dataset",
    "AugmentConfig",
    "BatchAugment",
    "eval_batch",
    "eval_batches",
]
