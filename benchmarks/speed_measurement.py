"""How well the budget's speed measurement stands for the run's own training speed on this CPU.

    python benchmarks/speed_measurement.py [--candidate short-lr-3x] [--steps 60] [--rounds 2]

A clock-bounded run measures one process's steps alone, for about a second (train/speed.py
``process_speed``), and counts its processes as that many times as fast. Here, side by side, one layout
after the other in each round, each in fresh processes on random images of the candidate's size:

  - measured: the measurement as a run takes it (one process alone, 3 to 20 steps, at least 1 s), x2;
  - alone: one process alone for --steps steps, x2 (the same measurement held longer);
  - two at once: two independent processes at the same time, --steps steps each, summed (do the
    processes slow each other: shared cores, memory bandwidth, a host's hyperthreads?);
  - ddp: the run's two processes training together (DDP over gloo, one batch each), summed (what the
    gradients' all-reduce, DDP's broadcast of rank 0's buffers before every forward, the step's flags and
    the waits for the slower rank cost);
  - ddp, no buffer broadcast: the same without DDP's broadcast of the buffers (``broadcast_buffers``
    off), which no training step reads: what that one collective a step costs;
  - ddp, Muon unshared: the pair with each process orthogonalising every matrix itself, as runs did before
    the processes shared Muon's work out (``MuonAdamW.share_work``).

``--layouts`` picks some of them (measured, alone, two, ddp, ddp-no-broadcast, ddp-unshared; default all).

``--on KEY=VALUE[,KEY=VALUE...]`` (repeatable) adds a variant of the candidate (those `--set` overrides over
it), measured in the same layouts in every round right after the candidate itself: a change's cost side by
side, for screening it at equal time rather than equal epochs (variant against candidate, per layout).

Prints images per second and each layout against `alone` in the same round, and appends one record a
round to benchmarks/results/speed_measurement.jsonl, with the CPU's instruction set.
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
from vitkit.train.speed import machine_key  # noqa: E402

from step_profile import PROCESSES, config  # noqa: E402  (benchmarks/ is on sys.path; the candidate as a run trains it)

RESULTS = Path(__file__).resolve().parent / "results" / "speed_measurement.jsonl"
LAYOUTS = {"measured": "measured", "alone": "alone", "two": "two at once", "ddp": "ddp",
           "ddp-no-broadcast": "ddp, no buffer broadcast", "ddp-unshared": "ddp, Muon unshared"}


def worker(name: str, rank: int, world: int, steps: int | None, port: int, out, broadcast: bool = True,
           shared: bool = True, sets: tuple[str, ...] = ()) -> None:
    """One process's images per second: alone (world 1) or as rank ``rank`` of a DDP group of ``world``
    (``broadcast``: DDP broadcasting rank 0's buffers before every forward, as a run's DDP does; ``shared``:
    the processes sharing Muon's orthogonalisations out, as a run's do)."""
    import warnings

    from torch.nn.parallel import DistributedDataParallel as DDP

    from vitkit.train.distributed import DistInfo, process_group
    from vitkit.train.speed import process_speed

    if not broadcast:  # torch's newer name for it where it has it (the older one is deprecated there)
        import inspect

        key = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
               else "broadcast_buffers")
        wrap = DDP.__init__

        def without_broadcast(self, *a, **k):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                wrap(self, *a, **{**k, key: False})

        DDP.__init__ = without_broadcast

    if not shared:
        from vitkit.train.optim import MuonAdamW

        MuonAdamW.share_work = lambda self, *a: None  # every process computes every update itself

    torch.set_num_threads(1)  # as each of a run's processes trains
    cfg, mcfg = config(name, sets)
    dist = DistInfo(rank, world, rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    with process_group(dist, torch.device("cpu")):
        out.put(process_speed(cfg, mcfg, torch.device("cpu"), 1, 10, dist=dist, steps=steps))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layout(name: str, kind: str, steps: int, sets: tuple[str, ...] = ()) -> float:
    """Images per second of all the processes of one layout together."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    if kind == "measured":
        jobs = [(0, 1, None)]
    elif kind == "alone":
        jobs = [(0, 1, steps)]
    elif kind == "two at once":
        jobs = [(0, 1, steps), (0, 1, steps)]
    else:  # ddp, with or without the buffers' broadcast or Muon's shared work
        jobs = [(r, PROCESSES, steps) for r in range(PROCESSES)]
    procs = [ctx.Process(target=worker, args=(name, rank, world, n, port, out, kind != "ddp, no buffer broadcast",
                                              kind != "ddp, Muon unshared", sets))
             for rank, world, n in jobs]  # a process alone starts no group: the port is the DDP pair's
    for p in procs:
        p.start()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    if kind in ("measured", "alone"):
        return rates[0] * PROCESSES  # as a run counts its processes
    return sum(rates)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidate", default="short-lr-3x", help="a small-data candidate (train/recipe.py)")
    ap.add_argument("--steps", type=int, default=60, help="timed steps of the held layouts (default 60)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="which layouts, comma-separated (default all)")
    ap.add_argument("--on", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help="a variant of the candidate to measure beside it (repeatable)")
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args(argv)
    emulated = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
                if k in os.environ}
    picked = args.layouts.split(",")
    unknown = [k for k in picked if k not in LAYOUTS]
    if unknown or "alone" not in picked:
        ap.error(f"--layouts: {', '.join(unknown) or 'alone is needed'} (known: {', '.join(LAYOUTS)}; 'alone' is "
                 "what the others are counted against)")
    kinds = tuple(LAYOUTS[k] for k in picked)
    variants = {"": ()} | {on: tuple(on.split(",")) for on in args.on}
    for on in args.on:
        config(args.candidate, variants[on])  # a bad override fails here, in one line, before any round
    for r in range(args.rounds):
        rates = {v: {} for v in variants}
        for kind in kinds:
            for v, sets in variants.items():
                rates[v][kind] = layout(args.candidate, kind, args.steps, sets)
        for v in variants:
            for kind in kinds:
                vs = f"  {rates[v][kind] / rates[''][kind]:.2f}x the candidate" if v else ""
                print(f"round {r + 1}: {v or args.candidate:<24} {kind:<26} {rates[v][kind]:7.0f} img/s  "
                      f"{rates[v][kind] / rates[v]['alone']:.2f}x alone{vs}", flush=True)
        with open(args.results, "a", encoding="utf-8") as f:
            for v in variants:
                record = {"candidate": args.candidate, "round": r + 1, "steps": args.steps, "processes": PROCESSES,
                          "images_per_s": {k: round(x, 1) for k, x in rates[v].items()},
                          "vs_alone": {k: round(x / rates[v]["alone"], 3) for k, x in rates[v].items()},
                          "cpu_isa": cpu_capability(), "emulated": emulated,
                          "machine": machine_key(torch.device("cpu")), "torch": torch.__version__,
                          "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                          "command": "python benchmarks/speed_measurement.py "
                                     + " ".join(argv if argv is not None else sys.argv[1:])}
                if v:
                    record["on"] = list(variants[v])
                    record["vs_candidate"] = {k: round(x / rates[""][k], 3) for k, x in rates[v].items()}
                f.write(json.dumps(record) + "\n")

if __name__ == "__main__":
    main()
