"""bf16 inference on a packed bf16 copy (``vitkit.packed.Bf16Inference``) against bf16 autocast, same model.

    PYTHONPATH=src python benchmarks/packed_bf16.py                      # ViT-Ti/S/B/16 at batch 1 and 16
    PYTHONPATH=src python benchmarks/packed_bf16.py --cases vit_small_patch16_224:16 --repeats 9
    PYTHONPATH=src python benchmarks/packed_bf16.py --cases vit_small_patch16_224:16 --repeats 9 --compile \
        --out benchmarks/results/packed_bf16_compile_amx.json

For each case the two ways (and fp32 eager, for reference) are timed in alternation, the order rotating,
in this process, with the allocator set as every command sets it (``keep_freed_memory``); each ratio is
the median [range] over the rounds of autocast's time / the way's time. With ``--compile``, also
torch.compile (inductor, its weights frozen as constants: ``torch._inductor.config.freezing``) under bf16
autocast, with its compile time (left out of the timing) and its speed over the packed copy. Also the largest logit difference
of each bf16 way from fp32 eager, and the time to build the packed copy. The rule
``vitkit.fastpath.packed_pays`` takes its figures (``PACKED_MEASURED``, one table per kind of CPU) from the
batch-16 rows of results/packed_bf16_<cpu>.json, <cpu> being "amx" or "avx512bf16" (the CPU's bf16
instructions, ``vitkit.runtime.cpu_bf16_kind``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from model_vs_timm import race, ratio, step_fn, vitkit_model
from vitkit.packed import Bf16Inference
from vitkit.runtime import cpu_bf16_kind, detect_hardware, keep_freed_memory

DEFAULT_CASES = ("vit_tiny_patch16_224:1,vit_tiny_patch16_224:16,vit_small_patch16_224:1,"
                 "vit_small_patch16_224:16,vit_base_patch16_224:1,vit_base_patch16_224:16")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated model:batch")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile with frozen weights, in bf16")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/packed_bf16_<cpu>.json")
    args = ap.parse_args()
    args.out = args.out or f"benchmarks/results/packed_bf16_{cpu_bf16_kind()}.json"
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    hw = detect_hardware(cpu)
    rows = []
    for case in args.cases.split(","):
        name, batch = case.split(":")
        batch = int(batch)
        model = vitkit_model(name).eval()
        x = torch.randn(batch, model.cfg.in_chans, *model.cfg.img_size, generator=torch.Generator().manual_seed(1))
        t0 = time.perf_counter()
        packed = Bf16Inference(model)
        build_s = time.perf_counter() - t0
        ways = {"bf16 autocast": step_fn(model, "infer", x, "bf16"), "bf16 packed": step_fn(packed, "infer", x),
                "fp32 eager": step_fn(model, "infer", x)}
        compile_s = None
        if args.compile:
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True  # weights as constants: folded, and packed for oneDNN at compile time
            ways["bf16 compiled"] = step_fn(torch.compile(model), "infer", x, "bf16")
            t0 = time.perf_counter()
            ways["bf16 compiled"]()
            compile_s = round(time.perf_counter() - t0, 1)
        ref = ways["fp32 eager"]().float()
        diff = {n: (ways[n]().float() - ref).abs().max().item() for n in ways if n.startswith("bf16")}
        times = race(ways, args.repeats, args.iters, cpu)
        row = dict(case=case, model=name, batch=batch, img_s={n: batch / statistics.median(t) for n, t in times.items()},
                   **{f"{n} / bf16 autocast": ratio(times, n, "bf16 autocast") for n in ways if n != "bf16 autocast"},
                   max_abs_logit_diff_from_fp32=diff, packed_build_s=round(build_s, 3))
        if compile_s is not None:
            row.update({"bf16 compiled / bf16 packed": ratio(times, "bf16 compiled", "bf16 packed"),
                        "compile_s": compile_s})
        rows.append(row)
        print(json.dumps(row), flush=True)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(dict(torch=torch.__version__, threads=args.threads, hardware=str(hw),
                                       command=" ".join(["benchmarks/packed_bf16.py"] + sys.argv[1:]),
                                       repeats=args.repeats, iters=args.iters, rows=rows), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
