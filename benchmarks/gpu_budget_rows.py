"""One JSON row per training run in benchmarks/gpu_budget.sh's logs: its name, the flags it was given, its
recipe line (what it measured and chose), how many runs shared the GPU with it, and its JSON summary's
fields (epochs reached, val_acc on the carve, train_seconds, ...), flat, as recipe tables cite them.

    python benchmarks/gpu_budget_rows.py LOG... --side-by-side N [--out FILE]

A log named rule.log (or ending in _rule.log) ran alone; the others ran N at a time. Rows are appended to
FILE (default: printed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows_of(log: Path, side_by_side: int) -> list[dict]:
    lines = log.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.startswith("=== ") or ": vitkit train " not in line:
            continue
        body = lines[i + 1:]
        body = body[:next((k for k, b in enumerate(body) if b.startswith("=== ")), len(body))]
        final = next((json.loads(b) for b in reversed(body) if b.startswith("{")), None)
        alone = log.name == "rule.log" or log.name.endswith("_rule.log")
        rows.append({"name": line[4:].split(":")[0], "log": log.name,
                     "args": line.split(": vitkit train ", 1)[1],
                     "recipe": next((b for b in body if b.startswith("recipe ")), None),
                     "side_by_side": 1 if alone else side_by_side, **(final or {"status": "no summary"})})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--side-by-side", type=int, required=True, help="how many runs shared the GPU at once")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = [r for log in args.logs for r in rows_of(log, args.side_by_side)]
    for r in rows:
        print(f"{r['name']:22s} epochs {r.get('epochs')}  carve {r.get('val_acc')}  train s {r.get('train_seconds')}"
              f"  ({r['side_by_side']} on the GPU)")
    if args.out:
        with args.out.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
