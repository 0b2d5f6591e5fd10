"""How much faster an fp32 training step could be on this CPU at all: the step's matrix products
against the fastest fp32 matrix product torch runs here.

    PYTHONPATH=src python benchmarks/train_step_ceiling.py [--batch 128] [--threads 2]

The case is model_vs_timm.py's training step (patch 4, width 192, depth 6, 32 px, AdamW foreach). It
measures, in one process:
- the machine's fp32 matmul rate: the best GFLOP/s of square products (1024 to 4096) on the threads
  given, a practical peak for this CPU and torch build;
- the step: its seconds (median of 7), its FLOPs (torch's FlopCounterMode: forward and backward), and,
  under torch.profiler, the share of its time in matrix products (mm, addmm, bmm) and attention, and
  the rate its matrix products ran at;
- the ceilings: the step's speed if every FLOP ran at the peak rate (no other cost), and if only the
  time outside matrix products vanished (Amdahl). A path that keeps fp32 arithmetic cannot beat these.

Writes benchmarks/results/train_step_ceiling.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from model_vs_timm import TRAIN_MODEL, step_fn, vitkit_model  # the case of its training step (benchmarks/ on sys.path)

RESULTS = Path(__file__).resolve().parent / "results" / "train_step_ceiling.json"
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def matmul_peak(sizes=(1024, 2048, 4096), repeats: int = 5) -> dict:
    """GFLOP/s of fp32 square products, the best of ``repeats`` for each size."""
    rates = {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
        rates[n] = 2 * n**3 / best / 1e9
    return rates


def step_flops(step) -> dict[str, int]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    return {"total": counter.get_total_flops(), **by_op}


def profile_shares(step, passes: int = 2) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(passes):
            step()
    self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(self_us.values())
    attention = sum(v for k, v in self_us.items() if "scaled_dot_product" in k)
    matmul = sum(self_us.get(k, 0.0) for k in MATMULS)
    return {"matmul": matmul / total, "attention": attention / total, "other": 1 - (matmul + attention) / total,
            "matmul_seconds_per_step": matmul / 1e6 / passes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    peak = matmul_peak()
    step = step_fn(vitkit_model(TRAIN_MODEL[0]), "train", torch.randn(args.batch, 3, 32, 32))
    for _ in range(2):
        step()
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    flops = step_flops(step)
    shares = profile_shares(step)
    best = max(peak.values())
    matmul_flops = sum(v for k, v in flops.items() if k.split(".")[-1] in ("mm", "addmm", "bmm"))
    achieved = flops["total"] / seconds / 1e9
    at_peak = flops["total"] / (best * 1e9)
    row = {
        "torch": torch.__version__, "threads": args.threads, "batch": args.batch,
        "matmul_peak_gflops": {str(n): round(r, 1) for n, r in peak.items()},
        "step_seconds": round(seconds, 4), "step_seconds_all": [round(t, 4) for t in times],
        "step_gflop": round(flops["total"] / 1e9, 2),
        "step_gflop_by_op": {k: round(v / 1e9, 2) for k, v in flops.items() if k != "total"},
        "step_gflops_achieved": round(achieved, 1),
        "share_of_peak": round(achieved / best, 3),
        "time_shares": {k: round(shares[k], 3) for k in ("matmul", "attention", "other")},
        "matmul_gflops_in_step": round(matmul_flops / shares["matmul_seconds_per_step"] / 1e9, 1),
        "ceiling_all_flops_at_peak": round(seconds / at_peak, 2),
        "ceiling_no_time_outside_matmuls": round(1 / (shares["matmul"] + shares["attention"]), 2),
    }
    print(json.dumps(row, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(row, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
