"""Where a clock-bounded small-data run's training step goes, on this CPU: the step time of each of the
recipe's models (the short and the long one, at 3x the learning rate) as one of the run's 2 processes takes
it (its share of the batch, one thread), channels-last against contiguous in alternation, and the share of
the step spent in the convolutions, the matrix products (the optimizer's Newton-Schulz products among them)
and the optimizer step (torch's profiler).

    python benchmarks/step_profile.py [--rounds 3] [--candidates short-lr-3x,long-lr-3x]

Held to AVX2 as a laptop runs it: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2.
The steps are the speed measurement's own (train/speed.py ``process_speed``). Rows are appended to
benchmarks/results/step_profile.jsonl with the CPU's instruction set; compare rows of one run only.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from vitkit.core.hardware import cpu_capability
from vitkit.train.build import model_config
from vitkit.train.config import merge, resolve_config
from vitkit.train.recipe import SMALL_DATA, SMALL_DATA_CANDIDATES
from vitkit.train.resolve import settle_path
from vitkit.train.speed import process_speed

RESULTS = Path(__file__).resolve().parent / "results" / "step_profile.jsonl"
PROCESSES = 2  # as a clock-bounded run on a CPU of 2 or more cores trains
PARTS = {"conv backward": ("aten::convolution_backward",), "conv forward": ("aten::mkldnn_convolution",
         "aten::_convolution"), "matrix products": ("aten::mm", "aten::addmm", "aten::bmm"),
         "optimizer step": ("Optimizer.step#MuonAdamW.step",)}


def config(name: str, sets: list[str] | tuple[str, ...] = ()):
    """The candidate ``name`` as a clock-bounded run trains it, with ``sets`` (`--set KEY=VALUE` strings) over it."""
    cand = {c.name: c for c in SMALL_DATA_CANDIDATES}[name]
    base = merge(copy.deepcopy(SMALL_DATA), copy.deepcopy(cand.overrides))
    base["processes"] = PROCESSES
    cfg = resolve_config(None, {}, list(sets), base=base)
    mcfg = model_config(cfg)
    settle_path(cfg, mcfg)
    return cfg, mcfg


def step_ms(cfg, mcfg, channels_last: bool) -> float:
    cfg = copy.deepcopy(cfg)
    cfg.channels_last = channels_last
    per_process = cfg.batch_size // PROCESSES
    return 1000 * per_process / process_speed(cfg, mcfg, torch.device("cpu"), 1, 10)


def shares(cfg, mcfg) -> dict:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step_ms(cfg, mcfg, cfg.channels_last)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    out = {}
    for part, names in PARTS.items():
        key = "cpu_time_total" if part == "optimizer step" else "self_cpu_time_total"  # the step: all it calls
        out[part] = round(sum(getattr(e, key) for e in events if e.key in names) / max(total, 1), 3)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--candidates", default="short-lr-3x,long-lr-3x",
                    help="small-data candidates, comma-separated (train/recipe.py; default short-lr-3x,long-lr-3x)")
    args = ap.parse_args(argv)
    emulated = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
                if k in os.environ}
    for name in args.candidates.split(","):
        cfg, mcfg = config(name)
        times = {True: [], False: []}
        for _ in range(args.rounds):
            for cl in (True, False):
                times[cl].append(step_ms(cfg, mcfg, cl))
        row = {"candidate": name, "batch_per_process": cfg.batch_size // PROCESSES, "threads": 1,
               "step_ms_channels_last": round(sorted(times[True])[len(times[True]) // 2], 1),
               "step_ms_contiguous": round(sorted(times[False])[len(times[False]) // 2], 1),
               "shares_of_cpu_time": shares(cfg, mcfg), "cpu_isa": cpu_capability(), "emulated": emulated,
               "torch": torch.__version__, "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "command": " ".join(["python benchmarks/step_profile.py", *(argv if argv is not None else sys.argv[1:])])}
        print(json.dumps(row), flush=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
