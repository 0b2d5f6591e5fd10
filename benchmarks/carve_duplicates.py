"""How much near-duplicates of training images inflate a validation carve's accuracy.

    python benchmarks/carve_duplicates.py RUN [RUN ...] [--size 16] [--thresholds 0.90,0.95,0.98]
                                          [--results FILE]

A carve cut at random from a training folder keeps images that have near-copies left in training (the
same photo re-cropped, shifted or recoloured: CIFAR-10's training split has many, see Barz & Denzler,
"Do we train on test data? Purging CIFAR of near-duplicates", 2020); the model has, in effect, seen
them, and held-out images from another source have none. For each RUN (a vitkit run directory on an
image folder), each image of its validation carve (the run's seed and val_fraction) is compared with
every training image: both shrunk to --size px grey (area average), centred and scaled to unit norm;
the nearest training image's cosine similarity is its score. For each threshold, the share of the carve
at or above it and the run's accuracy on those images and on the rest (best checkpoint, the run's flip
TTA) are printed: the accuracy on the rest is what the carve reads without them. Nothing is trained.
Appends one record per run to --results (default benchmarks/results/carve_duplicates.jsonl).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from vitkit.data import eval_batch, open_dataset  # noqa: E402
from vitkit.data.splits import HELD_OUT  # noqa: E402
from vitkit.infer.paths import model_logits  # noqa: E402
from vitkit.io.checkpoint import load  # noqa: E402

from per_run import record_runs  # noqa: E402  (benchmarks/ is on sys.path)

RESULTS = ROOT / "benchmarks" / "results" / "carve_duplicates.jsonl"


def signature(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (N, C, H, W) -> (N, size * size) grey thumbnails, centred, unit norm."""
    x = images.float().mean(1, keepdim=True)
    x = F.adaptive_avg_pool2d(x, size).flatten(1)
    x = x - x.mean(1, keepdim=True)
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-6)


def nearest(val: torch.Tensor, train: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Each row of ``val``'s highest cosine similarity to a row of ``train``."""
    return torch.cat([(val[i:i + chunk] @ train.T).max(1).values for i in range(0, len(val), chunk)])


@torch.no_grad()
def correct(model, images, batch: int = 256, tta: bool = False) -> torch.Tensor:
    """Whether ``model`` classifies each image of an in-memory ImageSet right (bool per image)."""
    out = []
    for i in range(0, len(images), batch):
        x = eval_batch(images.images[i:i + batch], model.cfg.img_size, model.preprocess)
        out.append(model_logits(model, x, tta).argmax(-1) == images.labels[i:i + batch])
    return torch.cat(out)


def measure(run: Path, size: int, thresholds: list[float]) -> dict:
    cfg = json.loads((run / "config.json").read_text())
    model = load(run)
    splits = open_dataset(cfg["data"]["path"], cfg["data"].get("format"), channels=model.cfg.in_chans,
                          val_fraction=cfg["data"]["val_fraction"] or HELD_OUT, seed=cfg["seed"])
    val, train = splits.val, splits.train
    if val.images is None or train.images is None:
        sys.exit(f"{run}: its images are not held in memory at one size; this script reads such data only")
    score = nearest(signature(val.images, size), signature(train.images, size))
    right = correct(model, val, tta=bool(cfg.get("tta")))
    rows = []
    print(f"{run}: carve {len(val)} images, accuracy {right.float().mean() * 100:.2f}%")
    for t in thresholds:
        dup = score >= t
        n = int(dup.sum())
        acc_dup = right[dup].float().mean().item() if n else None
        acc_rest = right[~dup].float().mean().item()
        rows.append({"threshold": t, "near_duplicates": n, "share": round(n / len(val), 5),
                     "acc_near_duplicates": None if acc_dup is None else round(acc_dup, 5),
                     "acc_rest": round(acc_rest, 5)})
        print(f"  similarity >= {t:.2f}: {n:5d} images ({n / len(val) * 100:5.2f}%), accuracy on them "
              f"{'-' if acc_dup is None else f'{acc_dup * 100:6.2f}%'}, on the rest {acc_rest * 100:6.2f}%")
    return {"run": str(run), "data": cfg["data"]["path"], "seed": cfg["seed"], "val_images": len(val),
            "val_acc": round(right.float().mean().item(), 5), "size": size, "rows": rows}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--thresholds", default="0.90,0.95,0.98")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    record_runs("carve_duplicates.py", args.runs, lambda run: measure(run, args.size, thresholds), args.results, argv)

if __name__ == "__main__":
    main()
