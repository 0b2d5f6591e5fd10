"""The small-data recipe part by part: each variant is one change against the base recipe (what
`vitkit train --data DATA --max-minutes M` picks by itself for CIFAR-size data), run for the same
budget on the same validation carve (10% of the training images, stratified, seeded with --seed).

    python benchmarks/ablate_small_data.py DATA [--minutes 5] [--variants base,no-whiten,...]
                                           [--per-class N] [--seed 0] [--threads N] [--on KEY=VALUE ...]

Runs the variants one after the other and appends one row per variant (its name, what it changes,
validation accuracy, epochs reached, training seconds, the command) to
benchmarks/results/ablate_small_data.jsonl, then prints them as a table. `--per-class N` trains on
the first N images of each class folder (hard links in a temporary folder), for a quick check.
`--on KEY=VALUE` (repeatable) lays the same `--set`
override under every variant, so that a change is screened against a base that already has an earlier
winner (each row records it). Seed 2's carve is kept for reporting: there the script runs only
`--variants base` (and `fp32`: the recipe as a CPU without AMX trains it). `--list` prints the variants. Compare rows of one run only, on an otherwise idle machine: the budget
is wall-clock time, so a busy machine gives every variant less of it, and not equally.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from time_to_accuracy import clock_run  # one way to run vitkit on a carve (benchmarks/ is on sys.path)

from vitkit.core.hardware import cpu_bf16_kind, cpu_capability

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "ablate_small_data.jsonl"
# the carve no ablation looks at: choices are screened on seeds 0 and 1, and seed 2 only reports the recipe
# they made (with `--variants base`), so that one figure is not tuned on the images it is measured on
REPORTING_SEED = 2
REPORTING_VARIANTS = {"base", "fp32"}  # the recipe as it is here, and as it trains on a CPU without AMX

# the short budget's model (recipe.SHORT_RUN: one 3x3 conv at each of the tokenizer's resolutions, no EMA), and it at
# 3x the learning rate (recipe.SHORT_LR3): the bases of the low-work variants below
SHORT = ["model_args.stem_convs=1", "model_args.stem_early_convs=1", "ema=null"]
SHORT_LR3 = SHORT + ["optim.lr=0.006"]
# name -> (what it changes, the `--set` overrides that make it); one change each against the base recipe
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "base": ("the recipe as vitkit picks it", []),
    "no-whiten": ("a learned 3x3 stride-2 first conv instead of the frozen whitening filters",
                  ["model_args.stem_whiten=false"]),
    "slow-bn": ("BatchNorm running statistics at torch's momentum 0.1 (not 0.4)", ["model_args.stem_bn_momentum=0.1"]),
    "random-flip": ("random flips (p = 0.5) instead of alternating ones", ["augment.flip_mode=random"]),
    "no-tta": ("no test-time flip averaging", ["tta=false"]),
    "no-ema": ("no EMA of the weights", ["ema=null"]),
    "smoothing-0.1": ("label smoothing 0.1 (not 0.2)", ["augment.label_smoothing=0.1"]),
    "pad-4": ("4-px translations (not 2)", ["augment.pad=4"]),
    "erase": ("random erasing: one box of 2-33% of the image replaced by noise, in a quarter of the images",
              ["augment.erase_prob=0.25"]),
    "smoothing-0.3": ("label smoothing 0.3 (not 0.2)", ["augment.label_smoothing=0.3"]),
    "cosine": ("cosine decay (not linear to zero)", ["schedule.decay=cosine"]),
    "lion": ("Lion (lr 3e-4, weight decay 0.5, betas 0.9/0.99) instead of AdamW",
             ["optim.name=lion", "optim.lr=0.0003", "optim.weight_decay=0.5", "optim.betas=[0.9,0.99]"]),
    "muon": ("Muon for the blocks' weight matrices, AdamW for the rest (the same lr and weight decay)",
             ["optim.name=muon"]),
    "muon-convs": ("Muon also for the conv stem's filters, each flattened to a matrix (airbench's Muon), not AdamW",
                   ["optim.name=muon", "optim.muon_convs=true"]),
    "adamw": ("AdamW for every weight (not Muon for the blocks' matrices)", ["optim.name=adamw"]),
    "layer-scale": ("LayerScale 0.1 on the residual branches", ["model_args.layer_scale=0.1"]),
    "depth-2": ("2 encoder blocks", ["model_args.depth=2"]),
    "depth-4": ("4 encoder blocks", ["model_args.depth=4"]),
    "width-96": ("width 96 (3 heads)", ["model_args.embed_dim=96", "model_args.num_heads=3"]),
    "short-model": ("the short budget's model: 2 encoder blocks of width 96 (3 heads)",
                    ["model_args.depth=2", "model_args.embed_dim=96", "model_args.num_heads=3"]),
    "bf16": ("bf16 autocast (not fp32)", ["precision=bf16"]),
    "fp32": ("fp32 (on a CPU with AMX the recipe trains in bf16)", ["precision=fp32"]),
    "stem-64": ("a wider conv tokenizer: 128 channels at the grid (not 64), in its stride-2 conv and the 3x3 conv",
                ["model_args.stem_width=64"]),
    "stem-64-2": ("the wider tokenizer (128 channels at the grid) with two 3x3 convs at the grid (not one)",
                  ["model_args.stem_width=64", "model_args.stem_convs=2"]),
    "dirac": ("the stem's 3x3 convs start as identities on their first in-channels filters (not He normal)",
              ["model_args.stem_dirac=true"]),
    "early-conv": ("a 3x3 conv of 64 channels at 16x16, after the whitening filters and before the stride-2 conv",
                   ["model_args.stem_early_convs=1"]),  # the recipe's since, so a no-op against it now
    "no-early-conv": ("no 3x3 conv at 16x16: the whitening filters straight into the stride-2 conv",
                      ["model_args.stem_early_convs=0"]),
    "early-conv-2": ("two 3x3 convs of 64 channels at 16x16 (not one)", ["model_args.stem_early_convs=2"]),
    "batch-256": ("batch 256 (not 128), the learning rate doubled with it", ["batch_size=256", "optim.lr=0.004"]),
    "batch-64": ("batch 64 (not 128), the learning rate halved with it", ["batch_size=64", "optim.lr=0.001"]),
    "stem-96": ("a wider tokenizer: 96 channels at 16x16 and 192 at the grid (not 64 and 128)",
                ["model_args.stem_width=96"]),
    "grid-conv-2": ("two 3x3 convs at the grid (not one)", ["model_args.stem_convs=2"]),
    "short": ("the short budget's model: one 3x3 conv at each of the tokenizer's resolutions, no EMA (recipe.SHORT_RUN)",
              SHORT),
    "short-batch-64": ("the short budget's model at batch 64 (not 128), the same learning rate: twice the steps",
                       SHORT + ["batch_size=64"]),
    "short-batch-64-half-lr": ("the short budget's model at batch 64, the learning rate halved with it",
                               SHORT + ["batch_size=64", "optim.lr=0.001"]),
    "short-stem-32": ("the short budget's model with a narrower tokenizer: 32 channels at 16x16, 64 at the grid",
                      SHORT + ["model_args.stem_width=32"]),
    "short-lr-2x": ("the short budget's model at twice the learning rate (0.004, not 0.002)",
                    SHORT + ["optim.lr=0.004"]),
    "short-lr-3x": ("the short budget's model at three times the learning rate (0.006, not 0.002)",
                    SHORT_LR3),
    "short-lr-4x": ("the short budget's model at four times the learning rate (0.008, not 0.002)",
                    SHORT + ["optim.lr=0.008"]),
    "short-lr-5x": ("the short budget's model at five times the learning rate (0.01, not 0.002)",
                    SHORT + ["optim.lr=0.01"]),
    "short-lr-2x-batch-64": ("the short budget's model at batch 64 and twice the learning rate (0.004)",
                             SHORT + ["batch_size=64", "optim.lr=0.004"]),
    "short-lr-3x-batch-64": ("the short budget's model at batch 64 and three times the learning rate (0.006)",
                             SHORT + ["batch_size=64", "optim.lr=0.006"]),
    "short-lr-4x-batch-64": ("the short budget's model at batch 64 and four times the learning rate (0.008)",
                             SHORT + ["batch_size=64", "optim.lr=0.008"]),
    "short-lr-3x-batch-256": ("the short budget's model at batch 256 (half the steps, 128 a process) and three times "
                              "the learning rate (0.006)", SHORT + ["batch_size=256", "optim.lr=0.006"]),
    "short-lr-6x-batch-256": ("the short budget's model at batch 256 (half the steps, 128 a process) and six times "
                              "the learning rate (0.012)", SHORT + ["batch_size=256", "optim.lr=0.012"]),
    "short-lr-3x-no-crop": ("the short budget's model at 3x the learning rate, no translations (flips alone)",
                            SHORT_LR3 + ["augment.crop=none"]),
    "short-lr-3x-warmup-10": ("the short budget's model at 3x the learning rate, warmup over 10% of the steps (not 3%)",
                              SHORT_LR3 + ["schedule.warmup_fraction=0.1"]),
    "short-lr-3x-24px": ("the short budget's model at 3x the learning rate, trained and scored at 24 px (a 6x6 grid, not 8x8)",
                         SHORT_LR3 + ["img_size=24"]),
    "short-lr-3x-no-smoothing": ("the short budget's model at 3x the learning rate, no label smoothing (not 0.2)",
                                 SHORT_LR3 + ["augment.label_smoothing=0.0"]),
    "short-lr-3x-muon-momentum-0.9": ("the short budget's model at 3x the learning rate, Muon's momentum 0.9 (not 0.95)",
                                      SHORT_LR3 + ["optim.muon_momentum=0.9"]),
    "short-lr-3x-no-early-conv": ("the short budget's model at 3x the learning rate, no 3x3 conv at 16x16",
                                  ["model_args.stem_convs=1", "model_args.stem_early_convs=0", "ema=null",
                                   "optim.lr=0.006"]),
    "short-lr-3x-stem-96": ("the short budget's model at 3x the learning rate, a wider tokenizer: 96 channels at 16x16 and "
                            "192 at the grid (not 64 and 128)", SHORT_LR3 + ["model_args.stem_width=96"]),
    "short-lr-3x-grid-2": ("the short budget's model at 3x the learning rate with the long model's second 3x3 conv at the "
                           "8x8 grid (one at 16x16, no EMA)",
                           ["model_args.stem_convs=2", "model_args.stem_early_convs=1", "ema=null", "optim.lr=0.006"]),
    "short-lr-3x-early-2": ("the short budget's model at 3x the learning rate with the long model's second 3x3 conv at "
                            "16x16 (one at the grid, no EMA)",
                            ["model_args.stem_convs=1", "model_args.stem_early_convs=2", "ema=null", "optim.lr=0.006"]),
    "short-lr-3x-ema": ("the short budget's model at 3x the learning rate, with the long budget's EMA of the weights (0.999)",
                        ["model_args.stem_convs=1", "model_args.stem_early_convs=1", "optim.lr=0.006"]),
    "short-lr-3x-dirac": ("the short budget's model at 3x the learning rate, its tokenizer's 3x3 convs starting as "
                          "identities on their first in-channels filters", SHORT_LR3 + ["model_args.stem_dirac=true"]),
    "long-lr-3x": ("the long budget's model (the recipe's: two 3x3 convs at each of the tokenizer's resolutions, EMA "
                   "0.999) at three times the learning rate (0.006, not 0.002)", ["optim.lr=0.006"]),
    "long-lr-4x": ("the long budget's model (the recipe's: two 3x3 convs at each of the tokenizer's resolutions, EMA "
                   "0.999) at four times the learning rate (0.008, not 0.002)", ["optim.lr=0.008"]),
    "short-smoothing-0.1": ("the short budget's model with label smoothing 0.1 (not 0.2)",
                            SHORT + ["augment.label_smoothing=0.1"]),
    # photos (the 'photos' recipe, e.g. catsdogs): the training resolution and the encoder's depth (PHOTO_CANDIDATES)
    "photos-64px-2-blocks": ("photos at 64 px with 2 encoder blocks", ["img_size=64", "model_args.depth=2"]),
    "photos-96px-4-blocks": ("photos at 96 px with 4 encoder blocks", ["img_size=96", "model_args.depth=4"]),
    "photos-128px-4-blocks": ("photos at 128 px with 4 encoder blocks", ["img_size=128", "model_args.depth=4"]),
    "photos-64px-2-blocks-lr-2x": ("photos at 64 px with 2 encoder blocks, twice the learning rate (0.004, not 0.002)",
                                   ["img_size=64", "model_args.depth=2", "optim.lr=0.004"]),
    "photos-64px-2-blocks-lr-3x": ("photos at 64 px with 2 encoder blocks, three times the learning rate (0.006)",
                                   ["img_size=64", "model_args.depth=2", "optim.lr=0.006"]),
    "photos-96px-6-blocks": ("photos at 96 px with 6 encoder blocks", ["img_size=96", "model_args.depth=6"]),
    "grid-4": ("a 4x4 grid: a third stride-2 conv, to 256 channels, and the grid's convs there (patch 8, not 4)",
               ["model_args.patch_size=8"]),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="?", help="a class-folder dataset (e.g. CIFAR-10's train/)")
    p.add_argument("--minutes", type=float, default=5.0, help="training budget of each variant (default 5)")
    p.add_argument("--epochs", type=int, default=None, help="train each variant for this many epochs instead "
                   "of --minutes (the schedule spans them; 2 processes, as a clock-bounded run trains on 2+ cores): "
                   "accuracy for an amount of work, whatever the machine's speed or load")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of variants (default: all)")
    p.add_argument("--per-class", type=int, default=None, metavar="N", help="train on N images of each class only")
    p.add_argument("--seed", type=int, default=0, help="the carve's and the runs' seed (default 0)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of each run (default: vitkit's choice)")
    p.add_argument("--on", action="append", default=[], metavar="KEY=VALUE",
                   help="a --set override under every variant (repeatable), e.g. --on optim.name=muon")
    p.add_argument("--keep", metavar="DIR", default=None, help="keep each variant's run directory under DIR "
                   "(default: a temporary folder, removed at the end)")
    p.add_argument("--list", action="store_true", help="print the variants and exit")
    args = p.parse_args(argv)
    if args.list:
        return args
    if args.data is None:
        p.error("DATA is required")
    if args.seed == REPORTING_SEED and (not set(args.variants.split(",")) <= REPORTING_VARIANTS or args.on):
        p.error(f"seed {REPORTING_SEED}'s carve is kept for reporting the recipe as it is (--variants base, or fp32 "
                f"for a CPU without AMX; no --on): screen changes on seeds 0 and 1")
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; --list shows them")
    for name in args.variants.split(","):  # an --on that a variant sets itself would be overridden, silently
        own = {o.split("=", 1)[0]: o for o in VARIANTS[name][1]}
        clash = [o for o in args.on if o.split("=", 1)[0] in own]
        if clash:
            p.error(f"--on {clash[0]}: variant {name} sets {own[clash[0].split('=', 1)[0]]} itself, which would win; "
                    "screen it on a variant that leaves the key alone (e.g. --variants base with the rest as --on)")
    return args


def subset(data: str, per_class: int, where: Path) -> str:
    """The first ``per_class`` images of each class folder of ``data``, as hard links (or copies) under ``where``."""
    for cls in sorted(d for d in Path(data).iterdir() if d.is_dir()):
        (where / cls.name).mkdir(parents=True)
        for f in sorted(cls.iterdir())[:per_class]:
            try:
                os.link(f, where / cls.name / f.name)
            except OSError:
                shutil.copyfile(f, where / cls.name / f.name)
    return str(where)


def run_variant(name: str, data: str, args, work: Path) -> dict:
    """One variant's run: `vitkit train` with its overrides; its row."""
    what, overrides = VARIANTS[name]
    extra = ["--threads", str(args.threads)] if args.threads else []
    for o in [*args.on, *overrides]:
        extra += ["--set", o]
    t = time.perf_counter()
    budget = f"{args.epochs}ep" if args.epochs else f"{args.minutes:g}min"
    run_dir = work / f"{name}-seed{args.seed}-{budget}"
    if args.epochs:
        extra = ["--epochs", str(args.epochs), "--nproc", "2", *extra]
    code, s, cmd = clock_run(data, 0 if args.epochs else args.minutes, args.seed, run_dir, extra)
    if code != 0:
        return {"variant": name, "changes": what, "error": f"exit code {code}", "command": shlex.join(cmd[1:])}
    precision = json.loads((run_dir / "config.json").read_text()).get("precision")
    return {"variant": name, "changes": what, "overrides": overrides, "on": args.on, "val_acc": s["val_acc"], "epochs": s["epochs"],
            "steps": s["step"], "train_seconds": s["train_seconds"], "wall_s": round(time.perf_counter() - t, 1),
            "minutes": 0 if args.epochs else args.minutes, "fixed_epochs": args.epochs, "seed": args.seed, "per_class": args.per_class, "data": args.data,
            "precision": precision, "cpu_bf16": cpu_bf16_kind(),
            "cpu_isa": cpu_capability(), "command": shlex.join(cmd[1:])}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.list:
        for name, (what, overrides) in VARIANTS.items():
            print(f"{name:<14} {what}  [{' '.join(overrides) or '-'}]")
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ablate_small_data_") as tmp:
        work = Path(tmp)
        data = subset(args.data, args.per_class, work / "data") if args.per_class else args.data
        for name in args.variants.split(","):
            row = run_variant(name, data, args, Path(args.keep) if args.keep else work / "runs")
            rows.append(row)
            with open(RESULTS, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    print(f"\n{'variant':<14} {'val acc':>8} {'epochs':>7} {'train s':>8}  changes")
    for r in rows:
        acc = f"{r['val_acc'] * 100:.2f}%" if "val_acc" in r else r["error"]
        print(f"{r['variant']:<14} {acc:>8} {r.get('epochs', 0):>7.2f} {r.get('train_seconds', 0):>8.1f}  {r['changes']}")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
