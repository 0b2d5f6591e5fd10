"""Attention in a training step on the CPU: F.scaled_dot_product_attention against the written-out softmax
attention (``vitkit.model.layers.attention.softmax_attention``), forward + backward, float32 and bf16.

    python benchmarks/attention_backward.py          # PYTHONPATH=src, from the repository root

The results go to results/attention_backward_<cpu>.json, <cpu> being "amx" or "avx512bf16" (the bf16
instructions that this CPU has) or "none" (neither): the rule must hold on each kind.

For q, k, v of (batch, heads, tokens, 64) at the shapes of vitkit's training runs (the small-data table's
6-block ViT at 32 px with patch 4: 65 tokens, 3 heads, batch 128 on 2 threads or 64 on each of 2
processes; ViT-Ti/S/B/16 at 224 px: 197 tokens, batch 16), on 1 and 2 threads: the median milliseconds of
7 rounds for each, and fused / written-out (> 1: the written-out one is faster). The rule
``vitkit.model.layers.attention.math_attention_pays`` comes from these tables (bf16 only: in float32 the gain
at 65 tokens did not repay the T x T matrix the written-out backward keeps, about 90 MiB more peak RSS in
the training step of benchmarks/model_vs_timm.py).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vitkit.core.hardware import cpu_bf16_kind
from vitkit.model.layers.attention import softmax_attention

SHAPES = [(64, 3, 65, 64), (128, 3, 65, 64), (16, 3, 197, 64), (16, 6, 197, 64), (16, 12, 197, 64)]


def median_ms(fn, rounds: int = 7, iters: int = 4) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times) * 1e3


def main() -> None:
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for shape in SHAPES:
            for dtype in (torch.float32, torch.bfloat16):
                g = torch.Generator().manual_seed(0)
                q, k, v = (torch.randn(*shape, generator=g).to(dtype).requires_grad_() for _ in range(3))
                grad = torch.randn(*shape, generator=g).to(dtype)
                scale = shape[-1] ** -0.5

                def fused():
                    F.scaled_dot_product_attention(q, k, v).backward(grad)

                def written():
                    softmax_attention(q, k, v, scale)[0].backward(grad)

                ms = {"fused": median_ms(fused), "written-out": median_ms(written)}
                row = dict(threads=threads, shape=list(shape), dtype=str(dtype).removeprefix("torch."),
                           ms={n: round(t, 2) for n, t in ms.items()},
                           fused_over_written=round(ms["fused"] / ms["written-out"], 2))
                rows.append(row)
                print(json.dumps(row), flush=True)
    cpu = cpu_bf16_kind()
    out = Path(f"benchmarks/results/attention_backward_{cpu}.json")
    out.write_text(json.dumps(dict(torch=torch.__version__, cpu=cpu, command=" ".join(["benchmarks/attention_backward.py"] + sys.argv[1:]),
                                   rows=rows), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
