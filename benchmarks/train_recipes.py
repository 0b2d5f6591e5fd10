"""Accuracy and wall time of the training recipes, each run as the documented command.

    nice -n 5 python benchmarks/train_recipes.py demo
    python benchmarks/train_recipes.py pretrain-mini --minutes 10 --nproc 2 --threads 1
    nice -n 5 python benchmarks/train_recipes.py small-data --cifar /tmp/cifar10/train --minutes 20
    nice -n 5 python benchmarks/train_recipes.py pretrain-mini --cifar /tmp/cifar10/train --minutes 10
    nice -n 5 python benchmarks/train_recipes.py finetune --from runs/bench-pretrain-mini --cifar /tmp/cifar10/train

Each run prints its command, the JSON summary's accuracy and times, and writes
benchmarks/results/train_<recipe>.json (command, summary, machine load before the run).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path


def commands(a) -> dict[str, list[str]]:
    out = Path(a.out)
    return {
        # the README's first command, exactly
        "demo": ["vitkit", "train", "--out", str(out / "bench-demo"), "--json"],
        # small-data recipe: CIFAR-10 from scratch on a CPU budget (smaller width/depth fit the budget)
        "small-data": ["vitkit", "train", "--config", "configs/small-data.toml", "--data", a.cifar,
                       "--max-minutes", str(a.minutes), "--out", str(out / "bench-small-data"), "--json",
                       *sum((["--set", s] for s in a.set), [])],
        # the paper's pre-training recipe, scaled down: a mini ViT on CIFAR-10, effective batch 1024
        "pretrain-mini": ["vitkit", "train", "--config", "configs/pretrain.toml", "--data", a.cifar,
                          "--model", "vit_mini_patch4_32", "--batch-size", "1024", "--accum-steps", "8",
                          "--max-minutes", str(a.minutes), "--out", str(out / "bench-pretrain-mini"), "--json",
                          "--set", "schedule.warmup_steps=0", "--set", "schedule.warmup_fraction=0.1",
                          "--set", "data.val_fraction=0.1", "--set", "eval_every=0",
                          *sum((["--set", s] for s in a.set), [])],
        # fine-tuning recipe: a checkpoint to a higher resolution with a new head
        "finetune": ["vitkit", "finetune", a.src or str(out / "bench-pretrain-mini"), "--config",
                     "configs/finetune.toml", "--data", a.cifar, "--img-size", str(a.img_size),
                     "--max-minutes", str(a.minutes), "--out", str(out / "bench-finetune"), "--json",
                     *sum((["--set", s] for s in a.set), [])],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe", choices=["demo", "small-data", "pretrain-mini", "finetune"])
    ap.add_argument("--cifar", default="/tmp/cifar10/train")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--from", dest="src")
    ap.add_argument("--img-size", type=int, default=48)
    ap.add_argument("--out", default="runs")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--nproc", type=int, help="processes (vitkit train --nproc)")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    cmd = commands(a)[a.recipe]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    if a.nproc:
        cmd += ["--nproc", str(a.nproc)]
    run_dir = Path(cmd[cmd.index("--out") + 1])
    if run_dir.exists():
        shutil.rmtree(run_dir)
    exe = shutil.which("vitkit") or str(Path(sys.executable).parent / "vitkit")
    load = os.getloadavg()
    t = time.perf_counter()
    p = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    lines = p.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    rec = dict(recipe=a.recipe, command=shlex.join(cmd), wall_seconds=round(wall, 1), load_before=load,
               cpus=os.cpu_count(), summary=summary, output=lines[:-1][-6:])
    res = Path(__file__).parent / "results" / f"train_{a.recipe}.json"
    res.parent.mkdir(exist_ok=True)
    res.write_text(json.dumps(rec, indent=2) + "\n")
    acc = {k: summary[k] for k in ("test_acc", "val_acc") if k in summary}
    print("| recipe | command | accuracy | train s | wall s | load |")
    print(f"| {a.recipe} | `{shlex.join(cmd)}` | {acc} | {summary['train_seconds']} | {wall:.1f} | {load[0]:.1f} |")


if __name__ == "__main__":
    main()
