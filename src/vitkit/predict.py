"""Top-k predictions for image files, folders and globs, through the model's own preprocessing.

    from vitkit.predict import predict
    res = predict("ckpt/", ["photos/", "cat.jpg"], top_k=3)
    res["predictions"][0]   # {"path": ..., "top": [{"index": 3, "label": "cat", "prob": 0.91}, ...]}
    res["errors"]           # [{"path": ..., "error": "...: cannot read image (...)"}] for unreadable files

Every image, whatever its size or colour mode, is decoded to the model's channels (decode_image) and
resized, centre cropped and normalised as the checkpoint says (to_model_input). An unreadable file is
reported and skipped; with ``strict=True`` the first one raises DataError.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from .data.images import DEFAULT_MAX_PIXELS
from .errors import ConfigError, DataError
from .runtime import resolve_device


def load_model(model_or_path, device: str | torch.device = "cpu"):
    """A module as given (in eval mode), or a model loaded from a checkpoint or run directory."""
    device = resolve_device(device, what="--device")
    if isinstance(model_or_path, torch.nn.Module):
        return model_or_path.to(device).eval()
    from .io.checkpoint import load

    return load(model_or_path, device=device)


def label_names(model) -> list[str]:
    """Class names of the model's head: its labels, else the class indices as strings."""
    n = model.cfg.num_classes
    return list(model.labels) if model.labels is not None else [str(i) for i in range(n)]


def _read(path: Path, channels: int, img_size, pre, max_pixels):
    from .data import decode_image, to_model_input

    try:
        return to_model_input(decode_image(path, channels, max_pixels), img_size, pre), None
    except DataError as e:
        return None, str(e)


def predict(
    model_or_path,
    inputs: list[str | os.PathLike] | str | os.PathLike,
    top_k: int = 5,
    batch_size: int = 32,
    strict: bool = False,
    device: str | torch.device = "cpu",
    num_workers: int = 4,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> dict:
    """Top-k classes with probabilities for every image in ``inputs`` (files, folders, globs).

    Images over ``max_pixels`` are refused as decompression bombs (None: no limit).

    Returns {"predictions": [{"path", "top": [{"index", "label", "prob"}]}], "errors": [{"path",
    "error"}], "top_k", "num_images"}. Inputs that match nothing and unreadable files go to "errors"
    (or raise DataError with ``strict``).
    """
    from .data import list_images

    if top_k < 1:
        raise ConfigError(f"--top-k: must be >= 1, got {top_k}")
    if batch_size < 1:
        raise ConfigError(f"--batch-size: must be >= 1, got {batch_size}")
    model = load_model(model_or_path, device)
    cfg = model.cfg
    if not cfg.num_classes:
        raise ConfigError("model: has no classification head (num_classes=0); nothing to predict")
    names = label_names(model)
    k = min(top_k, cfg.num_classes)
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not inputs:
        raise DataError("inputs: give at least one image file, folder or glob")

    errors: list[dict] = []
    files: list[Path] = []
    seen: set[Path] = set()
    for item in inputs:
        try:
            for f in list_images([item]):
                if f not in seen:
                    seen.add(f)
                    files.append(f)
        except DataError as e:
            if strict:
                raise
            errors.append(dict(path=str(item), error=str(e)))

    preds: list[dict] = []
    dev = next(model.parameters()).device
    with ThreadPoolExecutor(max(1, num_workers)) as pool:
        for start in range(0, len(files), batch_size):
            chunk = files[start : start + batch_size]
            decoded = list(pool.map(lambda p: _read(p, cfg.in_chans, cfg.img_size, model.preprocess, max_pixels), chunk))
            good = []
            for path, (x, err) in zip(chunk, decoded):
                if err is not None:
                    if strict:
                        raise DataError(err)
                    errors.append(dict(path=str(path), error=err))
                else:
                    good.append((path, x))
            if not good:
                continue
            with torch.no_grad():
                logits = model(torch.stack([x for _, x in good]).to(dev))
            probs = logits.float().softmax(-1).cpu()
            top = probs.topk(k, dim=-1)
            for (path, _), vals, idx in zip(good, top.values.tolist(), top.indices.tolist()):
                preds.append(dict(path=str(path),
                                  top=[dict(index=i, label=names[i], prob=p) for p, i in zip(vals, idx)]))
    return dict(num_images=len(preds), top_k=k, predictions=preds, errors=errors)


__all__ = ["predict", "load_model", "label_names"]
