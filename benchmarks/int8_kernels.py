"""int8 inference on oneDNN's kernels against fbgemm's (``vitkit.infer.quantize``, kernel='onednn' / 'fbgemm'), same model.

    PYTHONPATH=src python benchmarks/int8_kernels.py      # the demo model, ViT-Ti/S/B/16 at batch 1 and 16
    PYTHONPATH=src python benchmarks/int8_kernels.py --cases vit_small_patch16_224:16 --repeats 15

For each case the two kernels (the same int8 weights; oneDNN with 8-bit activations and the MLP's GELU
inside fc1's kernel, fbgemm with 7-bit activations and GELU a pass of its own) and fp32 eager are timed in
alternation, one forward each, the order rotating, in this process, with the allocator set as every command
sets it (``keep_freed_memory``). Each ratio is the median [range] over the rounds of the other way's time
/ the way's time, taken round by round, so that a machine whose speed drifts hits both alike. Also the
largest logit difference of each from fp32 eager and their top-1 agreement with it on 500 demo digits
(random weights with a head that separates classes: a harsher test than a trained model's, whose logits
are rarely near ties). The rule ``vitkit.infer.fastpath.int8_kernel`` takes its figures
(``INT8_ONEDNN_MEASURED``) from the batch-16 rows of results/int8_kernels_<cpu>.json, <cpu> being the
CPU's kind (``vitkit.infer.paths.cpu_bf16_kind``).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from model_vs_timm import cpu_cases, race, ratio, step_fn, write_rows

from vitkit.core.hardware import cpu_bf16_kind
from vitkit.data import eval_batch, open_dataset
from vitkit.infer.quantize import quantize_int8

DEFAULT_CASES = ("vit_hybrid_mini_patch4_28:1,vit_hybrid_mini_patch4_28:16,vit_tiny_patch16_224:1,vit_tiny_patch16_224:16,vit_small_patch16_224:1,"
                 "vit_small_patch16_224:16,vit_base_patch16_224:1,vit_base_patch16_224:16")


def agreement(model, ways: dict, n: int = 500) -> dict:
    """Top-1 agreement of each int8 model with ``model`` (fp32) on the first ``n`` demo test digits."""
    c = model.cfg
    test = open_dataset(None, channels=c.in_chans, img_size=c.img_size).test
    imgs, _ = test.get_batch(torch.arange(min(n, len(test))))
    x = eval_batch(imgs, c.img_size, model.preprocess)
    with torch.inference_mode():
        ref = torch.cat([model(x[i:i + 50]) for i in range(0, len(x), 50)]).argmax(-1)
        return {k: (torch.cat([q(x[i:i + 50]) for i in range(0, len(x), 50)]).argmax(-1) == ref).float().mean().item()
                for k, q in ways.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated model:batch")
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="default: benchmarks/results/int8_kernels_<cpu>.json")
    args = ap.parse_args()
    args.out = args.out or f"benchmarks/results/int8_kernels_{cpu_bf16_kind()}.json"
    rows = []
    for case, name, batch, model, x in cpu_cases(args):
        nets = {"int8 onednn": quantize_int8(model, kernel="onednn"), "int8 fbgemm": quantize_int8(model, kernel="fbgemm")}
        ways = {n: step_fn(q, "infer", x) for n, q in nets.items()}
        ways["fp32 eager"] = step_fn(model, "infer", x)
        ref = ways["fp32 eager"]()
        diff = {n: (ways[n]() - ref).abs().max().item() for n in nets}
        times = race(ways, args.repeats, 1, torch.device("cpu"))
        row = dict(case=case, model=name, batch=batch, img_s={n: batch / statistics.median(t) for n, t in times.items()},
                   **{"int8 onednn / int8 fbgemm": ratio(times, "int8 onednn", "int8 fbgemm")},
                   **{f"{n} / fp32 eager": ratio(times, n, "fp32 eager") for n in nets},
                   max_abs_logit_diff_from_fp32=diff, top1_agreement_demo_digits=agreement(model, nets))
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_rows(args, "benchmarks/int8_kernels.py", rows, repeats=args.repeats)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
