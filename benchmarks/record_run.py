"""Run one command that prints a JSON summary as its last line (e.g. `vitkit train --json`), and append
that summary, with the run's name, the command and its wall time, to a JSON-lines results file.

    python3 benchmarks/record_run.py RESULTS.jsonl NAME COMMAND...
"""

import json
import shlex
import subprocess
import sys
import time


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    res, name, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
    t = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{name}: failed with exit code {p.returncode}")
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    summary.pop("run_dir", None)
    rec = {"run": name, "command": shlex.join(cmd), **summary, "wall_s": round(wall, 2)}
    with open(res, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps(rec))


if __name__ == "__main__":
    main()
