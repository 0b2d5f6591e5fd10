"""What the EMA of the weights costs a training step: one step of the small-data recipe's model with and
without the EMA update, timed in alternation in one process.

    PYTHONPATH=src python benchmarks/ema_cost.py [--model vit_hybrid_whiten_patch4_32] [--batch 128] [--threads 2]

A step is forward, backward and an AdamW step on a random batch at the model's size; "with EMA" adds
``EMA.update`` (train/ema.py) after it, as the trainer does. Prints the median step time of each, their
ratio and the update's own time, and writes benchmarks/results/ema_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import vitkit
from vitkit.train.ema import EMA

OUT = Path(__file__).resolve().parent / "results" / "ema_cost.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_hybrid_whiten_patch4_32")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15, help="timed steps of each kind (default 15)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = vitkit.create_model(args.model).train()
    c = model.cfg
    x = torch.randn(args.batch, c.in_chans, *c.img_size)
    y = torch.randint(0, c.num_classes, (args.batch,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ema = EMA(model, 0.999)

    def step(with_ema: bool, i: int) -> float:
        t = time.perf_counter()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if with_ema:
            ema.update(model, i)
        return time.perf_counter() - t

    for i in range(3):  # warm up both
        step(True, i)
        step(False, i)
    plain, averaged, update = [], [], []
    for i in range(args.repeats):
        plain.append(step(False, i))
        averaged.append(step(True, i))
        t = time.perf_counter()
        ema.update(model, i)
        update.append(time.perf_counter() - t)
    res = dict(command=f"PYTHONPATH=src python benchmarks/ema_cost.py --model {args.model} --batch {args.batch} "
                       f"--threads {args.threads} --repeats {args.repeats}",
               torch=torch.__version__, model=args.model, batch=args.batch, threads=args.threads,
               step_ms=round(statistics.median(plain) * 1e3, 2),
               step_with_ema_ms=round(statistics.median(averaged) * 1e3, 2),
               ema_update_ms=round(statistics.median(update) * 1e3, 3))
    res["with_over_without"] = round(res["step_with_ema_ms"] / res["step_ms"], 3)
    print(json.dumps(res))
    OUT.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
