"""What progress, the loggers and the plots cost a training run.

    python benchmarks/bench_logging.py [--runs]

Measures, in this process: ``write_plots`` on two synthetic metrics.jsonl of realistic size (the
demo's: 2,500 steps logged every 20, 20 validations; a 200-epoch CIFAR-10 run: 140,600 steps, 200
validations), in CPU seconds (wall time on a shared machine varies more); ``Task.update`` (what every
training step pays) silent and with progress lines; one progress line; ``MetricsLog.append`` (what
every ``log_every``-th step pays) with metrics.jsonl alone, + csv, + tensorboard, + both (tensorboard
needs its package). ``--runs`` also trains one epoch of the demo model (125 steps, one process of one
thread) twice each with ``--quiet``, with progress lines and with lines + csv + tensorboard, and
prints the training CPU seconds of each run.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from vitkit.core.errors import ConfigError
from vitkit.core.progress import Progress, ProgressLines
from vitkit.train.metrics import MetricsLog, open_loggers, write_plots


def fake_log(run: Path, steps: int, log_every: int, evals: int) -> int:
    """A metrics.jsonl of ``steps`` steps logged every ``log_every`` and ``evals`` validations; its records."""
    run.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(0)
    lines = []
    for s in range(log_every, steps + 1, log_every):
        lines.append({"type": "step", "step": s, "epoch": s * evals // steps, "loss": rnd.random(),
                      "train_acc": rnd.random(), "lr": 1e-3, "img_per_s": 800.0, "seconds": s / 10})
        if s % (steps // evals) < log_every:
            lines.append({"type": "eval", "split": "val", "epoch": s * evals // steps, "step": s,
                          "loss": rnd.random(), "acc": rnd.random(), "seconds": s / 10})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return len(lines)


def plots(root: Path) -> None:
    fake_log(root / "warm", 100, 20, 1)
    write_plots(root / "warm")  # the first call imports matplotlib
    for name, steps, evals in (("demo", 2500, 20), ("cifar10-200-epochs", 140_600, 200)):
        n = fake_log(root / name, steps, 20, evals)
        cpu = []
        for _ in range(5):
            t = time.process_time()
            write_plots(root / name)
            cpu.append(time.process_time() - t)
        print(f"write_plots, {name} ({n} records): {statistics.median(cpu):.3f} s CPU (median of 5)")


def progress_updates() -> None:
    n = 200_000
    for label, p in (("silent", Progress()), ("progress lines every 30 s", ProgressLines(io.StringIO(), 30))):
        task = p.task("train", n, unit="steps", budget=3600.0, rate=False, closing=False)
        t = timeit.timeit(lambda: task.update(5), number=n)
        print(f"Task.update, {label}: {t / n * 1e6:.2f} us a step")
    task = Progress().task("train", n, unit="steps", budget=3600.0, rate=False)
    task.info = ("epoch 1/20", "loss 0.8123", "train acc 71.3%", "lr 1.00e-03", "812 img/s")
    t = timeit.timeit(task.line, number=20_000)
    print(f"one progress line: {t / 20_000 * 1e6:.1f} us")


def appends(root: Path) -> None:
    rec = {"type": "step", "step": 1, "epoch": 0, "loss": 0.5, "train_acc": 0.5, "lr": 1e-3, "img_per_s": 800.0,
           "seconds": 1.0}
    for names in ([], ["csv"], ["tensorboard"], ["csv", "tensorboard"]):
        run = root / ("log-" + "-".join(names or ["jsonl"]))
        run.mkdir(parents=True)
        try:
            log = MetricsLog(run / "metrics.jsonl", loggers=open_loggers(names, run, {}))
        except ConfigError as e:  # a logger's package is not installed
            print(f"MetricsLog.append, metrics.jsonl + {names}: skipped ({e})")
            continue
        log.open(0)
        k = 2000
        t = time.perf_counter()
        for i in range(k):
            log.append(dict(rec, step=i + 1))
        dt = (time.perf_counter() - t) / k
        log.close()
        print(f"MetricsLog.append, metrics.jsonl + {names or 'nothing'}: {dt * 1e6:.0f} us a record")


def runs(root: Path) -> None:
    modes = {"--quiet": ["--quiet"], "progress lines": ["--progress-every", "30"],
             "lines + csv + tensorboard": ["--progress-every", "30", "--log", "csv,tensorboard"]}
    for rep in range(2):
        for label, extra in modes.items():
            out = root / f"run-{rep}-{len(extra)}"
            r = subprocess.run([sys.executable, "-m", "vitkit", "train", "--epochs", "1", "--nproc", "1", "--threads",
                                "1", "--max-minutes", "0", "--precision", "fp32", "--out", str(out), "--json", *extra],
                               capture_output=True, text=True, check=True)
            s = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"one demo epoch, {label}: {s['train_seconds']:.1f} s training, {s['cpu_seconds']:.1f} s CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", action="store_true", help="also train one demo epoch in each setting (minutes)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plots(root)
        progress_updates()
        appends(root)
        if args.runs:
            runs(root)


if __name__ == "__main__":
    main()
