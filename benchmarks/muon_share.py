"""What sharing Muon's orthogonalisations between a run's two processes can gain, on this CPU, by its parts:
the Newton-Schulz iterations of one step for each small-data candidate's Muon matrices on one thread (all of
them, as one process did alone, and each process's share, as ``optim.owners`` splits them), and the
all-reduce that gives every process the updates (gloo, two processes, a tensor of the candidate's Muon
parameters).

    python benchmarks/muon_share.py [--candidates long-lr-3x,short-lr-3x] [--seconds 3] [--rounds 200]

The end-to-end pair, shared against unshared, is benchmarks/speed_measurement.py's
``--layouts alone,ddp,ddp-unshared``. Appends one record a candidate to benchmarks/results/muon_share.jsonl,
with the CPU's instruction set.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from vitkit.core.hardware import cpu_capability  # noqa: E402
from vitkit.train.build import build_model  # noqa: E402
from vitkit.train.optim import build_optimizer, matrix_shape, orthogonalize, owners  # noqa: E402
from vitkit.train.speed import machine_key  # noqa: E402

from step_profile import PROCESSES, config  # noqa: E402  (benchmarks/ is on sys.path; the candidate as a run trains it)

RESULTS = Path(__file__).resolve().parent / "results" / "muon_share.jsonl"


def muon_shapes(name: str) -> list[tuple[int, int]]:
    """The (rows, cols) of the candidate's Muon matrices (a conv's filters flattened), as its optimizer holds them."""
    cfg, mcfg = config(name)
    model = build_model(cfg, mcfg, [str(i) for i in range(10)])
    opt = build_optimizer(model, cfg.optim)
    return [matrix_shape(p) for g in opt.param_groups if g["muon"] for p in g["params"]]


def ns_ms(shapes: list[tuple[int, int]], seconds: float) -> float:
    """Milliseconds of one step's Newton-Schulz iterations over matrices of ``shapes``, on one thread."""
    mats = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
    for m in mats:
        orthogonalize(m)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n < 3:
        for m in mats:
            orthogonalize(m)
        n += 1
    return 1000 * (time.perf_counter() - start) / n


def reduce_worker(rank: int, numel: int, rounds: int, port: int, out) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=PROCESSES)
    t = torch.randn(numel)
    for _ in range(5):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(rounds):
        dist.all_reduce(t)
    if rank == 0:
        out.put(1000 * (time.perf_counter() - start) / rounds)
    dist.destroy_process_group()


def all_reduce_ms(numel: int, rounds: int) -> float:
    """Milliseconds of one gloo all-reduce of ``numel`` floats between two processes (the mean of ``rounds``)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=reduce_worker, args=(r, numel, rounds, port, out)) for r in range(PROCESSES)]
    for p in procs:
        p.start()
    ms = out.get()
    for p in procs:
        p.join()
    return ms


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", default="long-lr-3x,short-lr-3x")
    ap.add_argument("--seconds", type=float, default=3.0, help="how long each Newton-Schulz timing runs (default 3)")
    ap.add_argument("--rounds", type=int, default=200, help="all-reduces timed (default 200)")
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # as each of a run's processes trains
    for name in args.candidates.split(","):
        shapes = muon_shapes(name)
        who = owners(shapes, PROCESSES)
        alone = ns_ms(shapes, args.seconds)
        shares = [ns_ms([s for s, w in zip(shapes, who) if w == r], args.seconds) for r in range(PROCESSES)]
        numel = sum(s[0] * s[1] for s in shapes)
        reduce = all_reduce_ms(numel, args.rounds)
        print(f"{name}: {len(shapes)} matrices, Newton-Schulz {alone:.1f} ms alone, shares "
              f"{' / '.join(f'{x:.1f}' for x in shares)} ms; all-reduce of {numel:,} floats {reduce:.1f} ms; "
              f"saved {alone - max(shares) - reduce:.1f} ms a step", flush=True)
        record = {"candidate": name, "matrices": [list(s) for s in shapes], "owners": who,
                  "newton_schulz_ms": round(alone, 2), "share_ms": [round(x, 2) for x in shares],
                  "all_reduce_ms": round(reduce, 2), "numel": numel,
                  "saved_ms": round(alone - max(shares) - reduce, 2), "cpu_isa": cpu_capability(),
                  "machine": machine_key(torch.device("cpu")), "torch": torch.__version__,
                  "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "command": "python benchmarks/muon_share.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        with open(args.results, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
