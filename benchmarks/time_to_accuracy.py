"""Time to accuracy: vitkit's default for a folder against timm's VisionTransformer with a standard
recipe, for the same training budget, on the same validation carve, one after the other in one run.

    python benchmarks/time_to_accuracy.py DATA [--minutes 5] [--seed 0] [--threads N]
                                         [--timm-python .venv-ref/bin/python] [--branch vitkit]

vitkit: `vitkit train --data DATA --max-minutes M --seed S --set data.val_fraction=0.1`, i.e. whatever
recipe vitkit picks for DATA by itself (the line it opens with is recorded).
timm: VisionTransformer(patch 4, width 192, depth 6, 3 heads) at the data's 32 px, AdamW (lr 1e-3,
weight decay 0.05), a 5% warmup then cosine decay fitted to the same clock, label smoothing 0.1, random
crop with 4-px padding + horizontal flip, batch 128; it runs in a Python that has timm (the
`--timm-python` interpreter runs this script with `--branch timm`; only that branch imports timm).
Both read DATA with vitkit's reader and carve the same 10% (stratified, seeded with --seed) as the
validation split; both count only training time against the budget (not decoding, not the final
evaluation) and use the same CPUs (timm one process of --threads threads; vitkit the processes and
threads it chooses for itself, e.g. 2 processes of 1 thread on 2 cores, recorded). Prints both accuracies and their difference and
appends the record (with the command) to benchmarks/results/time_to_accuracy.jsonl.

Timings are only comparable within one run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "time_to_accuracy.jsonl"
VAL_FRACTION = 0.1
TIMM_RECIPE = dict(patch_size=4, embed_dim=192, depth=6, num_heads=3, lr=1e-3, weight_decay=0.05, warmup=0.05,
                   label_smoothing=0.1, pad=4, batch_size=128)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a class-folder dataset (or any layout vitkit reads)")
    p.add_argument("--minutes", type=float, default=5.0, help="training budget of each run (default 5)")
    p.add_argument("--seed", type=int, default=0, help="the validation carve's and the runs' seed (default 0)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of timm's run (default: all usable) and "
                   "of each vitkit process (default: vitkit's own choice, as for a user)")
    p.add_argument("--timm-python", default=str(ROOT / ".venv-ref" / "bin" / "python"),
                   help="a Python with timm (default: .venv-ref, which benchmarks/parity.sh makes)")
    p.add_argument("--out", default=None, help="folder for the vitkit run (default: a temporary one)")
    p.add_argument("--branch", choices=("both", "vitkit", "timm"), default="both",
                   help="both (default), or one side alone: vitkit (no timm needed), timm (prints its record)")
    return p.parse_args(argv)


def threads(args) -> int:
    if args.threads:
        return args.threads
    sys.path.insert(0, str(ROOT / "src"))
    from vitkit.core.hardware import usable_cpus

    return usable_cpus()


# ============================================================================================ vitkit
def clock_run(data: str, minutes: float, seed: int, out: Path, extra: list[str] = ()) -> tuple[int, dict | None, list]:
    """`vitkit train --data DATA --max-minutes MINUTES --seed SEED` into ``out``, validated on SEED's carve of
    VAL_FRACTION, with ``extra`` arguments (also used by ablate_small_data.py and processes_threads.py):
    (exit code, the --json summary or None when it failed, the command)."""
    cmd = [sys.executable, "-m", "vitkit", "train", "--data", data, "--max-minutes", str(minutes),
           "--seed", str(seed), "--set", f"data.val_fraction={VAL_FRACTION}", "--out", str(out), "--json", "--quiet",
           *extra]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    summary = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
    return p.returncode, summary, cmd


def run_vitkit(args) -> dict:
    """vitkit's own choice for the data, as its command line makes it; the summary and the recipe line."""
    out = Path(args.out or tempfile.mkdtemp(prefix="tta_vitkit_")) / "run"
    threads = ["--threads", str(args.threads)] if args.threads else []  # threads per process; else vitkit's choice
    code, summary, cmd = clock_run(args.data, args.minutes, args.seed, out, threads)
    if code != 0:
        sys.exit(f"vitkit run failed (exit code {code}): {shlex.join(cmd)}")
    config = json.loads((out / "config.json").read_text())
    return {"val_acc": summary["val_acc"], "train_seconds": summary["train_seconds"], "epochs": summary["epochs"],
            "model": config["model"], "processes": config.get("processes"), "threads": config.get("threads"),
            "command": shlex.join(cmd[1:])}


# ============================================================================================== timm
def run_timm(args, n_threads: int) -> dict:
    """timm's ViT with the standard recipe in the --timm-python interpreter (this script, --branch timm)."""
    cmd = [args.timm_python, __file__, args.data, "--branch", "timm", "--minutes", str(args.minutes),
           "--seed", str(args.seed), "--threads", str(n_threads)]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"timm run failed (exit code {p.returncode}): {shlex.join(cmd)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def timm_branch(args) -> dict:
    """Train timm's VisionTransformer for the budget on the carve; its validation accuracy. Data, carve and
    augmentation come from vitkit (the same reader and split as the vitkit run)."""
    import timm  # noqa: F401 - only this branch needs it
    import torch
    import torch.nn.functional as F
    from timm.models.vision_transformer import VisionTransformer

    from vitkit.data import AugmentConfig, BatchAugment, eval_batch, open_dataset
    from vitkit.train.build import data_preprocess

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    r = TIMM_RECIPE
    splits = open_dataset(args.data, img_size=32, val_fraction=VAL_FRACTION, seed=args.seed)
    train, val = splits.train, splits.val
    pre = data_preprocess(train, 3)
    model = VisionTransformer(img_size=32, patch_size=r["patch_size"], embed_dim=r["embed_dim"], depth=r["depth"],
                              num_heads=r["num_heads"], num_classes=len(splits.classes))
    opt = torch.optim.AdamW(model.parameters(), lr=r["lr"], weight_decay=r["weight_decay"])
    aug = BatchAugment(AugmentConfig(crop="pad", pad=r["pad"], hflip=0.5, label_smoothing=r["label_smoothing"]),
                       32, pre, len(splits.classes))
    g = torch.Generator().manual_seed(args.seed)
    budget, seen, start = args.minutes * 60, 0, time.perf_counter()
    model.train()
    while (elapsed := time.perf_counter() - start) < budget:
        for idx in torch.randperm(len(train), generator=g).split(r["batch_size"]):
            if (elapsed := time.perf_counter() - start) >= budget or len(idx) < r["batch_size"]:
                break
            frac = elapsed / budget  # the schedule fitted to the clock: warmup, then cosine to zero
            lr = r["lr"] * (frac / r["warmup"] if frac < r["warmup"] else
                            0.5 * (1 + math.cos(math.pi * (frac - r["warmup"]) / (1 - r["warmup"]))))
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = aug(*train.get_batch(idx), g)
            loss = torch.sum(-y * F.log_softmax(model(x), -1), -1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen += len(idx)
    train_seconds = time.perf_counter() - start
    model.eval()
    correct = 0
    with torch.no_grad():
        for idx in torch.arange(len(val)).split(256):
            images, labels = val.get_batch(idx)
            correct += int((model(eval_batch(images, 32, pre)).argmax(-1) == labels).sum())
    return {"val_acc": round(correct / len(val), 5), "train_seconds": round(train_seconds, 2),
            "epochs": round(seen / len(train), 3), "model": "timm VisionTransformer " + json.dumps(r),
            "command": shlex.join(["python", "benchmarks/time_to_accuracy.py", *sys.argv[1:]])}


# ============================================================================================== main
def main(argv=None) -> None:
    args = parse_args(argv)
    if args.branch == "timm":
        print(json.dumps(timm_branch(args)))
        return
    with_timm = args.branch == "both"
    if with_timm and not Path(args.timm_python).is_file():  # before the first run, not after it
        sys.exit(f"--timm-python {args.timm_python}: no such interpreter (make one with benchmarks/parity.sh, "
                 f"or run vitkit alone with --branch vitkit)")
    n = threads(args)
    vk = run_vitkit(args)
    print(f"vitkit ({vk['model']}): val accuracy {vk['val_acc'] * 100:.2f}% after {vk['train_seconds']:.0f} s "
          f"({vk['epochs']:.2f} epochs)", flush=True)
    tm, diff = None, None
    if with_timm:
        tm = run_timm(args, n)
        print(f"timm ViT (patch 4, width 192, depth 6): val accuracy {tm['val_acc'] * 100:.2f}% after "
              f"{tm['train_seconds']:.0f} s ({tm['epochs']:.2f} epochs)")
        diff = round(vk["val_acc"] - tm["val_acc"], 5)
        print(f"difference (vitkit - timm): {diff * 100:+.2f} points, {args.minutes:g} min each, {n} thread(s)")
    rec = {"data": args.data, "minutes": args.minutes, "seed": args.seed, "threads": n,
           "val_fraction": VAL_FRACTION, "vitkit": vk, "timm": tm, "difference": diff,
           "command": shlex.join(["python", "benchmarks/time_to_accuracy.py", *(argv or sys.argv[1:])])}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
