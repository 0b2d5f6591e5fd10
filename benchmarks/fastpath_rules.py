"""The measurements behind ``vitkit.fastpath``'s rules, on this machine: which path pays, by work size.

    PYTHONPATH=src python benchmarks/fastpath_rules.py [--threads 2] [--compile]

For each question, the two ways are timed in alternation (repeat after repeat, so that load on a shared
machine hits both alike) and the median ratio of images per second is kept (> 1: the first way wins):
- bf16 (autocast) / fp32, inference and a training step, for models of growing forward FLOPs per image
  (the demo's conv-stem model, a 6-block ViT-Ti at 32 px with 4 px patches, ViT-Ti/16 at 224 px);
- channels_last / contiguous input and stem weights, for the conv-stem demo model;
- fused / foreach AdamW, one training step;
- int8 (``vitkit.quantize.quantize_int8``) / fp32 inference;
- with ``--compile``: torch.compile / eager, a training step and inference, and the compile time.
JSON goes to benchmarks/results/fastpath_rules.json with the hardware features the rules read.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

import vitkit
from vitkit.fastpath import vit_flops
from vitkit.quantize import quantize_int8
from vitkit.runtime import detect_hardware

from model_vs_timm import step_fn  # the same steps as the comparison with timm (benchmarks/ is on sys.path)

MODELS = [  # (name, overrides, batch)
    ("vit_hybrid_mini_patch4_28", {}, 64),
    ("vit_tiny_patch4_32", {"depth": 6}, 128),
    ("vit_tiny_patch16_224", {}, 16),
]


def race(a, b, batch: int, repeats: int, iters: int) -> dict:
    """Median (and range) of a's / b's images per second over ``repeats`` alternations after a warm-up."""
    def timed(fn):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters

    a(), b()
    ta, tb = [], []
    for i in range(repeats):
        pair = (a, b) if i % 2 == 0 else (b, a)  # alternate who goes first
        t = [timed(f) for f in pair]
        ta.append(t[0] if i % 2 == 0 else t[1])
        tb.append(t[1] if i % 2 == 0 else t[0])
    ratios = sorted(y / x for x, y in zip(ta, tb))
    return dict(ratio=statistics.median(ratios), ratio_min=ratios[0], ratio_max=ratios[-1],
                a_img_s=batch / statistics.median(ta), b_img_s=batch / statistics.median(tb))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/fastpath_rules.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []

    def record(question, name, mode, batch, flops, res):
        rows.append(dict(question=question, model=name, mode=mode, batch=batch, flops_per_image=flops, **res))
        print(f"{question:14s} {name:24s} {mode:5s} b{batch:<4d} {flops / 1e9:7.3f} GFLOPs  ratio "
              f"{res['ratio']:.3f} [{res['ratio_min']:.3f}, {res['ratio_max']:.3f}]", flush=True)

    for name, over, batch in MODELS:
        model = vitkit.create_model(name, seed=0, **over)
        x = torch.randn(batch, model.cfg.in_chans, *model.cfg.img_size)
        flops = vit_flops(model.cfg)
        iters = 1 if flops * batch > 2e10 else 3
        for mode in ("infer", "train"):
            a = step_fn(copy.deepcopy(model), mode, x, "bf16")
            b = step_fn(copy.deepcopy(model), mode, x)
            record("bf16/fp32", name, mode, batch, flops, race(a, b, batch, args.repeats, iters))
        if name == MODELS[0][0]:  # the conv stem
            for mode in ("infer", "train"):
                cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
                a = step_fn(cl, mode, x.contiguous(memory_format=torch.channels_last))
                b = step_fn(copy.deepcopy(model), mode, x)
                record("channels_last", name, mode, batch, flops, race(a, b, batch, args.repeats, iters))
        if name == MODELS[1][0]:
            a = step_fn(copy.deepcopy(model), "train", x, fused=True)
            b = step_fn(copy.deepcopy(model), "train", x)
            record("fused/foreach", name, "train", batch, flops, race(a, b, batch, args.repeats, iters))
        a = step_fn(quantize_int8(model), "infer", x)
        b = step_fn(copy.deepcopy(model), "infer", x)
        record("int8/fp32", name, "infer", batch, flops, race(a, b, batch, args.repeats, iters))
        if args.compile and name == MODELS[1][0]:
            for mode in ("infer", "train"):
                net = copy.deepcopy(model)
                a = step_fn(torch.compile(net), mode, x)
                t0 = time.perf_counter()
                a()
                compile_s = time.perf_counter() - t0
                b = step_fn(copy.deepcopy(model), mode, x)
                res = race(a, b, batch, args.repeats, iters)
                record("compile/eager", name, mode, batch, flops, dict(res, compile_s=compile_s))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    hw = detect_hardware(torch.device("cpu"))
    out.write_text(json.dumps(dict(torch=torch.__version__, threads=args.threads, hardware=hw.__dict__,
                                   repeats=args.repeats, rows=rows), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
