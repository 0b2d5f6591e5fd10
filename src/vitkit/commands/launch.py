"""Start N training processes on this machine, as `torchrun --standalone --nproc_per_node=N` would.

Each child runs the same vitkit command line with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set, so it takes the same distributed path as a torchrun launch.

- Rank 0 keeps this terminal (its progress bar, its messages); the other ranks' output is kept in
  temporary files and shown only when one of them fails and rank 0 does not.
- Ctrl-C reaches every process from the terminal: they agree on the step, rank 0 saves, all exit.
  A SIGTERM sent to this process is passed on to the children. If this process dies, the children
  get SIGTERM (Linux), so none is left running on its own.
- When a child fails, the others get a few seconds to finish, then are killed (checkpoints are
  written atomically, so a kill never leaves a broken one), and the failing exit code is returned.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

GRACE_S = 10.0  # after one child fails, how long the others may take to stop on their own


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def launch(argv: list[str], nproc: int, poll_s: float = 0.1) -> int:
    """Run ``vitkit ARGV`` as ``nproc`` DDP processes; return the exit code (0, or the first failure's)."""
    env = dict(os.environ, WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    procs: list[subprocess.Popen] = []
    logs: list = []
    old = {}

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    try:
        # Ctrl-C from the terminal reaches the children directly; this process only waits for them. (A
        # handler, not SIG_IGN: an ignored signal would stay ignored in the children.)
        old[signal.SIGINT] = signal.signal(signal.SIGINT, lambda signum, frame: None)
        old[signal.SIGTERM] = signal.signal(signal.SIGTERM, forward)
        for rank in range(nproc):
            logs.append(None if rank == 0 else tempfile.TemporaryFile())
            procs.append(_start(argv, dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), logs[-1]))
        codes = _wait(procs, poll_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for s, h in old.items():
            signal.signal(s, h)
    try:
        return report_exit(codes, logs, nproc)
    finally:
        for log in logs:
            if log is not None:
                log.close()


def _start(argv: list[str], env: dict, log) -> subprocess.Popen:
    # rank 0 (no log file) keeps the terminal; the others write their stderr to their log file
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    return subprocess.Popen([sys.executable, "-m", "vitkit", *argv], env=env, preexec_fn=preexec, stderr=log,
                            stdout=None if log is None else subprocess.DEVNULL)


def _wait(procs: list[subprocess.Popen], poll_s: float) -> list[int]:
    """The exit codes, once every process has ended; after a failure the others get GRACE_S seconds."""
    failed_at = None
    while any(p.poll() is None for p in procs):
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(poll_s)
    return [p.wait() for p in procs]


def report_exit(codes: list[int], logs: list, nproc: int) -> int:
    """The launch's exit code from the processes' ``codes``: rank 0's failure (its output is on the
    terminal already), else the first other failure, shown with the tail of that rank's ``logs``."""
    if codes[0] != 0:
        return codes[0]
    for rank, code in enumerate(codes):
        if code != 0:
            logs[rank].seek(0)
            tail = logs[rank].read().decode("utf-8", "replace").strip().splitlines()[-20:]
            print(f"vitkit: error: process {rank} of {nproc} failed (exit code {code})", file=sys.stderr)
            for line in tail:
                print(f"  [rank {rank}] {line}", file=sys.stderr)
            return code
    return 0


__all__ = ["launch", "free_port", "report_exit"]
