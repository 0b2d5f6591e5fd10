"""`vitkit train --nproc N`, `--nnodes`, `--max-restarts`: torch's elastic launcher starts the processes,
on one machine or on several (here two "machines" over loopback)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import FAST_TRAIN_ARGS as FAST
from helpers import image_folder, step_losses
from safetensors.torch import load_file

from vitkit.train import launch as launch_mod
from vitkit.cli.commands.train import check_processes
from vitkit.cli.main import main
from vitkit.core.errors import ConfigError
from vitkit.train.checkpoint import checkpoint_step

# no augmentation, no label smoothing: the 2-process run then follows the 1-process run (same global batch)
PLAIN = ["--set", "augment.crop=none", "--set", "augment.label_smoothing=0", "--set", "augment.hflip=0"]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"),
                                                  os.environ.get("PYTHONPATH", "")]))


def vitkit(*argv, timeout=180, **kw):
    return subprocess.run([sys.executable, "-m", "vitkit", *argv], capture_output=True, text=True,
                          timeout=timeout, env=ENV, **kw)


def assert_runs_as_one_process(common: list[str], tmp_path, run) -> None:
    """``run`` (6 steps of a global batch of 8 split among its processes) follows a 1-process run of the
    ``common`` arguments, in loss and weights: only the order of floating-point sums differs."""
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    one, two = step_losses(tmp_path / "one"), step_losses(run)
    assert len(one) == len(two) == 6
    assert torch.allclose(torch.tensor(one), torch.tensor(two), rtol=1e-4, atol=1e-5), (one, two)
    a = load_file(tmp_path / "one" / "last" / "vitkit.safetensors")
    b = load_file(Path(run) / "last" / "vitkit.safetensors")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k


@pytest.mark.parametrize("optim", ["adamw", "muon"])  # Muon: the processes share its orthogonalisations out
def test_two_launched_processes_match_one(tmp_path, capsys, optim):
    data = image_folder(tmp_path / "data")
    common = ["train", "--data", str(data), *FAST, *PLAIN, "--epochs", "2", "--set", "log_every=1", "--json",
              "--set", f"optim.name={optim}"]
    r = vitkit(*common, "--nproc", "2", "--out", str(tmp_path / "two"))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["processes"] == 2 and summary["status"] == "completed"
    assert json.loads((tmp_path / "two" / "config.json").read_text())["processes"] == 2
    assert_runs_as_one_process(common, tmp_path, tmp_path / "two")


def test_an_error_in_every_process_is_shown_once(tmp_path):
    r = vitkit("train", "--data", str(tmp_path / "missing"), *FAST, "--nproc", "2", "--out", str(tmp_path / "run"))
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("vitkit: error: ") and "missing" in errors[0], r.stderr


def test_ctrl_c_stops_every_process_and_the_run_resumes(tmp_path):
    data = image_folder(tmp_path / "data")
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "vitkit", "train", "--data", str(data), *FAST, "--epochs", "1000",
            "--max-minutes", "0.2", "--nproc", "2", "--out", str(run)]  # a budget bounds the resumed part too
    p = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "last" / "vitkit.safetensors").exists():  # a first epoch saved
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.2)
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C at a terminal reaches the whole process group
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    assert f"--resume {run}" in out + err
    # resuming starts the same number of processes (from the run's config.json) and finishes the run
    r = vitkit("train", "--resume", str(run), "--threads", "1", "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["processes"] == 2


def test_process_counts_the_device_cannot_host(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"processes: 2 processes need 2 CUDA GPUs \(one each\); this machine has 1"):
        check_processes(2, "auto")
    check_processes(2, "cpu")  # CPU processes share the cores
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_processes(2, "cuda")


def _failure(tmp_path, rank: int, exitcode: int, error: str | None = None, output: str = ""):
    """A failed process as torch's launcher reports it: its error file (written by record_error when it
    ended on a vitkit error) and its stderr log."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    folder = tmp_path / str(rank)
    folder.mkdir()
    (folder / "stderr.log").write_text(output)
    if error is not None:
        launch_mod.record_error(str(folder / "error.json"), error)
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=exitcode, error_file=str(folder / "error.json"))


def _logs(tmp_path, world_size: int = 2):
    from torch.distributed.elastic.multiprocessing import LogsDest

    n = world_size
    return SimpleNamespace(world_size=n, latest=LogsDest(
        stderrs={r: str(tmp_path / str(r) / "stderr.log") for r in range(n)},
        error_files={r: str(tmp_path / str(r) / "error.json") for r in range(n)}))


def test_a_failing_rank_is_reported_with_its_output(tmp_path, capsys):
    crash = _failure(tmp_path, 1, 3, output="Traceback (most recent call last):\nRuntimeError: boom\n")
    (tmp_path / "0").mkdir()
    assert launch_mod.report_failure({1: crash}, _logs(tmp_path)) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "vitkit: error: process 1 of 2 failed (exit code 3)"
    assert err[-1] == "  [rank 1] RuntimeError: boom"


def test_a_rank_s_one_line_error_is_shown_once(tmp_path, capsys):
    # rank 1 ended on a vitkit error, rank 0 was stopped by the launcher: rank 1's line is the report
    killed = _failure(tmp_path, 0, -signal.SIGTERM)
    failed = _failure(tmp_path, 1, 1, error="--data /x: no such folder", output="vitkit: error: --data /x: no such folder\n")
    assert launch_mod.report_failure({0: killed, 1: failed}, _logs(tmp_path)) == 1
    assert capsys.readouterr().err.splitlines() == ["vitkit: error: process 1 of 2: --data /x: no such folder"]


def test_rank_0_s_error_is_on_the_terminal_already(tmp_path, capsys):
    # local rank 0 printed its error to this terminal (it recorded it): nothing more is shown
    first = _failure(tmp_path, 0, 1, error="--data /x: no such folder")
    other = _failure(tmp_path, 1, 1, error="--data /x: no such folder")
    assert launch_mod.report_failure({0: first, 1: other}, _logs(tmp_path)) == 1
    assert capsys.readouterr().err == ""
    assert launch_mod.report_failure({1: other}, _logs(tmp_path)) == 1  # rank 0 stopped after the snapshot
    assert capsys.readouterr().err == ""



def test_rank_0_killed_alone_is_reported(tmp_path, capsys):
    (tmp_path / "1").mkdir()
    killed = _failure(tmp_path, 0, -signal.SIGKILL)  # e.g. by the kernel, out of memory
    assert launch_mod.report_failure({0: killed}, _logs(tmp_path)) == 128 + signal.SIGKILL
    assert capsys.readouterr().err.splitlines() == ["vitkit: error: process 0 of 2 failed (killed by SIGKILL)"]


def test_a_crash_that_then_aborts_is_not_taken_for_the_killed_rank(tmp_path, capsys):
    # rank 1 was killed; rank 0 lost it (gloo: connection closed), recorded that crash, and then ended on
    # SIGABRT as gloo's threads tore down ("terminate called without an active exception"): rank 1's
    # death is the cause, whatever the order in which the launcher saw the two
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "stderr.log").write_text("terminate called without an active exception\n")
    launch_mod.record_error(str(tmp_path / "0" / "error.json"), "RuntimeError: Connection closed by peer",
                            "Traceback (most recent call last):\nRuntimeError: Connection closed by peer\n")
    lost = ProcessFailure(local_rank=0, pid=100, exitcode=-signal.SIGABRT, error_file=str(tmp_path / "0" / "error.json"))
    killed = _failure(tmp_path, 1, -signal.SIGKILL)
    assert launch_mod.report_failure({0: lost, 1: killed}, _logs(tmp_path)) == 128 + signal.SIGKILL
    assert capsys.readouterr().err.splitlines() == ["vitkit: error: process 1 of 2 failed (killed by SIGKILL)"]


def test_the_launcher_s_sigterm_over_a_crash_records_the_crash(tmp_path):
    # A peer died: this process's collective failed, and the launcher's SIGTERM (Terminated) raised while
    # that crash was on its way out. The crash is recorded with its traceback, the process ends with exit
    # code 1 and prints nothing, and a later SIGTERM is ignored (the process is ending).
    from vitkit.cli.main import Terminated

    error_file = tmp_path / "error.json"
    before = signal.getsignal(signal.SIGTERM)
    ended = None
    try:
        with launch_mod.errors_recorded(str(error_file), end=sys.exit):  # a launched process: end_now (below)
            try:
                raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")
            except RuntimeError:
                raise Terminated
    except BaseException as e:  # noqa: BLE001 - a Terminated let through must fail the test, not stop pytest
        ended = e
    finally:
        ignored = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        signal.signal(signal.SIGTERM, before)
    assert isinstance(ended, SystemExit) and ended.code == 1, repr(ended)
    assert ignored
    record = json.loads(error_file.read_text())
    assert record["message"] == "RuntimeError: Connection closed by peer [127.0.0.1]:1234"
    assert record["traceback"].startswith("Traceback (most recent call last)")
    assert "RuntimeError: Connection closed by peer" in record["traceback"]


CRASH_THEN_EXIT = """
import atexit, sys
from vitkit.train.launch import errors_recorded
atexit.register(lambda: print("exit handlers ran", file=sys.stderr))
print("before the crash", end="")  # left in the buffer
with errors_recorded(sys.argv[1]):
    raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")
"""


def test_a_recorded_crash_ends_the_process_at_once_with_its_output_flushed(tmp_path):
    # After a lost peer, gloo's threads can abort a process as the interpreter tears down, printing
    # 'terminate called without an active exception' under the launcher's one line: a launched process ends
    # at its recorded crash without running exit handlers (or that teardown), its output flushed
    error_file = tmp_path / "error.json"
    r = subprocess.run([sys.executable, "-c", CRASH_THEN_EXIT, str(error_file)], capture_output=True, text=True,
                       timeout=120, env=ENV)
    assert (r.returncode, r.stdout, r.stderr) == (1, "before the crash", "")
    assert json.loads(error_file.read_text())["message"] == "RuntimeError: Connection closed by peer [127.0.0.1]:1234"


def test_a_stop_alone_or_over_a_vitkit_error_is_not_a_crash(tmp_path):
    from vitkit.cli.main import Terminated

    error_file = tmp_path / "error.json"
    with pytest.raises(Terminated):  # SIGTERM with nothing failing: the command's own stop
        with launch_mod.errors_recorded(str(error_file)):
            raise Terminated
    assert not error_file.exists()
    with pytest.raises(KeyboardInterrupt):  # a stop over a vitkit error: not recorded as a crash
        with launch_mod.errors_recorded(str(error_file)):
            try:
                raise ConfigError("--data /x: no such folder")
            except ConfigError:
                raise KeyboardInterrupt
    assert not error_file.exists()
    with pytest.raises(RuntimeError):  # not launched (no error file): a crash goes on as it is
        with launch_mod.errors_recorded(None):
            raise RuntimeError("boom")


def test_a_launched_run_reports_what_its_checkpoint_scores(tmp_path):
    """BatchNorm statistics move on each rank with its own batches; the accuracy and loss a 2-process
    run reports are those of the checkpoint it saves (rank 0's buffers), as `vitkit eval` finds them."""
    data = image_folder(tmp_path / "data")
    run = tmp_path / "run"
    r = vitkit("train", "--data", str(data), *FAST, "--epochs", "2", "--nproc", "2", "--json", "--out", str(run),
               "--set", "model_args.stem=conv", "--set", "model_args.stem_width=8",
               "--set", "ema=null")  # no EMA: the model scored is last/'s (the data's recipe keeps one)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    e = vitkit("eval", str(run / "last"), "--data", str(data), "--split", "test", "--json")
    assert e.returncode == 0, e.stderr
    res = json.loads(e.stdout.strip().splitlines()[-1])
    assert res["top1"] == pytest.approx(s["test_acc"], abs=1e-9)
    assert res["loss"] == pytest.approx(s["test_loss"], abs=1e-5)  # the summary rounds to 5 decimals


# ------------------------------------------------------------------------------- several machines
EP = ["--rdzv-endpoint", "node0:29500"]


@pytest.mark.parametrize("flags, message", [
    (["--nnodes", "0"], r"--nnodes: expected a number of machines N or MIN:MAX \(1 <= MIN <= MAX\), got '0'"),
    (["--nnodes", "3:2"], r"--nnodes: expected .* got '3:2'"),
    (["--nnodes", "two"], r"--nnodes: expected .* got 'two'"),
    (["--nnodes", "2"], r"--rdzv-endpoint: a run on several machines \(--nnodes 2\) needs the address they meet at"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0"], r"--rdzv-endpoint: expected HOST:PORT with a port in 1..65535, "
                                                    r"got 'node0'"),
    (["--nnodes", "2", "--rdzv-endpoint", "node0:70000"], r"--rdzv-endpoint: expected HOST:PORT"),
    (["--rdzv-backend", "zookeeper"], r"--rdzv-backend: unknown 'zookeeper'; one of: c10d, static, etcd, etcd-v2"),
    (["--nnodes", "2", *EP, "--node-rank", "1"], r"--node-rank: only the static rendezvous takes it"),
    (["--nnodes", "2", *EP, "--rdzv-backend", "static"], r"--node-rank: the static rendezvous needs this machine's rank"),
    (["--nnodes", "2", *EP, "--rdzv-backend", "static", "--node-rank", "2"], r"--node-rank: must be in \[0, 2\) "
                                                                               r"for --nnodes 2, got 2"),
    (["--nnodes", "1:2", *EP, "--rdzv-backend", "static", "--node-rank", "0"], r"--nnodes 1:2: the static "
                                                                                 r"rendezvous needs a fixed number"),
    (["--max-restarts", "-1"], r"--max-restarts: must be >= 0, got -1"),
    (["--nnodes", "2", *EP, "--rdzv-id", " "], r"--rdzv-id: must not be empty"),
])
def test_bad_launch_flags_are_one_line_before_any_process_starts(tmp_path, capsys, monkeypatch, flags, message):
    started = []
    monkeypatch.setattr(launch_mod, "launch", lambda argv, plan, run_dir=None: started.append(plan) or 0)
    code = main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "r"), "--threads", "1", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 1 and not started and not (tmp_path / "r").exists()
    assert len(err.splitlines()) == 1 and re.fullmatch(r"vitkit: error: " + message + ".*", err), err


def test_the_launch_plan_of_the_flags(tmp_path, monkeypatch):
    data = image_folder(tmp_path / "data")
    started = []
    monkeypatch.setattr(launch_mod, "launch", lambda argv, plan, run_dir=None: started.append(plan) or 0)
    base = ["train", "--data", str(data), *FAST, "--epochs", "1"]  # fixed epochs: the recipe keeps one process
    assert main([*base, "--out", str(tmp_path / "a"), "--nnodes", "2", *EP, "--rdzv-backend", "static",
                 "--node-rank", "1"]) == 0
    assert main([*base, "--out", str(tmp_path / "b"), "--nproc", "2", "--nnodes", "1:4", *EP, "--rdzv-id", "job7",
                 "--max-restarts", "3"]) == 0
    assert started == [
        launch_mod.LaunchPlan(nproc=1, min_nodes=2, max_nodes=2, node_rank=1, rdzv_endpoint="node0:29500",
                              rdzv_backend="static"),
        launch_mod.LaunchPlan(nproc=2, min_nodes=1, max_nodes=4, rdzv_endpoint="node0:29500", rdzv_id="job7",
                              max_restarts=3)]
    # torch's launch configs: a static rendezvous gets the machine's rank; one machine meets on a port the
    # system picks, under a fresh run id; restarts stay off unless asked for
    logs = launch_mod.rank_logs(str(tmp_path / "logs"), 2)
    static = launch_mod.launch_config(started[0], logs)
    assert (static.rdzv_backend, static.rdzv_endpoint, static.rdzv_configs["rank"], static.run_id) == \
        ("static", "node0:29500", 1, "vitkit")
    elastic = launch_mod.launch_config(started[1], logs)
    assert (elastic.min_nodes, elastic.max_nodes, elastic.rdzv_backend, elastic.run_id, elastic.max_restarts) == \
        (1, 4, "c10d", "job7", 3)
    one = launch_mod.launch_config(launch_mod.launch_plan(2), logs)
    assert (one.rdzv_backend, one.rdzv_endpoint, one.max_restarts, one.nproc_per_node) == ("c10d", "localhost:0", 0, 2)
    launch_mod.check_resolves("127.0.0.1:29500")
    with pytest.raises(ConfigError, match=r"--rdzv-endpoint nosuchhost.invalid:29500: no address for host "
                                          r"'nosuchhost.invalid'"):
        launch_mod.check_resolves("nosuchhost.invalid:29500")  # at once, not after torch's minutes of retries
    # one process and no restarts: no launcher at all
    assert not launch_mod.launch_plan(1).needs_launcher and launch_mod.launch_plan(1, max_restarts=1).needs_launcher


def _start_nodes(argv: list[str], node_flags: list[list[str]]) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "vitkit", *argv, *flags], env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True) for flags in node_flags]


def _finish(procs: list[subprocess.Popen], timeout: float = 150) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr); a hang past ``timeout`` kills them all and fails the test with what
    each had written, so that a hang says where it stopped."""
    def kill_all():
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # its processes die with it (they follow their launcher)
                p.wait()

    deadline = time.monotonic() + timeout
    try:
        return [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        kill_all()
        outs = [p.communicate() for p in procs]  # what each wrote before it was killed (communicate loses none)
        pytest.fail(f"no end within {timeout:g} s; what each process wrote:\n" + "\n".join(
            f"--- process {i} (exit {p.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
            for i, (p, (out, err)) in enumerate(zip(procs, outs))))
    finally:
        kill_all()


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_machines_match_one_process(tmp_path, backend):
    """Two "machines" on this one (loopback), one process each, started by the same command with
    --nnodes 2: the run equals a 1-process run with the same global batch. The static rendezvous puts
    rank 0, which reports and writes, on the machine of --node-rank 0."""
    from helpers import free_port

    data = image_folder(tmp_path / "data")
    common = ["train", "--data", str(data), *FAST, *PLAIN, "--epochs", "2", "--set", "log_every=1", "--json"]
    argv = [*common, "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--rdzv-backend", backend, "--out", str(tmp_path / "two")]
    ranks = [["--node-rank", "0"], ["--node-rank", "1"]] if backend == "static" else [[], []]
    results = _finish(_start_nodes(argv, ranks))
    summaries = [json.loads(out.strip().splitlines()[-1]) for out, _ in results if out.strip()]
    assert len(summaries) == 1 and summaries[0]["processes"] == 2 and summaries[0]["status"] == "completed", results
    if backend == "static":
        assert results[0][0].strip() and not results[1][0].strip(), results
    assert_runs_as_one_process(common, tmp_path, tmp_path / "two")
    if backend == "static":  # resumed for one more epoch, machine 1 without the run directory
        more = ["train", "--epochs", "3", "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                "--rdzv-backend", "static", "--json"]
        results = _finish(_start_nodes(more, [["--resume", str(tmp_path / "two"), "--node-rank", "0"],
                                              ["--resume", str(tmp_path / "elsewhere"), "--node-rank", "1"]]))
        assert json.loads(results[0][0].strip().splitlines()[-1])["step"] == 9, results
        assert len(step_losses(tmp_path / "two")) == 9 and not (tmp_path / "elsewhere").exists()


# A fault for the first attempt of a launched run: rank 0 dies right after its first checkpoint. Loaded
# at the start of every process whose PYTHONPATH holds it (as sitecustomize), it acts only where asked to.
FAIL_ONCE = '''
import os
if os.environ.get("FAIL_AFTER_FIRST_CHECKPOINT") and os.environ.get("RANK") == "0" \\
        and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    import vitkit.train.trainer as trainer
    real_save = trainer.save_checkpoint

    def save_then_die(run_dir, name, *a, **k):
        out = real_save(run_dir, name, *a, **k)
        if name == "last":
            os._exit(3)
        return out

    trainer.save_checkpoint = save_then_die
'''


def test_a_restarted_attempt_resumes_from_the_last_checkpoint(tmp_path):
    """--max-restarts 1: rank 0 dies after the first epoch's checkpoint, the launcher starts both
    processes again, and they continue from that checkpoint: the run ends as an uninterrupted one."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(FAIL_ONCE)
    data = image_folder(tmp_path / "data")
    common = ["train", "--data", str(data), *[a for a in FAST if a != "--quiet"], *PLAIN, "--epochs", "2",
              "--set", "log_every=1", "--set", "max_minutes=null"]
    env = dict(ENV, FAIL_AFTER_FIRST_CHECKPOINT="1", PYTHONPATH=os.pathsep.join([str(hooks), ENV["PYTHONPATH"]]))
    r = subprocess.run([sys.executable, "-m", "vitkit", *common, "--nproc", "2", "--max-restarts", "1", "--out",
                        str(tmp_path / "two")], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    assert "; from step 3" in r.stdout, r.stdout  # the second attempt resumed after epoch 1 (3 steps)
    assert_runs_as_one_process([*common, "--quiet"], tmp_path, tmp_path / "two")


def test_no_restart_unless_asked(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(FAIL_ONCE)
    data = image_folder(tmp_path / "data")
    env = dict(ENV, FAIL_AFTER_FIRST_CHECKPOINT="1", PYTHONPATH=os.pathsep.join([str(hooks), ENV["PYTHONPATH"]]))
    r = subprocess.run([sys.executable, "-m", "vitkit", "train", "--data", str(data), *FAST, "--epochs", "2",
                        "--nproc", "2", "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=180,
                       env=env)
    assert r.returncode == 3, r.stderr  # rank 0's own exit code; the run stays as it was left
    assert checkpoint_step(tmp_path / "run" / "last") == "3" and not (tmp_path / "run" / "summary.json").exists()


def test_a_rank_that_does_not_see_the_run_directory_resumes_from_rank_0(tmp_path):
    """Only rank 0 writes the run directory. A rank on another machine that does not see it (here: rank 1
    resumes from a folder that does not exist) gets the run's config and checkpoint from rank 0, and the
    run continues exactly as where every rank sees the directory."""
    import shutil

    from helpers import assert_same_weights, free_port

    data = image_folder(tmp_path / "data")
    first = tmp_path / "first"
    assert main(["train", "--data", str(data), *FAST, *PLAIN, "--epochs", "1", "--set", "log_every=1",
                 "--out", str(first)]) == 0
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    shutil.copytree(first, shared)
    shutil.copytree(first, alone)
    env = dict(ENV, WORLD_SIZE="2", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")

    def resume(dirs):
        port = str(free_port())
        procs = [subprocess.Popen([sys.executable, "-m", "vitkit", "train", "--resume", str(d), "--threads", "1",
                                   "--epochs", "2", "--quiet"], env=dict(env, RANK=str(r), LOCAL_RANK="0",
                                                                           MASTER_PORT=port),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
                 for r, d in enumerate(dirs)]
        results = _finish(procs)
        assert [p.returncode for p in procs] == [0, 0], results

    resume([shared, shared])
    resume([alone, tmp_path / "elsewhere"])
    assert not (tmp_path / "elsewhere").exists()  # rank 1 wrote nothing
    assert len(step_losses(alone)) == 6 and step_losses(alone) == step_losses(shared)
    assert_same_weights(alone, shared)
