"""bf16 inference on a packed bf16 copy (``vitkit.infer.packed.Bf16Inference``) against bf16 autocast, same model;
and the packed copy with its residual stream in bf16 (``stream='bfloat16'``) against it in float32.

    PYTHONPATH=src python benchmarks/packed_bf16.py                      # ViT-Ti/S/B/16 at batch 1 and 16
    PYTHONPATH=src python benchmarks/packed_bf16.py --cases vit_small_patch16_224:16 --repeats 9
    PYTHONPATH=src python benchmarks/packed_bf16.py --cases vit_small_patch16_224:16 --repeats 9 --compile \
        --out benchmarks/results/packed_bf16_compile_amx.json

For each case the three ways (and fp32 eager, for reference) are timed in alternation, the order rotating,
in this process, with the allocator set as every command sets it (``keep_freed_memory``); each ratio is
the median [range] over the rounds of autocast's time / the way's time (and of the float32 stream's time /
the bf16 stream's). With ``--compile``, also
torch.compile (inductor, its weights frozen as constants: ``torch._inductor.config.freezing``) under bf16
autocast, with its compile time (left out of the timing) and its speed over the packed copy. Also the largest logit difference
of each bf16 way from fp32 eager, and the time to build the packed copy. The rule
``vitkit.infer.fastpath.packed_pays`` takes its figures (``PACKED_MEASURED``, one table per kind of CPU) from the
batch-16 rows of results/packed_bf16_<cpu>.json, <cpu> being "amx" or "avx512bf16" (the CPU's bf16
instructions, ``vitkit.infer.paths.cpu_bf16_kind``), and so does ``STREAM_MEASURED`` (the bf16 stream over the
float32 stream).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from model_vs_timm import cpu_cases, race, ratio, step_fn, write_rows

from vitkit.core.hardware import cpu_bf16_kind
from vitkit.infer.packed import Bf16Inference

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
    cpu = torch.device("cpu")
    rows = []
    for case, name, batch, model, x in cpu_cases(args):
        t0 = time.perf_counter()
        packed = Bf16Inference(model)
        build_s = time.perf_counter() - t0
        ways = {"bf16 autocast": step_fn(model, "infer", x, "bf16"), "bf16 packed": step_fn(packed, "infer", x),
                "bf16 stream": step_fn(Bf16Inference(model, "bfloat16"), "infer", x),
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
                   **{"bf16 stream / bf16 packed": ratio(times, "bf16 stream", "bf16 packed")},
                   max_abs_logit_diff_from_fp32=diff, packed_build_s=round(build_s, 3))
        if compile_s is not None:
            row.update({"bf16 compiled / bf16 packed": ratio(times, "bf16 compiled", "bf16 packed"),
                        "compile_s": compile_s})
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_rows(args, "benchmarks/packed_bf16.py", rows, repeats=args.repeats, iters=args.iters)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
