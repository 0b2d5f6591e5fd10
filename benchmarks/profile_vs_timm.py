"""The same named model in vitkit and in timm, op by op: what each runs in one inference forward, and
the speed ratio from alternations whose order flips each round (vitkit first, then timm first), so that
running second is no advantage to either.

    PYTHONPATH=src python benchmarks/profile_vs_timm.py [--model vit_tiny_patch16_224] [--batch 16]
                                                         [--threads 2] [--rounds 6]

Needs timm (and so torchvision): run it with the reference environment of benchmarks/parity.sh. Prints
the ops whose call counts differ between the two (none means the same kernels, call for call), the
self CPU time of the heaviest ops of each, and the median vitkit / timm speed ratio with its range.
Writes benchmarks/results/profile_vs_timm.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "profile_vs_timm.json"


def seconds_per_batch(model, x: torch.Tensor, repeats: int) -> float:
    with torch.inference_mode():
        for _ in range(2):
            model(x)
        start = time.perf_counter()
        for _ in range(repeats):
            model(x)
    return (time.perf_counter() - start) / repeats


def op_table(model, x: torch.Tensor, passes: int = 3) -> dict[str, tuple[int, float]]:
    """op name -> (calls, self CPU ms) over ``passes`` forwards."""
    from torch.profiler import profile

    with torch.inference_mode(), profile() as prof:
        for _ in range(passes):
            model(x)
    return {e.key: (e.count, e.self_cpu_time_total / 1e3) for e in prof.key_averages()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_tiny_patch16_224")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6, help="alternations (even: each order as often)")
    p.add_argument("--repeats", type=int, default=8, help="timed forwards of each model in a round")
    args = p.parse_args(argv)

    import timm

    import vitkit

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = {"vitkit": vitkit.create_model(args.model).eval(), "timm": timm.create_model(args.model).eval()}
    size = models["vitkit"].cfg.img_size
    x = torch.randn(args.batch, 3, *size)
    # the weights are each library's own random init: the arithmetic, and so the speed, does not depend on them

    ratios = []
    for r in range(args.rounds):
        order = ("vitkit", "timm") if r % 2 == 0 else ("timm", "vitkit")
        t = {name: seconds_per_batch(models[name], x, args.repeats) for name in order}
        ratios.append(t["timm"] / t["vitkit"])

    tables = {name: op_table(m, x) for name, m in models.items()}
    ops = sorted(set(tables["vitkit"]) | set(tables["timm"]))
    differ = {op: (tables["vitkit"].get(op, (0, 0))[0], tables["timm"].get(op, (0, 0))[0]) for op in ops
              if tables["vitkit"].get(op, (0, 0))[0] != tables["timm"].get(op, (0, 0))[0]}
    heavy = sorted(ops, key=lambda op: -max(tables[n].get(op, (0, 0.0))[1] for n in tables))[:8]

    print(f"{args.model}, batch {args.batch}, {args.threads} threads, fp32 inference, torch {torch.__version__}, "
          f"timm {timm.__version__}")
    print("ops whose call counts differ (vitkit, timm):", differ or "none")
    print(f"{'op':<56} {'vitkit ms':>10} {'timm ms':>10}")
    for op in heavy:
        print(f"{op[:56]:<56} {tables['vitkit'].get(op, (0, 0.0))[1]:>10.1f} {tables['timm'].get(op, (0, 0.0))[1]:>10.1f}")
    totals = {n: sum(v[1] for v in t.values()) for n, t in tables.items()}
    print(f"{'self CPU total':<56} {totals['vitkit']:>10.1f} {totals['timm']:>10.1f}")
    med = statistics.median(ratios)
    print(f"speed vitkit / timm: median {med:.3f} [{min(ratios):.3f}, {max(ratios):.3f}] over {args.rounds} rounds "
          "(order flipped each round)")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "model": args.model, "batch": args.batch, "threads": args.threads, "torch": torch.__version__,
        "timm": timm.__version__, "ratios": [round(r, 4) for r in ratios], "median": round(med, 4),
        "ops_differ": differ, "self_cpu_ms": {n: round(v, 1) for n, v in totals.items()},
        "command": "PYTHONPATH=src python benchmarks/profile_vs_timm.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
