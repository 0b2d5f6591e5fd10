"""What the scripts that measure finished runs share: one JSON-lines record per run, with the command."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Callable, Iterable


def record_runs(script: str, runs: Iterable[Path], measure: Callable[[Path], dict], results: str, argv=None) -> None:
    """``measure`` each run and append its record, with the command that made it, to ``results``."""
    command = shlex.join(["python", f"benchmarks/{script}", *(argv or sys.argv[1:])])
    with open(results, "a", encoding="utf-8") as f:
        for run in runs:
            f.write(json.dumps({**measure(run), "command": command}) + "\n")
    print(f"wrote {results}")
