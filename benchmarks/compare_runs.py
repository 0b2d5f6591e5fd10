"""Whether two runs computed the same thing: their metrics.jsonl records compared field by field, every
field but the timings (seconds, images per second), the run's own folder and whether the decoded-image
cache served its data (the second run of the same data reads what the first decoded).

    python benchmarks/compare_runs.py RUN_A RUN_B

A change that must not alter behaviour (a refactor) is checked this way on the digits demo, e.g.
`vitkit train --max-minutes 0 --nproc 1 --threads 1 --out runs/before` on the old code and the same into
runs/after on the new. Prints the differing fields (at most 20) and exits 1 where there are any.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMINGS = {"seconds", "train_seconds", "total_seconds", "cpu_seconds", "data_seconds", "img_per_s", "run_dir",
           "data_cache", "machine", "end_seconds", "end_estimate_seconds"}


def records(run: Path) -> list[dict]:
    with open(run / "metrics.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def differences(a: list[dict], b: list[dict]) -> list[str]:
    out = [f"records: {len(a)} against {len(b)}"] if len(a) != len(b) else []
    for i, (x, y) in enumerate(zip(a, b)):
        for key in sorted((set(x) | set(y)) - TIMINGS):
            if x.get(key) != y.get(key):
                out.append(f"record {i} ({x.get('type')}): {key}: {x.get(key)!r} against {y.get(key)!r}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    a, b = (records(Path(p)) for p in argv)
    diff = differences(a, b)
    for line in diff[:20]:
        print(line)
    print(f"{len(a)} records; {len(diff)} difference(s) outside the timings")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
