"""Top-k predictions for image files, folders and globs, through the model's own preprocessing.

    from .predict import predict
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

from ..core.errors import ConfigError, DataError
from ..core.progress import Progress
from ..data.images import DEFAULT_MAX_PIXELS
from ..infer.paths import apply_path, autocast, inference_path, path_taken
from .loading import label_names, load_model


def _read(path: Path, channels: int, img_size, pre, max_pixels):
    from ..data import decode_image, to_model_input

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
    progress: Progress | None = None,
    precision: str = "auto",
    engine: str = "auto",
) -> dict:
    """Top-k classes with probabilities for every image in ``inputs`` (files, folders, globs).

    Images over ``max_pixels`` are refused as decompression bombs (None: no limit). ``progress``: where
    the images are counted as they are classified (default: nowhere). ``precision``: 'auto' (the path
    ``runtime.inference_path`` picks for this model and device), 'fp32', 'bf16' or 'int8' (opt-in, CPU).
    ``engine``: 'auto' (ONNX Runtime where ``fastpath.ort_pays``, else torch), 'torch' or 'onnxruntime'
    (fp32 on a CPU; see ``vitkit.infer.onnxrt.OrtModel`` for its check against eager).

    Returns {"predictions": [{"path", "top": [{"index", "label", "prob"}]}], "errors": [{"path",
    "error"}], "top_k", "num_images", "fast_path": the path taken, in words}. Inputs that match nothing and
    unreadable files go to "errors" (or raise DataError with ``strict``).
    """
    if top_k < 1:
        raise ConfigError(f"--top-k: must be >= 1, got {top_k}")
    if batch_size < 1:
        raise ConfigError(f"--batch-size: must be >= 1, got {batch_size}")
    model = load_model(model_or_path, device)
    if not model.cfg.num_classes:
        raise ConfigError("model: has no classification head (num_classes=0); nothing to predict")
    k = min(top_k, model.cfg.num_classes)
    names, device = label_names(model), next(model.parameters()).device
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not inputs:
        raise DataError("inputs: give at least one image file, folder or glob")
    errors: list[dict] = []
    files = _image_files(inputs, strict, errors)
    path = inference_path(model, device, precision, len(files), engine, batch_size)
    net = apply_path(model, path)
    preds: list[dict] = []
    task = (progress or Progress()).task("predicting", len(files), unit="images")
    with task, ThreadPoolExecutor(max(1, num_workers)) as pool:
        for start in range(0, len(files), batch_size):
            good = _decode_batch(pool, model, files[start : start + batch_size], strict, max_pixels, errors)
            if good:
                with autocast(device, path.precision):
                    preds += _top_k(net, good, k, names, device)
            task.update(min(start + batch_size, len(files)))
    return dict(num_images=len(preds), top_k=k, predictions=preds, errors=errors, fast_path=path_taken(path, net))


def _image_files(inputs: list, strict: bool, errors: list[dict]) -> list[Path]:
    """The image files of ``inputs`` in order, each once; an input that matches nothing is an error
    (raised with ``strict``, else listed in ``errors``)."""
    from ..data import list_images

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
    return files


def _decode_batch(pool, model, chunk: list[Path], strict: bool, max_pixels, errors: list[dict]) -> list:
    """(path, model input) for the files of ``chunk`` that decode (in parallel threads); the others go to
    ``errors`` (the first one raises with ``strict``)."""
    cfg = model.cfg
    decoded = list(pool.map(lambda p: _read(p, cfg.in_chans, cfg.img_size, model.preprocess, max_pixels), chunk))
    good = []
    for path, (x, err) in zip(chunk, decoded):
        if err is not None:
            if strict:
                raise DataError(err)
            errors.append(dict(path=str(path), error=err))
        else:
            good.append((path, x))
    return good


def _top_k(model, good: list, k: int, names: list[str], device: torch.device) -> list[dict]:
    """One forward pass over the decoded images: the k most probable classes of each (named by ``names``)."""
    with torch.no_grad():
        logits = model(torch.stack([x for _, x in good]).to(device))
    probs = logits.float().softmax(-1).cpu()
    top = probs.topk(k, dim=-1)
    return [dict(path=str(path), top=[dict(index=i, label=names[i], prob=p) for p, i in zip(vals, idx)])
            for (path, _), vals, idx in zip(good, top.values.tolist(), top.indices.tolist())]


__all__ = ["predict"]
