"""Short-schedule comparison of candidate demo recipes on the built-in digits.

Each candidate trains with the same short schedule (``--epochs``, default 2) on 90% of the training
digits and is scored on the other 10% (validation; the test digits are not looked at). Prints a table
and writes benchmarks/results/train_demo_search.json.

    nice -n 5 python benchmarks/train_demo_search.py --epochs 2 --threads 1
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from vitkit.data import open_dataset
from vitkit.train import RunConfig, train

CANDIDATES = {
    "base": {},
    "timm-init": {"model_args": {"init": "timm"}},
    "stem32": {"model_args": {"stem_width": 32}},
    "batch64": {"batch_size": 64},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    splits = open_dataset(None, val_fraction=0.1, seed=0)
    splits.test = None
    rows = []
    for name, over in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        d = RunConfig().to_dict()
        d.update(epochs=args.epochs, plots=False)
        for k, v in over.items():
            d[k] = {**d[k], **v} if isinstance(v, dict) else v
        cfg = RunConfig.from_dict(d)
        t = time.perf_counter()
        cpu = time.process_time()
        with tempfile.TemporaryDirectory() as tmp:
            s = train(cfg, Path(tmp) / "run", splits=splits, log=lambda m: None)
        rows.append(dict(name=name, val_acc=s["val_acc"], wall_s=round(time.perf_counter() - t, 1),
                         cpu_s=round(time.process_time() - cpu, 1), overrides=over))
        print(f"{name:12s} val {s['val_acc'] * 100:6.2f}%  wall {rows[-1]['wall_s']:7.1f}s  cpu {rows[-1]['cpu_s']:7.1f}s",
              flush=True)
    out = Path(__file__).parent / "results" / "train_demo_search.json"
    out.write_text(json.dumps(dict(epochs=args.epochs, threads=args.threads, rows=rows), indent=2) + "\n")


if __name__ == "__main__":
    main()
