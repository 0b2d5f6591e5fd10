"""Processes x threads for a recipe: the same clock-bounded `vitkit train` run laid out as 1 process of 2
threads, 2 processes of 1 thread, ..., one after the other (alternating over --repeats), on the same data.

    python benchmarks/processes_threads.py DATA [--minutes 1.5] [--layouts 1x2,2x1] [--repeats 1] [--seed 0]
                                           [--set KEY=VALUE ...]

Each run is `vitkit train --data DATA --max-minutes M --seed S --nproc P --threads T
--set data.val_fraction=0.1` (the recipe vitkit picks for DATA; `--batch-size` is the global batch, so
every layout trains the same steps). Compared: training images per second (steps x global batch / training
seconds), and the validation accuracy after the same clock. Rows are appended to
benchmarks/results/processes_threads.jsonl. Timings compare only within one run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
import time
from pathlib import Path

from time_to_accuracy import clock_run  # one way to run vitkit on a carve (benchmarks/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "processes_threads.jsonl"


def run(args, procs: int, threads: int, work: Path) -> dict:
    out = work / f"p{procs}t{threads}_{time.monotonic_ns()}"
    extra = ["--nproc", str(procs), "--threads", str(threads)]
    for o in args.set:
        extra += ["--set", o]
    code, s, cmd = clock_run(args.data, args.minutes, args.seed, out, extra)
    if code != 0:
        return {"layout": f"{procs}x{threads}", "error": f"exit code {code}", "command": shlex.join(cmd[1:])}
    batch = json.loads((out / "config.json").read_text())["batch_size"]  # the global batch
    row = {"layout": f"{procs}x{threads}", "processes": procs, "threads": threads, "val_acc": s["val_acc"],
           "epochs": s["epochs"], "steps": s["step"], "train_seconds": s["train_seconds"],
           "img_per_s": round(s["step"] * batch / s["train_seconds"], 1)}
    return row | {"command": shlex.join(cmd[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--minutes", type=float, default=1.5)
    ap.add_argument("--layouts", default="1x2,2x1", help="comma list of PROCESSESxTHREADS (default 1x2,2x1)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run (e.g. the long budget's model at a short clock)")
    args = ap.parse_args()
    layouts = [tuple(int(v) for v in s.split("x")) for s in args.layouts.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="procs_threads_") as tmp:
        for r in range(args.repeats):
            for procs, threads in (layouts if r % 2 == 0 else layouts[::-1]):
                row = run(args, procs, threads, Path(tmp)) | {"repeat": r, "minutes": args.minutes, "data": args.data}
                print(json.dumps(row), flush=True)
                rows.append(row)
    with RESULTS.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
