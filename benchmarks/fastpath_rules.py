"""The measurements behind ``vitkit.infer.fastpath``'s rules, on this machine: which path pays, by work size.

    PYTHONPATH=src python benchmarks/fastpath_rules.py [--threads 2] [--compile] [--only channels_last]

For each question, the two ways are timed in alternation (repeat after repeat, so that load on a shared
machine hits both alike) and the median ratio of images per second is kept (> 1: the first way wins):
- bf16 (autocast) / fp32, inference and a training step, for models of growing forward FLOPs per image
  (the demo's conv-stem model, a 6-block ViT-Ti at 32 px with 4 px patches, ViT-Ti/16 at 224 px);
- channels_last / contiguous input and stem weights, inference for the conv-stem demo model; a training
  step (the batch made channels-last inside the step, as the trainer does) for the demo model at the
  demo's batch (64; and 32 on one thread, what each of the demo's two processes runs) and for the
  small-data recipe's whitening-stem model at batch 128;
- fused / foreach AdamW, one training step;
- int8 (``vitkit.infer.quantize.quantize_int8``) / fp32 inference;
- with ``--compile``: torch.compile / eager, a training step and inference, and the compile time.
JSON goes to benchmarks/results/fastpath_rules.json with the hardware features the rules read; ``--only
QUESTION`` times that question alone, into a file of its own (--out): channels_last, or bf16_train (bf16 /
fp32 training steps of the conv-stem recipes' models, channels-last, each at what one of a recipe's two
single-thread processes runs and at the global batch on --threads).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from model_vs_timm import step_fn  # the same steps as the comparison with timm (benchmarks/ is on sys.path)

import vitkit
from vitkit.infer.fastpath import vit_flops
from vitkit.infer.paths import detect_hardware
from vitkit.infer.quantize import quantize_int8
from vitkit.train.config import merge
from vitkit.train.recipe import SHORT_RUN, SMALL_DATA

MODELS = [  # (name, overrides, batch)
    ("vit_hybrid_mini_patch4_28", {}, 64),
    ("vit_tiny_patch4_32", {"depth": 6}, 128),
    ("vit_tiny_patch16_224", {}, 16),
]
CHANNELS_LAST_TRAIN = [  # (name, batch, threads): the two recipes with conv stems
    ("vit_hybrid_mini_patch4_28", 64, None),  # the demo's global batch, on --threads
    ("vit_hybrid_mini_patch4_28", 32, 1),  # what each of the demo's two processes runs
    ("vit_hybrid_whiten_patch4_32", 128, None),  # the small-data recipe
    ("vit_hybrid_whiten_patch4_32", 128, 1),  # one thread: steadier than two where other work shares the CPU
]

LONG_ARGS = SMALL_DATA["model_args"]  # the small-data model beyond SHORT_MINUTES (two convs at each resolution)
SHORT_ARGS = merge(LONG_ARGS, SHORT_RUN["model_args"])  # ... and at most SHORT_MINUTES (one at each)
BF16_TRAIN = [  # (name, model overrides, batch, threads): the conv-stem recipes' models as they train
    ("vit_hybrid_mini_patch4_28", {}, 32, 1),  # the demo: each of its two processes
    ("vit_hybrid_whiten_patch4_32", SHORT_ARGS, 64, 1),  # the small-data recipe: each of its two processes
    ("vit_hybrid_whiten_patch4_32", LONG_ARGS, 64, 1),
    ("vit_hybrid_whiten_patch4_32", LONG_ARGS, 128, None),  # its global batch on --threads
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


def channels_last_step(model, x: torch.Tensor, precision: str = "fp32"):
    """A training step of ``model`` with its conv weights channels-last, fed ``x`` (contiguous) made
    channels-last inside the step, as the trainer does with each batch."""
    model = model.to(memory_format=torch.channels_last)
    model.register_forward_pre_hook(lambda m, args: (args[0].contiguous(memory_format=torch.channels_last),))
    return step_fn(model, "train", x, precision)


def time_bf16_training(record, repeats: int, threads: int) -> None:
    """bf16 / fp32 training steps of the conv-stem recipes' models, channels-last as they train
    (BF16_TRAIN: each at what one of a recipe's two single-thread processes runs, and on ``threads``)."""
    for name, over, batch, n_threads in BF16_TRAIN:
        torch.set_num_threads(n_threads or threads)
        model = vitkit.create_model(name, seed=0, **over)
        x = torch.randn(batch, model.cfg.in_chans, *model.cfg.img_size)
        a = channels_last_step(copy.deepcopy(model), x, "bf16")
        b = channels_last_step(copy.deepcopy(model), x)
        res = race(a, b, batch, repeats, 3)
        record("bf16/fp32", name, "train", batch, vit_flops(model.cfg),
               dict(res, threads=n_threads or threads, model_args=over))
    torch.set_num_threads(threads)


def time_channels_last_training(record, repeats: int, threads: int) -> None:
    """channels_last / contiguous training steps of the conv-stem recipes' models (CHANNELS_LAST_TRAIN)."""
    for name, batch, n_threads in CHANNELS_LAST_TRAIN:
        torch.set_num_threads(n_threads or threads)
        model = vitkit.create_model(name, seed=0)
        x = torch.randn(batch, model.cfg.in_chans, *model.cfg.img_size)
        a = channels_last_step(copy.deepcopy(model), x)
        b = step_fn(copy.deepcopy(model), "train", x)
        res = race(a, b, batch, repeats, 3)
        record("channels_last", name, "train", batch, vit_flops(model.cfg), dict(res, threads=n_threads or threads))
    torch.set_num_threads(threads)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--only", choices=["channels_last", "bf16_train"], help="time this question alone")
    ap.add_argument("--out", default="benchmarks/results/fastpath_rules.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []

    def record(question, name, mode, batch, flops, res):
        rows.append(dict(question=question, model=name, mode=mode, batch=batch, flops_per_image=flops, **res))
        print(f"{question:14s} {name:28s} {mode:5s} b{batch:<4d} {flops / 1e9:7.3f} GFLOPs  ratio "
              f"{res['ratio']:.3f} [{res['ratio_min']:.3f}, {res['ratio_max']:.3f}]", flush=True)

    load_before = os.getloadavg()[0]  # the machine's load, recorded with the results (a shared CPU)
    if args.only == "channels_last":
        time_channels_last_training(record, args.repeats, args.threads)
    elif args.only == "bf16_train":
        time_bf16_training(record, args.repeats, args.threads)
    else:
        time_all(record, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    hw = detect_hardware(torch.device("cpu"))
    command = "PYTHONPATH=src python benchmarks/fastpath_rules.py " + " ".join(sys.argv[1:])
    out.write_text(json.dumps(dict(command=command.strip(), torch=torch.__version__, threads=args.threads,
                                   hardware=hw.__dict__, repeats=args.repeats,
                                   load_average=[load_before, os.getloadavg()[0]], rows=rows), indent=2) + "\n")
    print(f"wrote {out}")


def time_all(record, args) -> None:
    """Every question: bf16, channels-last, fused AdamW, int8 and (``--compile``) compile, by model."""
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
            cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
            a = step_fn(cl, "infer", x.contiguous(memory_format=torch.channels_last))
            b = step_fn(copy.deepcopy(model), "infer", x)
            record("channels_last", name, "infer", batch, flops, race(a, b, batch, args.repeats, iters))
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
    time_channels_last_training(record, args.repeats, args.threads)


if __name__ == "__main__":
    main()
