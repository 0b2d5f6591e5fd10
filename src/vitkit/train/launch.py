"""Start the processes of a distributed run with torch's elastic launcher, the one `torchrun` runs.

`vitkit train --nproc N` hands N copies of its own command line to
``torch.distributed.launcher.api.elastic_launch``, which sets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT in each, so that a launched process takes the same
distributed path as one that `torchrun` starts. Where the processes meet (a ``LaunchPlan``):

- one machine: a rendezvous on a port of this machine that the system picks (`torchrun --standalone`);
- several machines (``--nnodes N`` or ``MIN:MAX``): the same command on each, meeting at
  ``--rdzv-endpoint HOST:PORT``. With the c10d rendezvous (the default) the first machine to arrive
  there hosts it and the rendezvous orders the machines; with ``--rdzv-backend static`` each machine
  names its place (``--node-rank``), and machine 0, which holds the run's rank 0, hosts the
  rendezvous at its own address.

What a launch looks like:

- On each machine, local rank 0 keeps the terminal (its progress bar, its messages); the other
  processes write to files in a temporary folder, shown only when one of them fails.
- Ctrl-C (SIGINT) and SIGTERM reach the launcher, which passes them on to every process (each runs
  in a session of its own): they agree on the step, rank 0 saves, all exit (torch's shutdown timeout,
  30 s by default, bounds how long they may take). A second Ctrl-C ends the launcher at once; its
  processes finish stopping on their own. If the launcher dies, its processes get SIGTERM (Linux;
  ``follow_launcher``), so none is left running on its own.
- When a process fails, the launcher stops the others and reports it (``report_failure``): a
  process's one-line vitkit error is recorded in its error file (``record_error``), so the report
  shows each error once.
- No silent restarts: ``--max-restarts K`` (default 0) lets the launcher start every process again
  after a failure, up to K times; a restarted attempt continues from the run's last checkpoint (the
  launcher passes ``--auto-resume`` to processes that may start again).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn

from ..core.errors import ConfigError, TrainingError, VitkitError

RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")  # torch's rendezvous backends
DEFAULT_RDZV_ID = "vitkit"  # the run id of a rendezvous on several machines unless --rdzv-id names one
TAIL_LINES = 20  # the lines of a failed process's output that its report shows


@dataclass(frozen=True)
class LaunchPlan:
    """How many processes a run has and where they meet: ``nproc`` on this machine, on ``min_nodes`` to
    ``max_nodes`` machines, at a rendezvous; ``max_restarts``: how often a failed run is started again."""

    nproc: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    rdzv_id: str | None = None
    max_restarts: int = 0

    @property
    def needs_launcher(self) -> bool:
        """Whether the run is started by the launcher: several processes or machines, or restarts."""
        return self.nproc > 1 or self.max_nodes > 1 or self.max_restarts > 0

    @property
    def may_restart(self) -> bool:
        """Whether the processes may be started again: after a failure (--max-restarts), or when a
        machine joins an elastic run (MIN < MAX machines; torch does not count that as a restart)."""
        return self.max_restarts > 0 or self.min_nodes < self.max_nodes

    @property
    def standalone(self) -> bool:
        """One machine and no endpoint given: the rendezvous is on a free port of this machine."""
        return self.max_nodes == 1 and self.rdzv_endpoint is None


def launch_plan(nproc: int, nnodes: str | None = None, node_rank: int | None = None, rdzv_endpoint: str | None = None,
                rdzv_backend: str | None = None, rdzv_id: str | None = None,
                max_restarts: int | None = None) -> LaunchPlan:
    """The LaunchPlan of the command line's flags, checked: each error is one line naming its flag."""
    min_nodes, max_nodes = parse_nnodes(nnodes) if nnodes is not None else (1, 1)
    backend = rdzv_backend or "c10d"
    if backend not in RDZV_BACKENDS:
        raise ConfigError(f"--rdzv-backend: unknown {backend!r}; one of: {', '.join(RDZV_BACKENDS)}")
    if max_restarts is not None and max_restarts < 0:
        raise ConfigError(f"--max-restarts: must be >= 0, got {max_restarts}")
    if rdzv_endpoint is not None:
        parse_endpoint(rdzv_endpoint)
    elif max_nodes > 1:
        raise ConfigError(f"--rdzv-endpoint: a run on several machines (--nnodes {nnodes}) needs the address they "
                          "meet at, HOST:PORT (a port of one of them)")
    if rdzv_id is not None and not rdzv_id.strip():
        raise ConfigError("--rdzv-id: must not be empty")
    check_node_rank(node_rank, backend, min_nodes, max_nodes)
    return LaunchPlan(nproc=nproc, min_nodes=min_nodes, max_nodes=max_nodes, node_rank=node_rank,
                      rdzv_endpoint=rdzv_endpoint, rdzv_backend=backend, rdzv_id=rdzv_id,
                      max_restarts=max_restarts or 0)


def parse_nnodes(text: str) -> tuple[int, int]:
    """--nnodes: 'N' -> (N, N); 'MIN:MAX' -> (MIN, MAX), an elastic run on MIN to MAX machines."""
    parts = text.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, 0)
    except ValueError:
        lo = hi = 0
    if not 1 <= lo <= hi:
        raise ConfigError(f"--nnodes: expected a number of machines N or MIN:MAX (1 <= MIN <= MAX), got {text!r}")
    return lo, hi


def parse_endpoint(text: str) -> tuple[str, int]:
    """--rdzv-endpoint: 'HOST:PORT' -> (HOST, PORT); an IPv6 host in brackets ('[::1]:29500')."""
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"--rdzv-endpoint: expected HOST:PORT with a port in 1..65535, got {text!r}")
    return host.strip("[]"), int(port)


def check_resolves(endpoint: str) -> None:
    """A one-line error for an endpoint whose host has no address (a typo), at once: torch's store
    would retry it for minutes."""
    import socket

    host, port = parse_endpoint(endpoint)
    try:
        socket.getaddrinfo(host, port)
    except OSError as e:
        raise ConfigError(f"--rdzv-endpoint {endpoint}: no address for host {host!r} ({e.strerror or e})") from None


def check_node_rank(node_rank: int | None, backend: str, min_nodes: int, max_nodes: int) -> None:
    """--node-rank places this machine in a static rendezvous, which needs one on each machine."""
    if backend == "static":
        if min_nodes != max_nodes:
            raise ConfigError(f"--nnodes {min_nodes}:{max_nodes}: the static rendezvous needs a fixed number of "
                              "machines; use --rdzv-backend c10d for an elastic range")
        if max_nodes > 1 and node_rank is None:
            raise ConfigError("--node-rank: the static rendezvous needs this machine's rank, 0 on the machine "
                              "at --rdzv-endpoint")
    if node_rank is None:
        return
    if backend != "static":
        raise ConfigError(f"--node-rank: only the static rendezvous takes it (--rdzv-backend static); {backend} "
                          "orders the machines itself")
    if not 0 <= node_rank < max_nodes:
        raise ConfigError(f"--node-rank: must be in [0, {max_nodes}) for --nnodes {max_nodes}, got {node_rank}")


# ------------------------------------------------------------------------------------------- the launch
def launch(argv: list[str], plan: LaunchPlan, run_dir: str | os.PathLike | None = None) -> int:
    """Run ``vitkit ARGV`` as ``plan`` says; return the exit code (0, 130 when stopped by a signal, or the
    failure's). ``run_dir``: the run's folder, where a failure's report points (its checkpoint, how to
    resume) and where the processes' tracebacks go (``FAILURE_LOG``)."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import (  # noqa: F401
        RendezvousError,
        c10d_rendezvous_backend,
        dynamic_rendezvous,
        static_tcp_rendezvous,  # noqa: F401 - their loggers, quietened
    )
    from torch.distributed.launcher.api import elastic_launch

    if plan.rdzv_endpoint is not None:
        check_resolves(plan.rdzv_endpoint)
    with tempfile.TemporaryDirectory(prefix="vitkit-ranks-") as log_dir, _elastic_quiet(), _signals_kept(), \
            _fresh_store_each_attempt():
        logs = rank_logs(log_dir, plan.nproc)
        try:
            elastic_launch(launch_config(plan, logs), sys.executable)("-m", "vitkit", *argv)
        except ChildFailedError as e:
            return report_failure(e.failures, logs, run_dir)
        except SignalException:
            return 130  # every process got the signal: they stopped at the same step, rank 0 saved
        except RendezvousError as e:
            where = plan.rdzv_endpoint or "this machine"
            raise TrainingError(f"--rdzv-endpoint {where}: the rendezvous failed ({_first_line(e)})") from None
    return 0


def launch_config(plan: LaunchPlan, logs) -> "LaunchConfig":  # noqa: F821 - torch's, imported here
    """torch's LaunchConfig for ``plan``; ``logs``: where the processes write (``rank_logs``)."""
    from torch.distributed.launcher.api import LaunchConfig

    backend = "c10d" if plan.standalone else plan.rdzv_backend
    return LaunchConfig(
        min_nodes=plan.min_nodes, max_nodes=plan.max_nodes, nproc_per_node=plan.nproc,
        run_id=uuid.uuid4().hex if plan.standalone else plan.rdzv_id or DEFAULT_RDZV_ID,
        rdzv_backend=backend, rdzv_endpoint="localhost:0" if plan.standalone else plan.rdzv_endpoint,
        rdzv_configs={"rank": plan.node_rank or 0} if backend == "static" else {},
        max_restarts=plan.max_restarts, logs_specs=logs,
    )


def rank_logs(log_dir: str, nproc: int):
    """Where the processes write: local rank 0 to this terminal, the others to files under ``log_dir``.
    Remembers the files of the latest attempt (``.latest``) and the world size, for ``report_failure``."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, LogsDest, Std

    class RankLogs(DefaultLogsSpecs):
        def __init__(self):
            super().__init__(log_dir=log_dir, redirects={r: Std.NONE if r == 0 else Std.ALL for r in range(nproc)})
            self.latest, self.world_size = LogsDest(), nproc

        def reify(self, envs):
            self.latest = super().reify(envs)
            self.world_size = int(envs[0]["WORLD_SIZE"]) if envs else nproc
            return self.latest

    return RankLogs()


@contextlib.contextmanager
def _elastic_quiet():
    """No log records of torch's launcher on the terminal (its rendezvous and process notes, the
    failures it sees): what matters reaches the user as vitkit's own report. Its loggers (each with a
    level of its own, feeding torch's handler) are switched off while it runs, and back on after."""
    names = [n for n in logging.root.manager.loggerDict if n.startswith(("torch.distributed.elastic",
                                                                           "torch.distributed.launcher"))]
    loggers = [logging.getLogger(n) for n in names]
    was = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, w in zip(loggers, was):
            lg.disabled = w


@contextlib.contextmanager
def _fresh_store_each_attempt():
    """A new store for the processes of each attempt (restarts, machines joining an elastic run), with
    torch's own switch: the store the rendezvous shares by default outlives an attempt, and the next
    one's processes could read the previous one's addresses from it and fail to connect."""
    key, was = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    os.environ[key] = "1"
    try:
        yield
    finally:
        if was is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = was


@contextlib.contextmanager
def _signals_kept():
    """The launcher takes over SIGINT, SIGTERM, SIGHUP and SIGQUIT while it runs; give them back after."""
    sigs = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None),
                        getattr(signal, "SIGQUIT", None)) if s is not None]
    old = {s: signal.getsignal(s) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def follow_launcher() -> None:
    """Make this launched process end with its launcher. torch's launcher starts each process in a
    session of its own, out of reach of a signal to the launcher's group; on Linux the kernel then
    sends the process SIGTERM (a stop at the next step, as any SIGTERM) when the launcher dies, so that
    none keeps running on its own."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no prctl here
        return
    if os.getppid() == 1:  # the launcher died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


# ------------------------------------------------------------------------------------------- failures
def record_error(error_file: str | None, message: str, trace: str | None = None) -> None:
    """A launched process's one-line vitkit error, written to its error file (TORCHELASTIC_ERROR_FILE,
    which the command line passes), in the layout torch's ProcessFailure reads: the launcher then
    knows what the process printed. ``trace``: the traceback of a crash, which the process did not print
    (the launcher writes it to the run's ``FAILURE_LOG``). Nothing without an error file (not launched)."""
    if error_file:
        record = {"message": message, "timestamp": int(time.time())}
        if trace is not None:
            record["traceback"] = trace
        with contextlib.suppress(OSError):
            Path(error_file).write_text(json.dumps(record))


def end_now(code: int) -> NoReturn:
    """End this process at once with exit code ``code``, its output flushed, running no exit handlers: after
    a lost peer, the communication library's threads can abort the process as the interpreter tears down
    (SIGABRT, and 'terminate called without an active exception' on the terminal after the launcher's line)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing left to save
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def errors_recorded(error_file: str | None, end: Callable[[int], NoReturn] = end_now):
    """Record (``record_error``) a VitkitError that ends this launched process, and let it go on. Any
    other exception (a crash; in a distributed run most often the loss of another process, which the
    collective it waited in reports in many lines) is recorded with its traceback and ends the process
    with exit code 1 (``end``) without printing it: the launcher's report says in one line what happened.

    When one process dies, the launcher stops the others with SIGTERM, which may reach this one while its
    own crash (the lost peer) is on its way out, after training's handlers are gone: the signal then
    raises over the crash. The crash is what ended the process, so it is the one recorded, and SIGTERM is
    ignored from then on: the process is ending, and a line of its own would only add to the launcher's."""
    try:
        yield
    except VitkitError as e:
        record_error(error_file, str(e))
        raise
    except BaseException as e:  # noqa: BLE001 - a crash is reported by the launcher
        crash = _crash_of(e)
        if not error_file or crash is None:
            raise
        with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        import traceback

        trace = "".join(traceback.format_exception(type(crash), crash, crash.__traceback__))
        record_error(error_file, f"{type(crash).__name__}: {_first_line(crash)[:200]}", trace)
        end(1)


def _crash_of(e: BaseException) -> BaseException | None:
    """The crash that ``e`` is or ended: ``e`` itself where it is an exception other than a vitkit error; the
    exception a stop (SIGTERM's Terminated, Ctrl-C) interrupted on its way out; else None."""
    if isinstance(e, Exception):
        return None if isinstance(e, VitkitError) else e
    if isinstance(e, KeyboardInterrupt):
        inner = e.__context__
        if isinstance(inner, Exception) and not isinstance(inner, VitkitError):
            return inner
    return None


FAILURE_LOG = "failure.log"  # in the run folder: the tracebacks of processes that crashed, appended per failure


def report_failure(failures: dict, logs, run_dir: str | os.PathLike | None = None) -> int:
    """The exit code of a launch in which processes failed (``failures``: torch's ProcessFailure by
    global rank), after showing the failure unless the terminal shows it already.

    Local rank 0 writes to the terminal: when it ended on a vitkit error (recorded in its error file), or
    on an exit of its own while the others were stopped or lost it, its output is the report. Otherwise
    the cause (``_cause_order``) is shown in one line: a process's own vitkit error; else a process killed
    by a signal other than the launcher's SIGTERM (it died: the others only lost it); else one that exited
    on its own, with the last lines of its output; else a crash. With ``run_dir``, the line ends with the
    checkpoint kept and how to resume, and the crashes' tracebacks, which the processes did not print, go to
    ``run_dir``/FAILURE_LOG."""
    log = write_failure_log(run_dir, failures) if run_dir is not None else None
    terminal = logs.latest.error_files.get(0)
    own = next((f.exitcode for f in failures.values() if f.local_rank == 0 and f.exitcode > 0), None)
    mine = next((f for f in failures.values() if f.local_rank == 0), None)
    if terminal and os.path.isfile(terminal) and not (mine is not None and _crashed(mine)):
        return own or 1
    said = mine is not None and mine.exitcode > 0 and not _crashed(mine)  # local rank 0's output says why
    others = {rank: f for rank, f in failures.items() if f is not mine or not said}
    if said and all((f.exitcode < 0 and not _recorded(f)) or _crashed(f) for f in others.values()):
        return own  # local rank 0 failed on its own (its output is on the terminal); the others were stopped or lost it
    rank, f = min((others or failures).items(), key=lambda rf: (_cause_order(rf[1]), rf[1].timestamp, rf[0]))
    where = f"process {rank} of {logs.world_size}"
    after = _resume_hint(run_dir, log) if run_dir is not None else ""
    if _recorded(f) and not _crashed(f):
        print(f"vitkit: error: {where}: {f.message}{after}", file=sys.stderr)
        return max(f.exitcode, 1)
    ended = f"exit code {f.exitcode}" if f.exitcode >= 0 else f"killed by {f.signal_name()}"
    print(f"vitkit: error: {where} failed ({f.message if _crashed(f) else ended}){after}", file=sys.stderr)
    if f.exitcode > 0 and not _crashed(f):
        for line in _tail(logs.latest.stderrs.get(f.local_rank)):
            print(f"  [rank {rank}] {line}", file=sys.stderr)
    return f.exitcode if f.exitcode > 0 else 128 - f.exitcode


def _cause_order(f) -> int:
    """How surely a failure is the cause of a launch's end (lowest first): its own vitkit error; killed by a
    signal other than the launcher's SIGTERM; an exit of its own that recorded nothing (it ended abruptly);
    a crash (in a distributed run most often the loss of another process), however the process then ended (a
    crash recorded, its communication threads may still abort it on their way out: SIGABRT is not a death of its
    own); stopped by the launcher."""
    if _recorded(f):
        return 3 if _crashed(f) else 0
    if f.exitcode < 0:
        return 4 if f.signal_name() == "SIGTERM" else 1
    return 2


def _resume_hint(run_dir, log: Path | None) -> str:
    """'; tracebacks in LOG; the last checkpoint RUN/last (step N) is kept; continue with: vitkit train
    --resume RUN', or that no checkpoint was saved."""
    from .checkpoint import checkpoint_step, find_checkpoint

    hint = f"; tracebacks in {log}" if log is not None else ""
    ckpt = find_checkpoint(Path(run_dir), "last")
    if ckpt is None:
        return hint + "; no checkpoint was saved yet"
    return hint + (f"; the last checkpoint {ckpt} (step {checkpoint_step(ckpt)}) is kept; continue with: "
                   f"vitkit train --resume {run_dir}")


def write_failure_log(run_dir, failures: dict) -> Path | None:
    """Append the tracebacks the failed processes recorded (``errors_recorded``) to ``run_dir``/FAILURE_LOG;
    its path, or None when there were none or the run folder cannot take them."""
    traces = [(rank, f) for rank, f in sorted(failures.items()) if _crashed(f)]
    if not traces or not Path(run_dir).is_dir():
        return None
    file = Path(run_dir) / FAILURE_LOG
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        with open(file, "a", encoding="utf-8") as out:
            for rank, f in traces:
                out.write(f"--- {stamp}: process {rank} (pid {f.pid}) failed\n{f.error_file_data['traceback']}\n")
    except OSError:
        return None
    return file


def _recorded(failure) -> bool:
    """Whether the process recorded its error (``record_error``) before it ended."""
    return isinstance(failure.message, str) and bool(failure.message) and os.path.isfile(failure.error_file)


def _crashed(failure) -> bool:
    """Whether the process recorded a crash: an exception other than a vitkit error, with its traceback."""
    data = failure.error_file_data
    return _recorded(failure) and isinstance(data, dict) and isinstance(data.get("traceback"), str)


def _tail(path: str | None) -> list[str]:
    try:
        text = Path(path).read_bytes().decode("utf-8", "replace") if path else ""
    except OSError:
        return []
    return text.strip().splitlines()[-TAIL_LINES:]


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


__all__ = ["LaunchPlan", "launch_plan", "parse_nnodes", "parse_endpoint", "check_resolves", "launch", "launch_config",
           "rank_logs", "follow_launcher", "record_error", "errors_recorded", "end_now", "report_failure",
           "write_failure_log", "FAILURE_LOG", "RDZV_BACKENDS",
           "DEFAULT_RDZV_ID"]
