"""How much a run's validation accuracy depends on the JPEG encoding its carve shares with its training images.

    python benchmarks/carve_encoding.py RUN [RUN ...] [--encodings q95-444,q90-420,q75-420,q50-420]
                                        [--results FILE]

A validation carve cut from the training folder holds images compressed by the same encoder, at the
same quality and chroma subsampling, as the images the model trained on; held-out images from another
source are not. Each RUN's best checkpoint is scored on its own carve (the run's seed and val_fraction)
as decoded, and again after each image is re-encoded with Pillow at each --encodings entry (qQ-SSS:
JPEG quality Q, chroma subsampling 4:4:4 or 4:2:0) and decoded, with the run's flip TTA. A model that
learned its encoder's artefacts loses accuracy on the re-encoded copies. The JPEG quantisation table
and subsampling of the data's first file are printed (the encoder's quality, estimated). Nothing is
trained. Appends one record per run to --results (default benchmarks/results/carve_encoding.jsonl).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from vitkit.data import open_dataset  # noqa: E402
from vitkit.data.splits import HELD_OUT  # noqa: E402  (the carve of a run whose data has no val part)
from vitkit.io.checkpoint import load  # noqa: E402
from vitkit.train.trainer import evaluate_split  # noqa: E402

from per_run import record_runs  # noqa: E402  (benchmarks/ is on sys.path)

RESULTS = ROOT / "benchmarks" / "results" / "carve_encoding.jsonl"
SUBSAMPLING = {"444": 0, "422": 1, "420": 2}  # Pillow's codes


def reencode(images: torch.Tensor, quality: int, subsampling: str) -> torch.Tensor:
    """uint8 (N, 3, H, W) -> the same images JPEG-encoded at ``quality`` and ``subsampling`` and decoded."""
    out = torch.empty_like(images)
    for i, img in enumerate(images):
        buf = io.BytesIO()
        Image.fromarray(img.permute(1, 2, 0).numpy()).save(buf, "JPEG", quality=quality,
                                                           subsampling=SUBSAMPLING[subsampling])
        buf.seek(0)
        out[i] = torch.from_numpy(np.array(Image.open(buf).convert("RGB"))).permute(2, 0, 1)
    return out


def first_jpeg(root: Path) -> str:
    """The quantisation (first luminance entries) and subsampling of the first JPEG under ``root``."""
    for f in sorted([*root.glob("*/*.jp*g"), *root.glob("*/*/*.jp*g")]):  # class folders (links followed)
        im = Image.open(f)
        layers = getattr(im, "layer", None)
        return f"{f.name}: luminance table {list(im.quantization[0])[:8]}..., layers {layers}"
    return "no JPEG file"


def measure(run: Path, encodings: list[str]) -> dict:
    cfg = json.loads((run / "config.json").read_text())
    model = load(run)
    splits = open_dataset(cfg["data"]["path"], cfg["data"].get("format"), channels=model.cfg.in_chans,
                          val_fraction=cfg["data"]["val_fraction"] or HELD_OUT, seed=cfg["seed"])
    val = splits.val
    if val.images is None:
        sys.exit(f"{run}: its carve is not held in memory at one size; this script reads such carves only")
    tta = bool(cfg.get("tta"))
    dev = torch.device("cpu")
    rows = {"as decoded": evaluate_split(model, val, dev, tta=tta)["acc"]}
    for enc in encodings:
        q, sub = enc.lstrip("q").split("-")
        rows[enc] = evaluate_split(model, replace(val, images=reencode(val.images, int(q), sub)), dev, tta=tta)["acc"]
    print(first_jpeg(Path(cfg["data"]["path"])))
    for name, acc in rows.items():
        print(f"{run}  {name:>10}  {acc * 100:6.2f}%  ({(acc - rows['as decoded']) * 100:+.2f})", flush=True)
    return {"run": str(run), "model": cfg["model"], "data": cfg["data"]["path"], "seed": cfg["seed"],
            "val_images": len(val), "encoder": first_jpeg(Path(cfg["data"]["path"])),
            "val_acc": {k: round(v, 5) for k, v in rows.items()}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--encodings", default="q95-444,q90-420,q75-420,q50-420")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    encodings = [e.strip() for e in args.encodings.split(",") if e.strip()]
    record_runs("carve_encoding.py", args.runs, lambda run: measure(run, encodings), args.results, argv)

if __name__ == "__main__":
    main()
