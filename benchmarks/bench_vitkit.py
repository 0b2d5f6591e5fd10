"""Side-by-side speed of vitkit models on this machine, as ratios within one run.

    python benchmarks/bench_vitkit.py                       # small models, CPU, a few minutes
    python benchmarks/bench_vitkit.py --models vit_base_patch16_224 --batch-sizes 1,8 --threads 2

For each model, in the same process and with the same inputs (vitkit.tools.bench.bench):
  1. inference, fused attention (F.scaled_dot_product_attention) vs the manual softmax(QK^T)V path;
  2. inference in fp32 vs bf16 (autocast) vs int8 (dynamic quantization of Linear layers), as --dtypes says;
  3. a training step (forward + backward + AdamW) in fp32 (and bf16 when listed).
Ratios are images/s of the variant over images/s of the baseline (fused fp32). The variants run in
alternation for --rounds rounds and every figure is the median over the rounds.
It also prints FLOPs per image (counted, attention included) next to the analytic formula and, for
the 224 px models, the GMACs of the design guide's reference table.

Writes benchmarks/results/bench_vitkit.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

import vitkit
from vitkit.tools.bench import bench, vit_flops

# GMACs at 224 px, 1000 classes, from the design guide's table of reference sizes
REFERENCE_GMACS = {"vit_tiny_patch16_224": 1.26, "vit_small_patch16_224": 4.61, "vit_base_patch16_224": 17.58,
                   "vit_large_patch16_224": 61.6, "vit_huge_patch14_224": 167.4}


def _merge(results: list[dict]) -> dict:
    """One bench result from several rounds: images/s and latencies are medians over the rounds."""
    import statistics

    out = dict(results[0])
    rows = []
    for i, row in enumerate(results[0]["rows"]):
        if "skipped" in row:
            rows.append(row)
            continue
        same = [r["rows"][i] for r in results]
        merged = dict(row)
        for key in ("images_per_s", "p50_ms", "p95_ms", "tflops"):
            merged[key] = statistics.median(r[key] for r in same)
        merged["images_per_s_rounds"] = [r["images_per_s"] for r in same]
        rows.append(merged)
    out["rows"] = rows
    out["peak_flops"] = {k: v for r in results for k, v in r["peak_flops"].items()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="vit_mini_patch4_28,vit_tiny_patch4_32,vit_tiny_patch16_224")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--dtypes", default=None,
                    help="inference dtypes (default: fp32,int8 on CPU, where bf16 is emulated on many CPUs and "
                         "very slow; fp32,bf16 on CUDA); the training step compares fp32 with bf16 only if listed")
    ap.add_argument("--repeats", type=int, default=10, help="timed steps per configuration and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; figures are medians over rounds")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-train", action="store_true", help="skip the training-step comparison")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "bench_vitkit.json"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.dtypes:
        dtypes_infer = tuple(args.dtypes.split(","))
    else:
        dtypes_infer = ("fp32", "int8") if args.device == "cpu" else ("fp32", "bf16")
    dtypes_train = tuple(d for d in dtypes_infer if d in ("fp32", "bf16"))
    report = dict(host=platform.node(), machine=platform.machine(), python=sys.version.split()[0],
                  torch=torch.__version__, device=args.device, threads=torch.get_num_threads(),
                  started=time.strftime("%Y-%m-%d %H:%M:%S"), models={})
    lines = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        fused = vitkit.create_model(name, seed=0)
        manual = vitkit.create_model(name, seed=0, attn_impl="manual")
        common = dict(batch_sizes=batch_sizes, repeats=args.repeats, warmup=args.warmup, device=args.device)
        # The variants run in alternation, `rounds` times, and each figure is the median over rounds:
        # a change in machine load then hits every variant alike instead of one of them.
        rounds = {"infer": [], "manual": [], "train": []}
        for k in range(args.rounds):
            rounds["infer"].append(bench(fused, dtypes=dtypes_infer, modes=("infer",), peak=k == 0, **common))
            rounds["manual"].append(bench(manual, dtypes=("fp32",), modes=("infer",), peak=False, **common))
            if not args.no_train:
                rounds["train"].append(bench(fused, dtypes=dtypes_train, modes=("train",), peak=k == 0, **common))
        r_infer = _merge(rounds["infer"])
        r_manual = _merge(rounds["manual"])
        r_train = _merge(rounds["train"]) if rounds["train"] else None
        entry = dict(params=r_infer["params"], img_size=r_infer["img_size"],
                     flops_counted=r_infer["flops_per_image"], flops_analytic=vit_flops(fused.cfg),
                     reference_gmacs=REFERENCE_GMACS.get(name), peak_flops=r_infer["peak_flops"],
                     infer=r_infer["rows"], infer_manual=r_manual["rows"],
                     train=r_train["rows"] if r_train else None, seconds=time.perf_counter() - t0)
        report["models"][name] = entry
        ref = f", reference {entry['reference_gmacs']} GMACs" if entry["reference_gmacs"] else ""
        lines.append(f"\n{name}: {entry['params'] / 1e6:.2f}M params, {entry['flops_counted'] / 1e9:.4f} GFLOPs/image "
                     f"counted, {entry['flops_analytic'] / 1e9:.4f} analytic ({entry['flops_counted'] / 2e9:.4f} GMACs{ref})")
        lines.append(f"  {'batch':>5}  {'fused fp32 img/s':>16}  {'manual/fused':>12}  {'bf16/fp32':>9}  "
                     f"{'int8/fp32':>9}  {'train fp32 img/s':>16}  {'train bf16/fp32':>15}")
        for b in batch_sizes:
            def ips(rows, dtype):
                r = next((r for r in rows if r["batch"] == b and r["dtype"] == dtype and "skipped" not in r), None)
                return r["images_per_s"] if r else None

            base = ips(r_infer["rows"], "fp32")
            man = ips(r_manual["rows"], "fp32")
            bf = ips(r_infer["rows"], "bf16")
            i8 = ips(r_infer["rows"], "int8")
            tr = ips(r_train["rows"], "fp32") if r_train else None
            trb = ips(r_train["rows"], "bf16") if r_train else None

            def ratio(a, c):
                return f"{a / c:.2f}x" if a and c else "n/a"

            lines.append(f"  {b:>5}  {base:>16.1f}  {ratio(man, base):>12}  {ratio(bf, base):>9}  {ratio(i8, base):>9}  "
                         f"{(f'{tr:.1f}' if tr else 'n/a'):>16}  {ratio(trb, tr):>15}")
        print("\n".join(lines[-(len(batch_sizes) + 2):]), flush=True)
    peaks = next(iter(report["models"].values()))["peak_flops"] if report["models"] else {}
    print("\nmatmul peak measured: " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peaks.items())
          + f"; {report['threads']} threads, torch {torch.__version__}, device {args.device}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
