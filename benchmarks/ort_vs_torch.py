"""ONNX Runtime against torch for fp32 inference on the CPU: what ``vitkit.infer.fastpath.ORT_MEASURED`` rests on.

    PYTHONPATH=src python benchmarks/ort_vs_torch.py [--threads 2] [--repeats 5] [--batches 1,16]

For each model (random weights, seed 0: the demo's conv-stem model, ViT-Ti/16, ViT-S/16, ViT-B/16) and
batch, three ways are timed in alternation, repeat after repeat, the order rotating (so that load on a
shared machine hits all alike), on the same number of threads:
- onnxruntime: ``vitkit.infer.onnxrt.OrtModel``, the engine the tools use (fp32);
- torch eager: fp32, no compile;
- torch default: the path the tools took before the engine existed (``inference_path(engine='torch')``:
  bf16 where the CPU and the model's size make it pay, else fp32; never compiled on a CPU).
Each ratio is the median over the repeats of the other way's time / onnxruntime's time (> 1:
onnxruntime is faster), with its range. For each model, the setup: the seconds to export the model in
memory and build the session, plus what the first call costs beyond a later one (its check against
eager on a few images, onnxruntime's first allocations); and onnxruntime's largest logit difference
from eager.

The process's allocator is set as every vitkit command sets it (``keep_freed_memory``: the rule serves
the commands); ``--allocator default`` leaves glibc's as it comes, as the first measurements had it.

JSON goes to benchmarks/results/ort_vs_torch.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch
from model_vs_timm import race, ratio, step_fn  # the timing of the comparison with timm (benchmarks/ is on sys.path)

import vitkit
from vitkit.core.hardware import keep_freed_memory
from vitkit.infer.fastpath import vit_flops
from vitkit.infer.onnxrt import OrtModel
from vitkit.infer.paths import apply_path, detect_hardware, inference_path

MODELS = ("vit_hybrid_mini_patch4_28", "vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224")


def setup_seconds(model, x: torch.Tensor) -> tuple[OrtModel, dict]:
    """The engine for ``model`` and what setting it up cost: export + session, and the first call's extra."""
    t0 = time.perf_counter()
    net = OrtModel(model)
    build = time.perf_counter() - t0
    calls = []
    for _ in range(2):
        t0 = time.perf_counter()
        with torch.inference_mode():
            net(x)
        calls.append(time.perf_counter() - t0)
    if net.fallback is not None:
        sys.exit(f"onnxruntime fell back to torch: {net.fallback}")
    first = max(calls[0] - calls[1], 0.0)
    return net, dict(export_session_s=build, first_call_extra_s=first, setup_s=build + first)


def max_diff(model, net, x: torch.Tensor) -> float:
    with torch.inference_mode():
        return float((net(x) - model(x)).abs().max())


def case(name: str, batches: list[int], repeats: int) -> list[dict]:
    """The rows of one model: one per batch size."""
    model = vitkit.create_model(name, seed=0).eval()
    torch.nn.init.normal_(model.head.weight, std=0.02)  # a head with informative logits
    cfg, flops = model.cfg, vit_flops(model.cfg)
    g = torch.Generator().manual_seed(0)
    rows, net, setup = [], None, None
    for batch in batches:
        x = torch.randn(batch, cfg.in_chans, *cfg.img_size, generator=g)
        if net is None:
            net, setup = setup_seconds(model, x)
        path = inference_path(model, torch.device("cpu"), "auto", batch, engine="torch", batch=batch)
        ways = {"onnxruntime": lambda: net(x), "torch eager": step_fn(model, "infer", x),
                "torch default": step_fn(apply_path(copy.deepcopy(model), path), "infer", x, path.precision)}
        iters = max(1, min(50, math.ceil(0.5 / (flops * batch / 4e10 + 2e-3))))  # ~0.5 s a timing at least
        with torch.inference_mode():
            times = race(ways, repeats, iters, torch.device("cpu"))
        row = dict(model=name, batch=batch, flops_per_image=flops, iters=iters, torch_default=path.describe(),
                   img_s={w: batch / sorted(t)[len(t) // 2] for w, t in times.items()},
                   max_abs_diff=max_diff(model, net, x), **setup)
        for way in ("torch eager", "torch default"):
            row[f"onnxruntime / {way}"] = ratio(times, "onnxruntime", way)
        rows.append(row)
        r, d = row["onnxruntime / torch eager"], row["onnxruntime / torch default"]
        print(f"{name:26s} b{batch:<3d} ort/eager {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]  ort/default {d[0]:.3f} "
              f"[{d[1]:.3f}, {d[2]:.3f}]  setup {setup['setup_s']:.2f} s (export+session "
              f"{setup['export_session_s']:.2f} s)  diff {row['max_abs_diff']:.2g}", flush=True)
    return rows


def main() -> None:
    import onnxruntime

    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default="benchmarks/results/ort_vs_torch.json")
    ap.add_argument("--allocator", choices=["kept", "default"], default="kept", help="glibc's allocator as every "
                    "vitkit command sets it (core.hardware.keep_freed_memory), or as it comes")
    args = ap.parse_args()
    if args.allocator == "kept":
        keep_freed_memory()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        rows += case(name, batches, args.repeats)
        out.write_text(json.dumps(dict(torch=torch.__version__, onnxruntime=onnxruntime.__version__,
                                       threads=args.threads, hardware=detect_hardware(torch.device("cpu")).__dict__,
                                       command=" ".join(sys.argv), repeats=args.repeats, rows=rows), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
