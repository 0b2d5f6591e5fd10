"""A block's forward as it was (the attention's output held through the MLP; q, k, v and the per-head
output held through the output projection) against the current one, which frees each buffer after its
use, and both against timm: fp32 inference, side by side in one process, the order rotating each round.

    PYTHONPATH=src python benchmarks/forward_liveness.py [--cases vit_tiny_patch16_224:16,...] [--rounds 9]

Needs timm (the reference environment of benchmarks/parity.sh). The three models share one set of
weights; the earlier forward is rebuilt here on the current modules, and checked to give the same
logits. Each ratio is the median [range] over the rounds of the slower way's seconds per batch over
the faster's, per round. Appends to benchmarks/results/forward_liveness.jsonl, with any MALLOC_*
settings of glibc's allocator in the environment (run under MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_, the earlier forward loses its gap: the cost was fresh pages, not arithmetic).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from profile_vs_timm import seconds_per_batch  # benchmarks/ is on sys.path

RESULTS = Path(__file__).resolve().parent / "results" / "forward_liveness.jsonl"


def earlier_block_forward(self, x):
    """The block's forward before: the attention output ``a`` stayed alive while the MLP ran."""
    a = self.attn(self.norm1(x))
    x = x + self.drop_path1(self.ls1(a))
    return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def earlier_attention_forward(self, x):
    """The attention's forward before: q, k, v and the per-head output stayed alive through the projection."""
    q, k, v = self.split_heads(x)
    out = F.scaled_dot_product_attention(q, k, v)
    B, H, T, hd = out.shape
    merged = out.transpose(1, 2).reshape(B, T, H * hd)
    return self.proj_drop(self.proj(merged))


def ratio(times: dict, fast: str, slow: str) -> list[float]:
    r = sorted(b / a for a, b in zip(times[fast], times[slow]))
    return [round(statistics.median(r), 3), round(r[0], 3), round(r[-1], 3)]


def run_case(name: str, batch: int, rounds: int) -> dict:
    import timm

    import vitkit

    current = vitkit.create_model(name, seed=0).eval()
    earlier = vitkit.create_model(name, seed=0).eval()
    reference = timm.create_model(name, pretrained=False).eval()
    reference.load_state_dict(current.state_dict())
    for blk in earlier.blocks:
        if blk.attn.fused and blk.pre_norm:
            blk.forward = types.MethodType(earlier_block_forward, blk)
            blk.attn.forward = types.MethodType(earlier_attention_forward, blk.attn)
    x = torch.randn(batch, 3, *current.cfg.img_size)
    with torch.inference_mode():
        gap = (current(x[:2]) - earlier(x[:2])).abs().max().item()
    assert gap <= 1e-5, f"the earlier forward computes something else ({gap})"
    models = {"current": current, "earlier": earlier, "timm": reference}
    names, repeats = list(models), max(2, 64 // batch)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % 3:] + names[: r % 3]:
            times[n].append(seconds_per_batch(models[n], x, repeats))
    return {"model": name, "batch": batch, "rounds": rounds, "threads": torch.get_num_threads(),
            "img_s": {n: round(batch / statistics.median(t), 2) for n, t in times.items()},
            "current / earlier": ratio(times, "current", "earlier"), "current / timm": ratio(times, "current", "timm"),
            "earlier / timm": ratio(times, "earlier", "timm"), "torch": torch.__version__,
            "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
            "command": "PYTHONPATH=src python benchmarks/forward_liveness.py " + " ".join(sys.argv[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="vit_tiny_patch16_224:16,vit_small_patch16_224:16,vit_tiny_patch16_224:1")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    RESULTS.parent.mkdir(exist_ok=True)
    for case in args.cases.split(","):
        name, batch = case.split(":")
        row = run_case(name, int(batch), args.rounds)
        print(json.dumps(row), flush=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
