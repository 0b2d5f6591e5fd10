"""Evaluate a checkpoint on a dataset: loss, top-1 / top-5, per-class precision / recall / F1, the
confusion matrix and the most confidently wrong images.

    from .evaluate import evaluate
    res = evaluate("runs/mnist", data="data/mnist", out="eval/")     # MNIST's test part
    res["top1"], res["per_class"][3]["recall"], res["worst"][0], res["scored"]

Which images are scored: the data's test part; else its val part; else, for data without either (a
plain class folder), all of it. ``split`` chooses otherwise: 'test', 'val', 'train' or 'all' (every
part); 'val' on data without a val part scores a seeded carve of its training images. Without
``data``, a run directory is scored on the run's own data, split as the run split it: its test part,
else its val part, else the validation carve the run held out (with the run's seed); a checkpoint on
the built-in demo set. ``res["scored"]`` says which images, e.g. "test part: all 10000 images".

Images go through the checkpoint's own preprocessing (``eval_batch`` with ``model.preprocess`` at
``model.cfg.img_size``). The dataset's classes must be the model's: the same names (in any order: the
labels are mapped by name) when the checkpoint has labels, else the same number of classes.

With ``out``, these files are written (atomically): metrics.json (everything returned), confusion.json,
confusion.png (needs matplotlib) and worst.png (a grid of the most confidently wrong images).
"""

from __future__ import annotations

import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ..core.errors import ConfigError, DataError
from ..core.progress import Progress, Task
from ..data.images import DEFAULT_MAX_PIXELS
from ..infer.fastpath import FastPath
from ..infer.paths import apply_path, autocast, inference_path, model_logits, path_taken
from ..infer.scoring import Tally
from ..train.metrics import confusion_png
from .loading import label_names, load_model

SPLITS = ("test", "val", "train")  # the parts a dataset may have
CHOICES = SPLITS + ("all",)  # what ``split`` takes: a part, or every part


def _preview(names: list[str], n: int = 4) -> str:
    shown = ", ".join(names[:n])
    return shown + (", ..." if len(names) > n else "")


def match_classes(model, classes: list[str], where: str) -> torch.Tensor | None:
    """Map dataset label i to the model's class index; None when they are the same. Raises DataError
    (naming both sides) when the dataset's classes are not the model's."""
    n = model.cfg.num_classes
    if model.labels is not None:
        labels = list(model.labels)
        if labels == list(classes):
            return None
        if sorted(labels) == sorted(classes):
            index = {name: i for i, name in enumerate(labels)}
            return torch.tensor([index[c] for c in classes], dtype=torch.long)
        raise DataError(
            f"{where}: the dataset's {len(classes)} classes ({_preview(list(classes))}) do not match the "
            f"model's {len(labels)} labels ({_preview(labels)})")
    if n != len(classes):
        raise DataError(
            f"{where}: the dataset has {len(classes)} classes ({_preview(list(classes))}) but the model's head "
            f"has {n} outputs (no labels saved)")
    return None


def _open(data, data_format, model, strict=False, max_pixels=DEFAULT_MAX_PIXELS, progress=None):
    from ..data import open_dataset

    cfg, pre = model.cfg, model.preprocess
    # in_memory=False: image folders are streamed (only headers are read up front; the one split we
    # evaluate is decoded batch by batch) and keep their file paths for the report
    kw = dict(channels=cfg.in_chans, val_fraction=0.0, in_memory=False, strict=strict, max_pixels=max_pixels,
              progress=progress)
    try:
        return open_dataset(data, data_format, **kw)
    except DataError as e:
        if "different sizes" not in str(e):
            raise
    # images of mixed sizes: decode each at the size the model's preprocessing resizes to (short side
    # to size / crop_pct, centre crop); eval_batch then takes the centre crop at the model's size.
    from ..data.splits import eval_resize

    size = eval_resize(cfg.img_size, pre.crop_pct)
    if pre.resize == "squash":  # whole images (a crop first would keep an aspect ratio the squash does not)
        return open_dataset(data, data_format, short_side=max(size), **kw)
    return open_dataset(data, data_format, img_size=size, **kw)


def evaluate(
    model_or_path,
    data: str | os.PathLike | None = None,
    data_format: str | None = None,
    split: str | None = None,
    batch_size: int = 256,
    out: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    num_worst: int = 16,
    val_fraction: float = 0.1,
    seed: int | None = None,
    strict: bool = False,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    progress: Progress | None = None,
    tta: bool | None = None,
    tta_shift: int | None = None,
    tta_flip: bool | None = None,
    precision: str = "auto",
    engine: str = "auto",
) -> dict:
    """Evaluate on ``split`` of ``data`` (a dataset folder; None = a run directory's own data, else the
    built-in demo set); which images that is, the module docstring says. ``tta``: score the mean of the
    logits of each image and its mirror (``infer.paths.model_logits``); None: as a run directory's run
    scored (its ``tta``; that of the run a checkpoint in a run directory comes from), else not.
    ``tta_shift``: with ``tta``, also views moved this many px diagonally (0: none); None: as that run
    scored when ``tta`` is too, else 0. ``tta_flip`` False: views without mirror images (for data whose mirror
    images change class); None: as that run scored, else with them.

    ``val_fraction`` and ``seed`` (default: a run directory's seed, else 0) carve a val part for
    split='val' from data without one. Unreadable images are skipped and listed in ``skipped`` as
    {"path", "reason"}; with ``strict`` the first one is an error. ``progress``: where reading the data
    and scoring it are counted (default: nowhere). ``precision``: 'auto' (the path
    ``runtime.inference_path`` picks), 'fp32', 'bf16' or 'int8' (opt-in, CPU); ``engine``: 'auto' (ONNX
    Runtime where ``fastpath.ort_pays``, else torch), 'torch' or 'onnxruntime' (fp32 on a CPU; the flipped
    pass of TTA runs on it too); the dict's "fast_path" says which path was taken. Returns a dict (see the
    module docstring).
    """
    if split is not None and split not in CHOICES:
        raise ConfigError(f"--split: {split!r} is not one of {', '.join(CHOICES)}")
    if batch_size < 1:
        raise ConfigError(f"--batch-size: must be >= 1, got {batch_size}")
    model = load_model(model_or_path, device)
    if not model.cfg.num_classes:
        raise ConfigError("model: has no classification head (num_classes=0); nothing to evaluate")
    data, data_format, own, seed = _source(model_or_path, data, data_format, split, seed)
    tta, tta_shift, tta_flip = _tta_views(model_or_path, tta, tta_shift, tta_flip)
    where = "built-in demo set" if data is None else str(data)
    progress = progress or Progress()
    splits = _open(data, data_format, model, strict, max_pixels, progress)
    split, ds, scored = _choose(splits, split, where, own, val_fraction, seed)
    remap = match_classes(model, splits.classes, where)
    skipped = [dict(path=str(p), reason=r) for p, r in splits.skipped]
    path = inference_path(model, next(model.parameters()).device, precision, len(ds), engine, batch_size)
    net = apply_path(model, path)
    with progress.task(f"evaluating {where} ({split})", len(ds), unit="images") as task:
        tally = _score(model, net, path, ds, remap, batch_size, strict, skipped, task, tta, tta_shift,
                       tta_flip)
    if tally.n == 0:
        raise DataError(f"{where}: no image of the {split!r} split could be read ({len(skipped)} skipped)")
    names = label_names(model)
    res = dict(
        checkpoint=None if isinstance(model_or_path, torch.nn.Module) else str(model_or_path),
        data=where,
        format=splits.format,
        split=split,
        tta=tta,
        tta_shift=tta_shift,
        tta_flip=tta_flip,
        scored=f"{scored}: {'all' if tally.n == len(ds) else f'{tally.n} of'} {len(ds)} images",
        fast_path=path_taken(path, net),
        num_images=tally.n,
        skipped_files=len(skipped),
        skipped=skipped,
        **_metrics(tally, names),
        worst=_worst(tally, ds, remap, names, num_worst),
        files={},
    )
    if out is not None:
        res["files"] = _write_outputs(Path(out), res, ds, remap)
    return res


def _source(model_or_path, data, data_format, split, seed):
    """(data, data_format, the RunConfig whose own data that is or None, seed): without ``data``, a run
    directory's own data; the seed of a carve, unless given: the run's, else 0."""
    run = _run_config(model_or_path) if data is None or (split == "val" and seed is None) else None
    own = run if data is None else None  # the run's data, to split as the run split it
    if own is not None:
        data, data_format = own.data.path, own.data.format
    return data, data_format, own, seed if seed is not None else run.seed if run is not None else 0


def _run_config(model_or_path):
    """The RunConfig of a run directory (a folder with the run's config.json and best/ or last/, not a
    checkpoint), else None."""
    from ..io.checkpoint import checkpoint_files
    from ..train.config import checked_run_config, read_run_config

    if isinstance(model_or_path, torch.nn.Module):
        return None
    path = Path(model_or_path)
    run_file = path / "config.json"  # the run's, or that of a checkpoint written before vitkit.json
    if not run_file.is_file() or checkpoint_files(path)[1].exists():
        return None
    return checked_run_config(read_run_config(path), run_file)


def _tta_views(model_or_path, tta: bool | None, shift: int | None,
               flip: bool | None = None) -> tuple[bool, int, bool]:
    """The test-time views to score, (tta, tta_shift, tta_flip): those given, and for the ones not given (None) those the
    run that made ``model_or_path`` scored with (a run directory's, or that of the run directory a checkpoint,
    its last/ or best/, lies in); no TTA for anything else. A shift without flips is a ConfigError."""
    run = _run_config(model_or_path)
    if run is None and not isinstance(model_or_path, torch.nn.Module):
        run = _run_config(Path(model_or_path).parent)
    if tta is None:
        tta = bool(run is not None and run.tta)
    if shift is None:
        shift = run.tta_shift if run is not None and run.tta and tta else 0
    if shift < 0:
        raise ConfigError(f"--tta-shift: must be >= 0 px (0 = flips only), got {shift}")
    if shift and not tta:
        raise ConfigError(f"--tta-shift: {shift} px adds translated views to test-time flips; it needs --tta")
    if flip is None:
        flip = run.tta_flip if run is not None else True
    return tta, shift, bool(flip)


def _choose(splits, split: str | None, where: str, run, val_fraction: float, seed: int):
    """(the split, its ImageSet, what it is in words) to evaluate; see the module docstring. ``run``: the
    RunConfig whose own data this is (its validation carve is made again), else None. DataError when
    the data has no such split or it is empty."""
    from ..data.datasets import join_sets
    from ..data.splits import HELD_OUT, carve_validation

    carve = None
    if run is not None and splits.val is None:  # as the run split its data (train.build.open_data)
        fraction = run.data.val_fraction or (HELD_OUT if splits.test is None else 0.0)
        carve = ("the run's validation carve", fraction) if fraction else None
    elif run is None and split == "val" and splits.val is None:
        carve = ("validation carve", val_fraction)
    if carve:  # the run's own hold-out is skipped where a class has one image, as the run skipped it
        carve_validation(splits, carve[1], seed, where, required=run is None or bool(run.data.val_fraction))
    parts = [s for s in ("train", "val", "test") if getattr(splits, s) is not None]
    if split is None:
        split = "test" if splits.test is not None else "val" if splits.val is not None else "all"
    if split == "all":
        return split, join_sets([getattr(splits, s) for s in parts]), \
            "whole" if len(parts) == 1 else f"all parts ({', '.join(parts)})"
    ds = getattr(splits, split)
    if ds is None or len(ds) == 0:
        raise DataError(f"{where}: has no {split!r} split (it has: {', '.join(s for s in SPLITS if s in parts)})")
    if carve and split == "val":
        return split, ds, f"{carve[0]} (seed {seed}, {carve[1]:.0%} of the training images)"
    if carve and split == "train":
        return split, ds, f"train part less {carve[0]} (seed {seed})"
    return split, ds, f"{split} part"


# ---------------------------------------------------------------------------------------- scoring
def _score(model, net, path: FastPath, ds, remap, batch_size: int, strict: bool, skipped: list[dict],
           task: Task, tta: bool = False, tta_shift: int = 0, tta_flip: bool = True) -> Tally:
    """Run ``net`` (``model`` as ``path`` runs it) over ``ds`` batch by batch through the model's own
    preprocessing, counting in a Tally (and the images on the progress ``task``); ``tta``, ``tta_shift``,
    ``tta_flip``: the test-time views (``infer.paths.model_logits``).

    Streamed files are decoded in 4 threads; one that fails to decode is skipped and listed in ``skipped``
    (with ``strict`` it raises).
    """
    from ..data import eval_batch
    from ..data.augment import move_batch

    cfg = model.cfg
    dev = next(model.parameters()).device
    tally = Tally(cfg.num_classes, detail=True)
    # an executor starts its threads on first use: in-memory data never starts any
    with ThreadPoolExecutor(4) as pool, torch.no_grad():
        for start in range(0, len(ds), batch_size):
            idx = torch.arange(start, min(start + batch_size, len(ds)))
            if ds.paths is not None:
                idx, imgs = _decode_streamed(pool, ds, idx, strict, skipped)
                if imgs is None:
                    continue
                y = ds.labels[idx]
            else:
                imgs, y = ds.get_batch(idx)
            if remap is not None:
                y = remap[y]
            x = eval_batch(move_batch(imgs, dev), cfg.img_size, model.preprocess)
            with autocast(dev, path.precision):
                logits = model_logits(net, x, tta, tta_shift, tta_flip)
            tally.add(logits.float(), y, idx)
            task.update(min(start + batch_size, len(ds)))
    return tally


def _decode_streamed(pool, ds, idx: torch.Tensor, strict: bool, skipped: list[dict]):
    """The indices among ``idx`` whose files decode, and their images (B, C, H, W); (idx, None) when none
    does. A streamed file can pass the scan (its header reads) and still fail to decode."""

    def decode(i: int):
        try:
            return ds.get(i)[0]
        except DataError as e:
            if strict:
                raise
            skipped.append(dict(path=str(ds.paths[i]), reason=str(e)))
            return None

    decoded = list(pool.map(decode, idx.tolist()))
    keep = [j for j, im in enumerate(decoded) if im is not None]
    if not keep:
        return idx, None
    images = [decoded[j] for j in keep]
    if len({tuple(im.shape) for im in images}) > 1:
        return idx[keep], images  # whole images of different sizes (eval_batch fits each)
    return idx[keep], torch.stack(images)


def _metrics(tally: Tally, names: list[str]) -> dict:
    """Loss, top-1 / top-k, per-class precision / recall / F1 and their macro averages (over the classes
    present in the split), the class names and the confusion matrix."""
    conf, n = tally.conf, tally.n
    per_class, precisions, recalls, f1s = [], [], [], []
    for j in range(tally.num_classes):
        tp = int(conf[j, j])
        predicted, actual = int(conf[:, j].sum()), int(conf[j, :].sum())
        p = tp / predicted if predicted else 0.0
        r = tp / actual if actual else 0.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        per_class.append(dict(index=j, name=names[j], precision=p, recall=r, f1=f, support=actual))
        if actual:
            precisions.append(p)
            recalls.append(r)
            f1s.append(f)
    return dict(
        loss=tally.loss_sum / n,
        top1=tally.top1 / n,
        top5=tally.top5 / n,
        top5_k=tally.k5,
        macro_precision=float(np.mean(precisions)) if precisions else 0.0,
        macro_recall=float(np.mean(recalls)) if recalls else 0.0,
        macro_f1=float(np.mean(f1s)) if f1s else 0.0,
        per_class=per_class,
        classes=names,
        confusion=conf.tolist(),
    )


def _worst(tally: Tally, ds, remap, names: list[str], num_worst: int) -> list[dict]:
    """The ``num_worst`` most confidently wrong images: index, true and predicted class, probability (and
    path for streamed files)."""
    wp, wi, wpred = torch.cat(tally.wrong_prob), torch.cat(tally.wrong_idx), torch.cat(tally.wrong_pred)
    order = wp.argsort(descending=True)[:num_worst]
    worst = []
    for o in order.tolist():
        i = int(wi[o])
        true = int(ds.labels[i]) if remap is None else int(remap[ds.labels[i]])
        item = dict(index=i, true=names[true], pred=names[int(wpred[o])], prob=float(wp[o]))
        if ds.paths is not None:
            item["path"] = str(ds.paths[i])
        worst.append(item)
    return worst


# ---------------------------------------------------------------------------------------- outputs
def _write_outputs(out: Path, res: dict, ds, remap) -> dict:
    from ..io.atomic import atomic_write_bytes, atomic_write_text

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {out} exists and is not a directory")
    from ..io.atomic import ensure_dir

    ensure_dir(out)
    files = {"metrics": str(out / "metrics.json"), "confusion_json": str(out / "confusion.json")}
    atomic_write_text(out / "confusion.json",
                      json.dumps({"classes": res["classes"], "rows": "true", "cols": "predicted",
                                  "matrix": res["confusion"]}) + "\n")
    png = confusion_png(res["confusion"], res["classes"],
                        title=f"{res['split']} split: top-1 {100 * res['top1']:.2f}% of {res['num_images']}")
    if png is not None:
        atomic_write_bytes(out / "confusion.png", png)
        files["confusion_png"] = str(out / "confusion.png")
    if res["worst"]:
        atomic_write_bytes(out / "worst.png", worst_grid(ds, res["worst"]))
        files["worst_png"] = str(out / "worst.png")
    res = dict(res, files=files)
    atomic_write_text(out / "metrics.json", json.dumps(res, indent=1) + "\n")
    return files


def worst_grid(ds, worst: list[dict], cell: int = 96, cols: int = 8) -> bytes:
    """A PNG grid of images with 'true -> pred (prob)' under each."""
    from PIL import Image, ImageDraw

    rows = (len(worst) + cols - 1) // cols
    ncols = min(cols, len(worst))
    cap = 14
    canvas = Image.new("RGB", (ncols * (cell + 4) + 4, rows * (cell + cap + 6) + 4), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for k, w in enumerate(worst):
        img, _ = ds.get(w["index"])
        a = img.permute(1, 2, 0).numpy()
        a = np.repeat(a, 3, axis=-1) if a.shape[-1] == 1 else a
        h, wd = a.shape[:2]
        s = cell / max(h, wd)
        thumb = Image.fromarray(a).resize((max(1, round(wd * s)), max(1, round(h * s))),
                                          Image.NEAREST if s >= 2 else Image.BICUBIC)
        r, c = divmod(k, cols)
        x0, y0 = 4 + c * (cell + 4), 4 + r * (cell + cap + 6)
        canvas.paste(thumb, (x0 + (cell - thumb.width) // 2, y0 + (cell - thumb.height) // 2))
        draw.text((x0, y0 + cell + 2), f"{w['true'][:6]}>{w['pred'][:6]} {w['prob']:.2f}", fill=(160, 0, 0))
    buf = io.BytesIO()
    canvas.save(buf, format="PNG")
    return buf.getvalue()


__all__ = ["evaluate", "match_classes", "confusion_png", "worst_grid", "SPLITS", "CHOICES"]
