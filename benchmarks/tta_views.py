"""Test-time augmentation views, measured on trained runs: how much translated views add to flip averaging.

    python benchmarks/tta_views.py RUN [RUN ...] [--shifts 1,2] [--four 1] [--results FILE]

Each RUN is a vitkit run directory trained on small images (e.g. what benchmarks/ablate_small_data.py
--keep DIR keeps). Its best checkpoint scores the run's own validation carve (the run's seed and
val_fraction), prepared as the run evaluated it, with these views:
  - none: the image alone;
  - flip: the mean logits of the image and its mirror (what `tta=true` scores);
  - flip+shift-S (for each S of --shifts): half the flip logits, and half the mean of the flip logits
    of two copies moved S px diagonally, up-left and down-right (reflection padding): six forward
    passes (airbench's "mirror + translate" evaluation; what `tta_shift=S` scores);
  - flip+4shift-S (for each S of --four): the same with four copies, moved S px along both diagonals, an
    eighth each: ten forward passes.
Prints a table and appends one record per run to --results (default benchmarks/results/tta_views.jsonl).
Nothing is trained; a run takes seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from vitkit.data import open_dataset  # noqa: E402
from vitkit.data.splits import HELD_OUT  # noqa: E402
from vitkit.infer.paths import model_logits, shifted_views  # noqa: E402
from vitkit.io.checkpoint import load  # noqa: E402

from fixres import prepare  # noqa: E402  (benchmarks/ is on sys.path)
from per_run import record_runs  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "tta_views.jsonl"


def four_diagonals(model: nn.Module, x: torch.Tensor, shift: int) -> torch.Tensor:
    """Half the flip average of ``x`` and an eighth of each of four copies moved ``shift`` px along both
    diagonals (up-left, down-right, up-right, down-left), each flip-averaged: ten forward passes."""
    # the mirror's up-left and down-right copies, mirrored back, are the image's up-right and down-left ones
    copies = [*shifted_views(x, shift), *(c.flip(-1) for c in shifted_views(x.flip(-1), shift))]
    return model_logits(model, x, tta=True) / 2 + sum(model_logits(model, c, tta=True) for c in copies) / 8


def view_logits(model: nn.Module, x: torch.Tensor, view: str) -> torch.Tensor:
    if view in ("none", "flip"):
        return model_logits(model, x, tta=view == "flip")
    if view.startswith("flip+4shift-"):
        return four_diagonals(model, x, int(view.rsplit("-", 1)[1]))
    return model_logits(model, x, tta=True, shift=int(view.rsplit("-", 1)[1]))  # what tta_shift=S scores


def measure(run: Path, views: list[str], batch: int = 500) -> dict:
    cfg = json.loads((run / "config.json").read_text())
    model = load(run).eval()  # its best checkpoint
    pre, size = model.preprocess, model.cfg.img_size
    val = open_dataset(cfg["data"]["path"], cfg["data"].get("format"), channels=model.cfg.in_chans,
                       val_fraction=cfg["data"]["val_fraction"] or HELD_OUT, seed=cfg["seed"]).val
    if max(val.images.shape[-2:]) > max(size):
        raise SystemExit(f"tta_views.py: {run}: images of {tuple(val.images.shape[-2:])} px; this script "
                         f"measures runs on small images decoded at the model's size ({size})")
    rows = []
    for view in views:
        t = time.perf_counter()
        right = 0
        with torch.no_grad():
            for i in range(0, len(val), batch):
                x = prepare(val.images[i:i + batch], size[0], 1.0, pre.interpolation, pre.mean, pre.std)
                right += int((view_logits(model, x, view).argmax(-1) == val.labels[i:i + batch]).sum())
        rows.append({"view": view, "val_acc": round(right / len(val), 5), "seconds": round(time.perf_counter() - t, 1)})
        print(f"{run}  {view:<14} {right / len(val) * 100:6.2f}%", flush=True)
    return {"run": str(run), "model": cfg["model"], "seed": cfg["seed"], "data": cfg["data"]["path"],
            "val_images": len(val), "views": rows}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--shifts", default="1,2", help="the translations of the shifted views, in px (default 1,2)")
    p.add_argument("--four", default="", help="also score, for each of these shifts in px, four copies moved along "
                   "both diagonals, each flip-averaged (ten forward passes; default none)")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    views = ["none", "flip", *(f"flip+shift-{int(s)}" for s in args.shifts.split(","))]
    views += [f"flip+4shift-{int(s)}" for s in args.four.split(",") if s]
    record_runs("tta_views.py", args.runs, lambda run: measure(run, views), args.results, argv)


if __name__ == "__main__":
    main()
