"""Time to accuracy: vitkit's default for a folder against timm baselines with a standard recipe, for the
same training budget, on the same validation carve, one after the other in one run.

    python benchmarks/time_to_accuracy.py DATA [--minutes 5] [--seed 0] [--threads N]
                                         [--baselines resnet18,vit_tiny] [--size PX]
                                         [--timm-python .venv-ref/bin/python] [--branch vitkit]
                                         [--results FILE] [--weights W [--img-size PX]]
                                         [--more-seeds 1,2] [--test DIR] [--set KEY=VALUE ...]

vitkit: `vitkit train --data DATA --max-minutes M --seed S --set data.val_fraction=0.1`, i.e. whatever
recipe vitkit picks for DATA by itself (its resolved config.json is recorded as its recipe).
The baselines, chosen from the data's image size (read from a few headers) unless --baselines names them:
- small images (at most 64 px, CIFAR): `vit_p4`, timm's VisionTransformer(patch 4, width 192, depth 6,
  3 heads) at 32 px; AdamW (lr 1e-3, weight decay 0.05 on every parameter), crop with 4-px zero padding
  + horizontal flip, batch 128; the images decoded at 32 px (resized + centre cropped), normalised with
  the training images' mean and std.
- photos (larger than 64 px): `resnet18`, timm.create_model("resnet18", pretrained=False) (11.2M
  parameters), AdamW lr 2e-3; and `vit_tiny`, timm.create_model("vit_tiny_patch16_224", pretrained=False,
  img_size=128) (ViT-Ti/16: width 192, depth 12, 3 heads, 5.5M parameters, 64 tokens at 128 px), AdamW
  lr 1e-3. Both at 128 px, batch 64, weight decay 0.05 except on biases and norms (timm's create_optimizer_v2), random
  resized crops of scale 0.08..1 (timm's default) and aspect 3/4..4/3 drawn from the whole image +
  horizontal flip; ImageNet's mean and std; the images kept whole at a short side of 146 (128 / 0.875)
  and evaluated as timm does: short side resized to 146, centre crop of 128.
All baselines: a 5% warmup then cosine decay to zero fitted to the clock, label smoothing 0.1, no mixup,
no EMA. --size PX trains the baselines at PX px instead (photos: short side PX / 0.875).
Each baseline runs in a Python that has timm (the `--timm-python` interpreter runs this script with
`--branch timm --baselines NAME`, one baseline per process, one after another; only that branch imports
timm). All runs read DATA with vitkit's reader and carve the same 10% (stratified, seeded with --seed) as
the validation split; all count only training time against the budget (not decoding, not the final
evaluation) and use the same CPUs (each baseline one process of --threads threads; vitkit the processes
and threads it chooses for itself, e.g. 2 processes of 1 thread on 2 cores, recorded). Prints a table
of the accuracies and appends one record (every result, each baseline's recipe, the command) to
--results (default benchmarks/results/time_to_accuracy.jsonl).

--more-seeds 1,2 runs vitkit alone again with each of those seeds (each with its own carve and its own
draws) after the comparison, and reports the --seed run's accuracy with the range over all its seeds
beside it (`seed_range` in the record): the figure a user gets is the default seed's, and the range says
how far one run may fall from it.

--weights W adds a fine-tuning run beside them, in the same run: `vitkit finetune W --data DATA --max-minutes M
--seed S --set data.val_fraction=0.1 [--img-size PX]` (what it trains, probe / last blocks / full, chosen by
vitkit's own rule and recorded), and reports its lead over vitkit's run from scratch and over each baseline
(`--baselines none`: no timm run).

--test DIR also scores vitkit's run on held-out images, after it ends and outside its budget: `vitkit eval RUN
--data DIR --split all`, with the test-time views the run scored with (`test_acc` and `test_views` in its
record), for data whose carve reads high (near-duplicates across it, as traffic signs' tracks of one sign).
--set KEY=VALUE (repeatable) lays a config value over vitkit's choice, as `vitkit train --set` does: to measure
what the default gains over one of its parts turned off, by the same command.

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
PHOTO_SIDE = 64  # data whose images are larger than this (the largest side of a few read) get the photo baselines
IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
_COMMON = {"optimizer": "AdamW", "weight_decay": 0.05, "warmup": 0.05, "schedule": "cosine to 0, fitted to the clock",
           "label_smoothing": 0.1, "hflip": 0.5}
_PHOTO = {**_COMMON, "size": 128, "batch_size": 64, "no_decay_biases_norms": True, "crop": "rrc",
          "rrc_scale": (0.08, 1.0), "rrc_ratio": (3 / 4, 4 / 3), "crop_pct": 0.875, "norm": IMAGENET}
BASELINES = {  # name -> recipe (size: the default; --size overrides it)
    "vit_p4": {**_COMMON, "model": "timm VisionTransformer", "size": 32, "lr": 1e-3, "batch_size": 128,
               "model_args": {"patch_size": 4, "embed_dim": 192, "depth": 6, "num_heads": 3},
               "no_decay_biases_norms": False, "crop": "pad", "pad": 4, "crop_pct": 1.0,
               "norm": "the training images' mean and std"},
    "resnet18": {**_PHOTO, "model": "timm resnet18", "lr": 2e-3, "interpolation": "bilinear"},
    "vit_tiny": {**_PHOTO, "model": "timm vit_tiny_patch16_224", "lr": 1e-3, "interpolation": "bicubic",
                 "model_args": {"patch_size": 16, "embed_dim": 192, "depth": 12, "num_heads": 3}},
}
SMALL_BASELINES, PHOTO_BASELINES = ("vit_p4",), ("resnet18", "vit_tiny")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="a class-folder dataset (or any layout vitkit reads)")
    p.add_argument("--minutes", type=float, default=5.0, help="training budget of each run (default 5)")
    p.add_argument("--seed", type=int, default=0, help="the validation carve's and the runs' seed (default 0)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of each baseline's run (default: all "
                   "usable) and of each vitkit process (default: vitkit's own choice, as for a user)")
    p.add_argument("--baselines", type=baseline_names, default=None,
                   help=f"comma-separated, of {', '.join(BASELINES)} (default: {','.join(SMALL_BASELINES)} for "
                   f"images of at most {PHOTO_SIDE} px, {','.join(PHOTO_BASELINES)} for larger ones)")
    p.add_argument("--size", type=int, default=None, help="the baselines' training size in px (default: each "
                   "baseline's own: 32 for vit_p4, 128 for resnet18 and vit_tiny)")
    p.add_argument("--weights", default=None, help="also fine-tune these weights (a vitkit checkpoint or run, or "
                   "any source `vitkit finetune` takes) on DATA in the same budget, beside the runs from scratch")
    p.add_argument("--img-size", type=int, default=None, help="with --weights: the fine-tuning resolution "
                   "(default: the weights' own)")
    p.add_argument("--more-seeds", type=seed_list, default=[], help="after the comparison, run vitkit alone with "
                   "each of these seeds too (e.g. 1,2) and report the range over all seeds")
    p.add_argument("--timm-python", default=str(ROOT / ".venv-ref" / "bin" / "python"),
                   help="a Python with timm (default: .venv-ref, which benchmarks/parity.sh makes)")
    p.add_argument("--out", default=None, help="folder for the vitkit run (default: a temporary one)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config value laid over vitkit's choice (vitkit train --set), repeatable")
    p.add_argument("--test", default=None, metavar="DIR", help="also score vitkit's run on these held-out images "
                   "(all of them), after the run")
    p.add_argument("--results", default=str(RESULTS), help="the JSON-lines file the record is appended to "
                   f"(default {RESULTS.relative_to(ROOT)})")
    p.add_argument("--branch", choices=("both", "vitkit", "timm"), default="both",
                   help="both (default: vitkit then the baselines), or one side alone: vitkit (no timm needed), "
                   "timm (one baseline, named by --baselines; prints its record)")
    args = p.parse_args(argv)
    if args.size is not None and args.size < 8:
        p.error(f"--size: expected a size of at least 8 px, got {args.size}")
    if args.branch == "timm" and (not args.baselines or len(args.baselines) != 1):
        p.error("--branch timm runs one baseline: name it with --baselines NAME")
    return args


def seed_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None


def baseline_names(text: str) -> list[str]:
    if text.strip() == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in BASELINES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown baseline {bad[0] if bad else text!r}; choose from "
                                         f"{', '.join(BASELINES)}")
    return list(dict.fromkeys(names))


def threads(args) -> int:
    if args.threads:
        return args.threads
    on_src_path()
    from vitkit.core.hardware import usable_cpus

    return usable_cpus()


def on_src_path() -> None:
    """Import vitkit from this checkout in this process (the runs it starts get PYTHONPATH instead)."""
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))


def default_baselines(data: str) -> list[str]:
    """The baselines for the data's image size: photo ones when its images are larger than PHOTO_SIDE."""
    on_src_path()
    from vitkit.core.errors import DataError
    from vitkit.data.datasets import probe_data

    try:
        facts = probe_data(data)
    except DataError as e:
        sys.exit(f"time_to_accuracy.py: error: {e}")
    return list(PHOTO_BASELINES if max(facts.size) > PHOTO_SIDE else SMALL_BASELINES)


# ============================================================================================ vitkit
def clock_run(data: str, minutes: float, seed: int, out: Path, extra: list[str] = (),
              command: tuple[str, ...] = ("train",)) -> tuple[int, dict | None, list]:
    """`vitkit train --data DATA --max-minutes MINUTES --seed SEED` into ``out``, validated on SEED's carve of
    VAL_FRACTION, with ``extra`` arguments (also used by ablate_small_data.py and processes_threads.py):
    (exit code, the --json summary or None when it failed, the command). ``command``: the subcommand and its
    positional arguments (e.g. ("finetune", WEIGHTS)). The summary keeps the run's first line as "first_line"
    (the recipe it chose, or the speed it measured and the epochs it expected)."""
    cmd = [sys.executable, "-m", "vitkit", *command, "--data", data, "--max-minutes", str(minutes),
           "--seed", str(seed), "--set", f"data.val_fraction={VAL_FRACTION}", "--out", str(out), "--json",
           "--progress-every", "600", *extra]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    lines = p.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if p.returncode == 0 else None
    if summary is not None and len(lines) > 1:
        summary["first_line"] = lines[0]
    return p.returncode, summary, cmd


def run_vitkit(args, weights: str | None = None) -> dict:
    """vitkit's own choice for the data, as its command line makes it (``weights``: fine-tuning them, at
    --img-size if given); the summary and the resolved config."""
    name = "run" if weights is None else "finetune"
    out = Path(args.out or tempfile.mkdtemp(prefix="tta_vitkit_")) / name
    extra = ["--threads", str(args.threads)] if args.threads else []  # threads per process; else vitkit's choice
    extra += [arg for item in getattr(args, "overrides", []) for arg in ("--set", item)]
    command: tuple[str, ...] = ("train",)
    if weights is not None:
        command = ("finetune", weights)
        extra += ["--img-size", str(args.img_size)] if args.img_size else []
    code, summary, cmd = clock_run(args.data, args.minutes, args.seed, out, extra, command)
    if code != 0:
        sys.exit(f"vitkit run failed (exit code {code}): {shlex.join(cmd)}")
    config = json.loads((out / "config.json").read_text())
    held_out = held_out_score(out, args.test) if args.test and weights is None else {}
    return {**held_out, "val_acc": summary["val_acc"], "train_seconds": summary["train_seconds"], "epochs": summary["epochs"],
            "model": config["model"], "processes": config.get("processes"), "threads": config.get("threads"),
            "img_size": config.get("img_size"), "tune": config.get("tune") if weights else None,
            "machine": summary.get("machine"), "data_seconds": summary.get("data_seconds"),
            "data_cache": summary.get("data_cache"), "total_seconds": summary.get("total_seconds"),
            "end_seconds": summary.get("end_seconds"), "end_estimate_seconds": summary.get("end_estimate_seconds"),
            "first_line": summary.get("first_line"), "recipe": config, "command": shlex.join(cmd[1:])}


def held_out_score(run: Path, data: str) -> dict:
    """`vitkit eval RUN --data DATA --split all`: the run's top-1 on those images and the views it scored."""
    cmd = [sys.executable, "-m", "vitkit", "eval", str(run), "--data", data, "--split", "all", "--json", "--quiet"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    if p.returncode != 0:
        sys.exit(f"vitkit eval failed (exit code {p.returncode}): {shlex.join(cmd)}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return {"test_acc": res["top1"], "test_images": res["num_images"],
            "test_views": {k: res[k] for k in ("tta", "tta_shift", "tta_flip")}, "test_data": data}


# ============================================================================================== timm
def run_baseline(args, name: str, n_threads: int) -> dict:
    """One baseline in the --timm-python interpreter (this script, --branch timm): its record."""
    cmd = [args.timm_python, __file__, args.data, "--branch", "timm", "--baselines", name, "--minutes",
           str(args.minutes), "--seed", str(args.seed), "--threads", str(n_threads)]
    cmd += ["--size", str(args.size)] if args.size else []
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"baseline {name} failed (exit code {p.returncode}): {shlex.join(cmd)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def baseline_recipe(name: str, size: int | None) -> dict:
    """BASELINES[name] at ``size`` px (None: its own size), with its name."""
    return dict(BASELINES[name], name=name, size=size or BASELINES[name]["size"])


def baseline_data(args, r: dict):
    """The data's splits (the same carve as vitkit's run), read as recipe ``r`` trains on them, and the
    Preprocess that normalises them and sizes the evaluation; ``r`` gets the short side photos are kept at."""
    from vitkit.data import open_dataset
    from vitkit.data.splits import decode_short_side
    from vitkit.model.config import Preprocess
    from vitkit.train.build import data_preprocess

    size = r["size"]
    if r["crop"] == "pad":  # decoded at the training size (resized + centre cropped), as CIFAR-style recipes
        splits = open_dataset(args.data, channels=3, img_size=size, val_fraction=VAL_FRACTION, seed=args.seed)
        return splits, data_preprocess(splits.train, 3)
    r["short_side"] = decode_short_side((size, size), r["crop_pct"])  # whole images: 128 px -> 146
    splits = open_dataset(args.data, channels=3, short_side=r["short_side"], val_fraction=VAL_FRACTION,
                          seed=args.seed)
    return splits, Preprocess(mean=r["norm"]["mean"], std=r["norm"]["std"], crop_pct=r["crop_pct"],
                              interpolation=r["interpolation"])


def baseline_model(r: dict, num_classes: int):
    """The recipe's timm model, untrained."""
    import timm

    if r["name"] == "vit_p4":
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(img_size=r["size"], num_classes=num_classes, **r["model_args"])
    if r["name"] == "resnet18":
        return timm.create_model("resnet18", pretrained=False, num_classes=num_classes)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=num_classes, img_size=r["size"])


def train_clock(model, opt, aug, train, r: dict, budget: float, g) -> tuple[float, int]:
    """Train until ``budget`` seconds have passed, the learning rate following the clock (warmup, then cosine
    to zero); (the seconds it took, the images seen). Full batches only, in a fresh order each epoch."""
    import torch
    import torch.nn.functional as F

    bs = min(r["batch_size"], len(train))
    seen, start = 0, time.perf_counter()
    model.train()
    while time.perf_counter() - start < budget:
        for idx in torch.randperm(len(train), generator=g).split(bs):
            if (elapsed := time.perf_counter() - start) >= budget or len(idx) < bs:
                break
            frac = elapsed / budget
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
    return time.perf_counter() - start, seen


def accuracy(model, val, size: int, pre) -> float:
    """Top-1 accuracy on ``val``, each image resized and centre cropped as ``pre`` says (timm's eval transform)."""
    import torch

    from vitkit.data import eval_batch

    model.eval()
    correct = 0
    with torch.no_grad():
        for idx in torch.arange(len(val)).split(256):
            images, labels = val.get_batch(idx)
            correct += int((model(eval_batch(images, size, pre)).argmax(-1) == labels).sum())
    return correct / len(val)


def timm_branch(args) -> dict:
    """Train one timm baseline for the budget on the carve; its validation accuracy. Data, carve and
    augmentation come from vitkit (the same reader and split as the vitkit run)."""
    import torch
    from timm.optim import create_optimizer_v2

    from vitkit.data import AugmentConfig, BatchAugment

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    r = baseline_recipe(args.baselines[0], args.size)
    splits, pre = baseline_data(args, r)
    k = len(splits.classes)
    model = baseline_model(r, k)
    opt = create_optimizer_v2(model, "adamw", lr=r["lr"], weight_decay=r["weight_decay"],
                              filter_bias_and_bn=r["no_decay_biases_norms"])
    crop = ({"crop": "pad", "pad": r["pad"]} if r["crop"] == "pad" else
            {"crop": "rrc", "rrc_scale": r["rrc_scale"], "rrc_ratio": r["rrc_ratio"]})
    aug = BatchAugment(AugmentConfig(**crop, hflip=r["hflip"], label_smoothing=r["label_smoothing"]), r["size"], pre, k)
    g = torch.Generator().manual_seed(args.seed)
    seconds, seen = train_clock(model, opt, aug, splits.train, r, args.minutes * 60, g)
    return {"val_acc": round(accuracy(model, splits.val, r["size"], pre), 5), "train_seconds": round(seconds, 2),
            "epochs": round(seen / len(splits.train), 3), "model": r["model"],
            "params": sum(p.numel() for p in model.parameters()), "threads": args.threads, "recipe": r,
            "command": shlex.join(["python", "benchmarks/time_to_accuracy.py", *sys.argv[1:]])}


# ============================================================================================== main
def main(argv=None) -> None:
    args = parse_args(argv)
    if args.branch == "timm":
        print(json.dumps(timm_branch(args)))
        return
    with_timm = args.branch == "both"
    if with_timm and args.baselines != [] and not Path(args.timm_python).is_file():  # before the first run, not after it
        sys.exit(f"--timm-python {args.timm_python}: no such interpreter (make one with benchmarks/parity.sh, "
                 f"or run vitkit alone with --branch vitkit)")
    n = threads(args)
    names = (args.baselines if args.baselines is not None else default_baselines(args.data)) if with_timm else []
    vk = run_vitkit(args)
    print(f"vitkit ({vk['model']}): val accuracy {vk['val_acc'] * 100:.2f}% after {vk['train_seconds']:.0f} s "
          f"({vk['epochs']:.2f} epochs)" + (f"; held-out {vk['test_acc'] * 100:.2f}% ({args.test})"
                                             if "test_acc" in vk else ""), flush=True)
    ft = run_vitkit(args, args.weights) if args.weights else None
    if ft is not None:
        print(f"vitkit finetune {args.weights} ({ft['tune']}, {ft['img_size']} px): val accuracy "
              f"{ft['val_acc'] * 100:.2f}% after {ft['train_seconds']:.0f} s ({ft['epochs']:.2f} epochs)", flush=True)
    base = {}
    for name in names:
        base[name] = tm = run_baseline(args, name, n)
        print(f"{name} ({tm['model']}, {tm['recipe']['size']} px): val accuracy {tm['val_acc'] * 100:.2f}% after "
              f"{tm['train_seconds']:.0f} s ({tm['epochs']:.2f} epochs)", flush=True)
    seeds = seed_range(args, vk)
    lead = ft or vk
    diff = {name: round(lead["val_acc"] - tm["val_acc"], 5) for name, tm in base.items()}
    if ft is not None:
        diff = {"vitkit_scratch": round(ft["val_acc"] - vk["val_acc"], 5), **diff}
    print_table(vk, base, diff, f"{args.minutes:g} min each; baselines: 1 process of {n} thread(s)", ft)
    emulated = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
                if k in os.environ}  # an older CPU kind emulated: its variables, beside the machine the run names
    rec = {"data": args.data, "minutes": args.minutes, "seed": args.seed, "threads": n,
           "machine": vk.get("machine"), **({"emulated": emulated} if emulated else {}),
           "val_fraction": VAL_FRACTION, "vitkit": vk, "baselines": base, "difference": diff,
           **({"finetune": ft, "weights": args.weights} if ft is not None else {}),
           **({"seed_range": seeds} if seeds else {}),
           "command": shlex.join(["python", "benchmarks/time_to_accuracy.py", *(argv or sys.argv[1:])])}
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    with open(results, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    print(f"wrote {results}")


def seed_range(args, vk: dict) -> dict | None:
    """vitkit alone with each of --more-seeds (into --out/seed-S when --out is given): the accuracies by seed,
    the --seed run's first, and their range; None without --more-seeds."""
    if not args.more_seeds:
        return None
    accs = {args.seed: vk["val_acc"]}
    for seed in args.more_seeds:
        again = argparse.Namespace(**{**vars(args), "seed": seed,
                                      "out": str(Path(args.out) / f"seed-{seed}") if args.out else None})
        accs[seed] = run_vitkit(again)["val_acc"]
        print(f"vitkit, seed {seed}: val accuracy {accs[seed] * 100:.2f}%", flush=True)
    low, high = min(accs.values()), max(accs.values())
    print(f"vitkit: {vk['val_acc'] * 100:.2f}% (seed {args.seed}); {low * 100:.2f}-{high * 100:.2f}% over seeds "
          f"{', '.join(map(str, accs))}", flush=True)
    return {"val_acc_by_seed": {str(k): v for k, v in accs.items()}, "min": low, "max": high}


def print_table(vk: dict, base: dict, diff: dict, note: str, ft: dict | None = None) -> None:
    """The runs side by side: accuracy, training seconds, epochs, and vitkit's lead over each (the
    fine-tuning run's, where there is one)."""
    rows = [(f"vitkit finetune, {ft['tune']} ({ft['processes'] or 1} x {ft['threads']} threads)", ft, "")] if ft else []
    rows += [(f"vitkit {vk['model']} ({vk['processes'] or 1} x {vk['threads']} threads)", vk,
              f"{diff['vitkit_scratch'] * 100:+.2f}" if ft else "")]
    rows += [(f"{name}: {tm['model']} at {tm['recipe']['size']} px", tm, f"{diff[name] * 100:+.2f}")
             for name, tm in base.items()]
    width = max(len(r[0]) for r in rows)
    print(f"\n{'run':<{width}}  val acc  train s  epochs  {'fine-tuned' if ft else 'vitkit'} - it (points)")
    for label, res, d in rows:
        print(f"{label:<{width}}  {res['val_acc'] * 100:6.2f}%  {res['train_seconds']:7.0f}  {res['epochs']:6.2f}  {d}")
    print(note)


if __name__ == "__main__":
    main()
