"""glibc's allocator as it comes against ``vitkit.infer.paths.keep_freed_memory`` (what the command line
sets): fp32 inference and a training step, each setting in fresh processes, alternating round by round.

    PYTHONPATH=src python benchmarks/allocator.py [--rounds 3] [--threads 2]

A round runs one fresh process per setting (the order flipping each round); each process times
inference at batch 16 (224 px; ViT-Ti/16 unless --infer-model) and the training step of model_vs_timm.py (patch 4, width 192,
depth 6, 32 px, batch 128, AdamW), and reports its peak RSS. The ratio is kept / default per round:
median [range]. Appends to benchmarks/results/allocator.jsonl.

    PYTHONPATH=src python benchmarks/allocator.py --train cifar10/train [--minutes 1.5] [--rounds 2]

The same for whole runs: `vitkit train --data DATA --max-minutes M --nproc 1` (one process, so that the
setting reaches all of it), with the allocator as it comes against the command line's own, comparing the
images per second each trained (data augmentation, EMA and validation included).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "allocator.jsonl"


def images_per_second(step, batch: int, steps: int = 5) -> float:
    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - t0)


def child(setting: str, threads: int, infer_model: str) -> None:
    import torch
    from model_vs_timm import TRAIN_MODEL, step_fn, vitkit_model  # benchmarks/ is on sys.path

    from vitkit.core.hardware import keep_freed_memory

    applied = keep_freed_memory() if setting == "kept" else False
    torch.set_num_threads(threads)
    infer = images_per_second(step_fn(vitkit_model(infer_model), "infer", torch.randn(16, 3, 224, 224)), 16)
    train = images_per_second(step_fn(vitkit_model(TRAIN_MODEL[0]), "train", torch.randn(128, 3, 32, 32)), 128)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"setting": setting, "applied": applied, "infer_img_s": infer, "train_img_s": train,
                      "peak_rss_mib": peak}))


# the command line with its allocator setting turned off: the "default" side of --train
AS_IT_COMES = ("import sys, vitkit.infer.paths as r; r.keep_freed_memory = lambda: False; from vitkit.cli import main; "
               "sys.exit(main(sys.argv[1:]))")


def train_runs(args) -> dict:
    import os
    import tempfile

    root = Path(__file__).resolve().parent.parent
    runs: dict[str, list[float]] = {"default": [], "kept": []}
    for r in range(args.rounds):
        for setting in (("default", "kept") if r % 2 == 0 else ("kept", "default")):
            out = Path(tempfile.mkdtemp(prefix="allocator_")) / "run"
            head = ["-c", AS_IT_COMES] if setting == "default" else ["-m", "vitkit"]
            cmd = [sys.executable, *head, "train", "--data", args.train, "--max-minutes", str(args.minutes),
                   "--nproc", "1", "--threads", str(args.threads), "--seed", "0", "--out", str(out), "--json", "--quiet"]
            p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True,
                               env=dict(os.environ, PYTHONPATH=str(root / "src")))
            summary = json.loads(p.stdout.strip().splitlines()[-1])
            batch = json.loads((out / "config.json").read_text())["batch_size"]
            runs[setting].append(summary["step"] * batch / summary["train_seconds"])
    r = sorted(k / d for k, d in zip(runs["kept"], runs["default"]))
    return {"train": args.train, "minutes": args.minutes, "rounds": args.rounds, "threads": args.threads,
            "run img/s kept / default": [round(statistics.median(r), 3), round(r[0], 3), round(r[-1], 3)],
            "img_s": {s: [round(x, 1) for x in v] for s, v in runs.items()},
            "command": "PYTHONPATH=src python benchmarks/allocator.py " + " ".join(sys.argv[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train", metavar="DATA", help="compare whole training runs on DATA instead")
    ap.add_argument("--minutes", type=float, default=1.5, help="each training run's clock (--train)")
    ap.add_argument("--infer-model", default="vit_tiny_patch16_224", help="the model timed in inference")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        return child(args._child, args.threads, args.infer_model)
    if args.train:
        return write(train_runs(args))
    runs: dict[str, list[dict]] = {"default": [], "kept": []}
    for r in range(args.rounds):
        for setting in (("default", "kept") if r % 2 == 0 else ("kept", "default")):
            out = subprocess.run([sys.executable, __file__, "--_child", setting, "--threads", str(args.threads),
                                  "--infer-model", args.infer_model],
                                 capture_output=True, text=True, check=True)
            runs[setting].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def ratio(key: str) -> list[float]:
        r = sorted(k[key] / d[key] for k, d in zip(runs["kept"], runs["default"]))
        return [round(statistics.median(r), 3), round(r[0], 3), round(r[-1], 3)]

    row = {"rounds": args.rounds, "threads": args.threads, "infer_model": args.infer_model, "applied": runs["kept"][0]["applied"],
           "infer kept / default": ratio("infer_img_s"), "train kept / default": ratio("train_img_s"),
           "img_s": {s: {k: round(statistics.median(x[k] for x in v), 1) for k in ("infer_img_s", "train_img_s")}
                     for s, v in runs.items()},
           "peak_rss_mib": {s: round(max(x["peak_rss_mib"] for x in v)) for s, v in runs.items()},
           "command": "PYTHONPATH=src python benchmarks/allocator.py " + " ".join(sys.argv[1:])}
    write(row)


def write(row: dict) -> None:
    print(json.dumps(row))
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
