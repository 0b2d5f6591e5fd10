"""The mirror check (vitkit.data.mirror) on real data: what it measures and decides for each set, and its time.

    python benchmarks/mirror_check.py DATA [DATA ...] [--results FILE]

Each DATA is a dataset folder, or `demo` for the built-in digits. It is opened as a run opens it (its
training part less the seeded 10% validation carve, seed 0; photos larger than 64 px kept whole at the short
side the photos recipe decodes them at for 64 px), and checked as a run checks it: a ridge classifier on 16x16
images, fitted and scored in five folds, scores the images as they are and mirrored. One record a set is appended to
--results (default benchmarks/results/mirror_check.jsonl): the accuracies, the share mirroring keeps, the
margin in standard errors, the class pair most moved, the decision, and the seconds it took on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
RESULTS = ROOT / "benchmarks" / "results" / "mirror_check.jsonl"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="+", help="dataset folders, or 'demo' for the built-in digits")
    p.add_argument("--results", default=str(RESULTS), help="the JSON-lines file the records are appended to")
    args = p.parse_args(argv)

    import torch

    from vitkit.data.datasets import open_dataset, probe_data
    from vitkit.data.mirror import KEPT_MIN, Z_MIN, mirror_check
    from vitkit.data.splits import decode_short_side
    from vitkit.train.recipe import SMALL_SIDE
    from vitkit.train.speed import machine_key

    for data in args.data:
        path = None if data == "demo" else data
        short = None
        if path is not None and max(probe_data(path).size) > SMALL_SIDE:
            short = decode_short_side((64, 64), 0.875)  # the photos recipe's 64 px, crop_pct 0.875
        train = open_dataset(path, short_side=short, seed=0).train
        t0 = time.perf_counter()
        found = mirror_check(train, seed=0)
        seconds = time.perf_counter() - t0
        rec = {"data": data, "images": found.images, "train_images": len(train), "plain": round(found.plain, 4),
               "mirrored": round(found.mirrored, 4), "chance": round(found.chance, 4), "kept": round(found.kept, 3),
               "z": round(found.z, 1), "pair": found.pair and [found.pair[0], found.pair[1], round(found.pair[2], 3)],
               "refuses": found.refuses, "rule": {"kept_min": KEPT_MIN, "z_min": Z_MIN}, "seconds": round(seconds, 2),
               "threads": torch.get_num_threads(), "machine": machine_key(torch.device("cpu")),
               "command": "python benchmarks/mirror_check.py " + " ".join(sys.argv[1:] if argv is None else argv)}
        print(f"{data}: {'no flips' if found.refuses else 'flips kept'} ({seconds:.2f} s): {found.describe()}",
              flush=True)
        results = Path(args.results)
        results.parent.mkdir(parents=True, exist_ok=True)
        with open(results, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
