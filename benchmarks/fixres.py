"""Testing at a higher resolution than training (FixRes, Touvron et al. 2019), measured on trained runs.

    python benchmarks/fixres.py RUN [RUN ...] [--sizes 64,72,80,96] [--calib 1024] [--results FILE]

Each RUN is a vitkit run directory trained on an image folder (e.g. a `vitkit train --data PHOTOS` run, or
the runs benchmarks/time_to_accuracy.py writes). Its best checkpoint is evaluated on the run's own
validation carve (the run's seed and val_fraction) at each size of --sizes: the images resized so that
their short side is size / crop_pct (the run's data.crop_pct, antialiased, the checkpoint's
interpolation), centre cropped to size, normalised as the checkpoint says, and scored with the run's flip
TTA. The position embeddings are resampled to each size's grid (the model is rebuilt with
dynamic_img_size). Each size is scored twice: with the BatchNorm statistics as trained, and with them
re-estimated at that size (a cumulative average over --calib training images prepared the same way:
FixRes's point is that the test crops' apparent object size, and so the statistics, change with the
resolution). Prints a table and appends one record per run to --results
(default benchmarks/results/fixres.jsonl). Nothing is trained; a run takes seconds to a minute.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from vitkit.data import open_dataset  # noqa: E402
from vitkit.data.splits import HELD_OUT  # noqa: E402  (the carve of a run whose data has no val part)
from vitkit.infer.paths import model_logits  # noqa: E402
from vitkit.io.checkpoint import load  # noqa: E402
from vitkit.model.vit import VisionTransformer  # noqa: E402

from per_run import record_runs  # noqa: E402  (benchmarks/ is on sys.path)

RESULTS = ROOT / "benchmarks" / "results" / "fixres.jsonl"


def prepare(images: torch.Tensor, size: int, crop_pct: float, interpolation: str, mean, std) -> torch.Tensor:
    """uint8 (N, C, H, W) -> float (N, C, size, size): short side to size / crop_pct, centre crop, normalise."""
    x = images.float() / 255
    h, w = x.shape[-2:]
    short = int(round(size / crop_pct))
    scale = short / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    x = F.interpolate(x, size=(nh, nw), mode=interpolation, antialias=True, align_corners=False)
    top, left = (nh - size) // 2, (nw - size) // 2
    x = x[..., top:top + size, left:left + size]
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    return (x - m) / s


def score(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, prep, tta: bool, batch: int = 256) -> float:
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, len(labels), batch):
            logits = model_logits(model, prep(images[i:i + batch]), tta)
            right += int((logits.argmax(-1) == labels[i:i + batch]).sum())
    return right / len(labels)


def recalibrate(model: nn.Module, images: torch.Tensor, prep, batch: int = 256) -> int:
    """Re-estimate every BatchNorm's running statistics on ``images`` (a cumulative average); the count."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for i in range(0, len(images), batch):
            model(prep(images[i:i + batch]))
    model.eval()
    return len(bns)


def measure(run: Path, sizes: list[int], calib: int) -> dict:
    cfg = json.loads((run / "config.json").read_text())
    model = load(run)  # its best checkpoint
    mcfg = model.cfg
    pre = model.preprocess
    crop_pct = cfg["data"].get("crop_pct") or pre.crop_pct
    tta = bool(cfg.get("tta"))
    splits = open_dataset(cfg["data"]["path"], cfg["data"].get("format"), channels=mcfg.in_chans,
                          val_fraction=cfg["data"]["val_fraction"] or HELD_OUT, seed=cfg["seed"])
    val, train = splits.val, splits.train
    if min(val.images.shape[-2:]) <= min(mcfg.img_size):  # small images, decoded whole at the model's size:
        crop_pct = 1.0  # evaluated whole (no crop), as the run evaluated them
    g = torch.Generator().manual_seed(0)
    pick = torch.randperm(len(train), generator=g)[:calib]
    calib_images = train.images[pick]
    state = model.state_dict()
    rows = []
    for size in sizes:
        net = VisionTransformer(replace(mcfg, dynamic_img_size=True))
        net.load_state_dict(state)
        prep = lambda x, s=size: prepare(x, s, crop_pct, pre.interpolation, pre.mean, pre.std)  # noqa: E731
        t = time.perf_counter()
        as_trained = score(net, val.images, val.labels, prep, tta)
        bns = recalibrate(net, calib_images, prep) if calib else 0
        recal = score(net, val.images, val.labels, prep, tta) if bns else None
        rows.append({"size": size, "val_acc": round(as_trained, 5),
                     "val_acc_bn_recalibrated": None if recal is None else round(recal, 5),
                     "seconds": round(time.perf_counter() - t, 1)})
        print(f"{run}  {size:4d} px  {as_trained * 100:6.2f}%  " +
              (f"BN re-estimated {recal * 100:6.2f}%" if recal is not None else "(no BatchNorm)"), flush=True)
    return {"run": str(run), "model": cfg["model"], "img_size": mcfg.img_size, "seed": cfg["seed"],
            "data": cfg["data"]["path"], "val_images": len(val), "calib_images": int(len(pick)), "tta": tta,
            "crop_pct": crop_pct, "sizes": rows}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--sizes", default="64,72,80,96")
    p.add_argument("--calib", type=int, default=1024, help="training images the BatchNorm statistics are "
                   "re-estimated on (0: not re-estimated)")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    torch.manual_seed(0)
    record_runs("fixres.py", args.runs, lambda run: measure(run, sizes, args.calib), args.results, argv)

if __name__ == "__main__":
    main()
