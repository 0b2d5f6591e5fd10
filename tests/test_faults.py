"""Faults during training, for real: SIGKILL at many moments (inside every stage of a checkpoint write,
mid-step, and at spread wall-clock times), SIGINT/SIGTERM, a second Ctrl-C during the save, a full
disk (a real small tmpfs), a locked run directory, a NaN loss.

One driver process (``python DRIVER``, torch imported once) forks a child per fault; the child runs
``vitkit train`` through ``vitkit.cli.main`` and is stopped by a real signal at the chosen moment. The
tests then check, per fault, that the surviving checkpoint loads with ``vitkit.load`` and that
``vitkit train --resume`` ends with weights equal (``torch.equal``) to an uninterrupted run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import assert_same_weights, image_folder

import vitkit
from vitkit.cli.main import main
from vitkit.train import checkpoint as tck

ARGS = ["--model", "vit_test", "--epochs", "2", "--batch-size", "8", "--ckpt-every", "2", "--threads", "1",
        "--device", "cpu", "--precision", "fp32", "--set", "plots=false", "--set", "log_every=1",
        "--set", "model_args.drop_path_rate=0.1", "--set", "max_minutes=null", "--set", "data.val_fraction=0"]  # no wall-clock budget: exact resume
TOTAL_STEPS = 8  # 32 images / 8 per step x 2 epochs

# name -> (event, n): the child is SIGKILLed at the n-th occurrence of the event. The n-th checkpoint
# save of the run is numbered from 1 (the first save is at step 2, the second at step 4).
KILLS = {  # name -> (event, n, the step of the checkpoint that must survive; None: none was saved yet)
    "mid-step-3": ("step", 3, 2),  # in the forward/backward of step 3: no write in progress
    "run-config-half-written": ("run-config", 1, None),  # the run's config.json, at the start
    "first-save-weights-half-written": ("weights", 1, None),  # inside the very first checkpoint write
    "weights-half-written": ("weights", 2, 2),  # vitkit.safetensors of the 2nd save half written
    "weights-written-not-renamed": ("weights-fsynced", 2, 2),  # written and fsynced, before its rename
    "config-half-written": ("config", 2, 2),  # the checkpoint's vitkit.json half written
    "trainer-state-half-written": ("trainer", 2, 2),  # trainer.pt half written
    "before-swap": ("swap-old", 1, 2),  # the new checkpoint complete under its temporary name
    "between-renames": ("swap-old-done", 1, 2),  # last -> .last.old done; temporary -> last not yet
    "after-swap": ("swap-new-done", 2, 4),  # the new last/ in place, .last.old not yet removed
}
TIMED = [0.25, 0.5, 0.75]  # SIGKILL from outside at these fractions of an uninterrupted run's duration

DRIVER = textwrap.dedent(r'''
    import json, os, signal, sys, time, shutil, subprocess
    import torch
    torch.set_num_threads(1)
    import vitkit.cli.main, vitkit.train.trainer as trainer, vitkit.train.checkpoint as tck, vitkit.io.checkpoint as cio
    from vitkit.io.atomic import atomic_path
    # import now what a run imports lazily (torch._dynamo through the first optimizer: seconds), so that
    # each forked child starts warm; no torch computation happens in this process (fork-safe)
    import torch._dynamo, safetensors.torch, vitkit.data, vitkit.model.variants, vitkit.train.optim, vitkit.cli.commands.train
    from PIL import Image, PngImagePlugin
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])

    data, work, args, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    report = {}

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def install(event, n, run, log):
        """Hooks that count events and act on the n-th one."""
        count = {}

        def hit(e):
            count[e] = count.get(e, 0) + 1
            return e == event and count[e] == n

        real_save = trainer.save_checkpoint
        def save(run_dir, name, *a, **k):
            out = real_save(run_dir, name, *a, **k)
            if name == "last":
                with open(log, "a") as f:
                    f.write(json.dumps(json.loads((out / "vitkit.json").read_text())["train"]["step"]) + "\n")
                if event == "fill-disk" and hit("fill-disk"):
                    fill_disk()
            return out
        trainer.save_checkpoint = save

        real_mb = trainer.micro_batches
        def micro_batches(*a, **k):
            if hit("step"):
                die()
            if event in ("sigint", "sigterm") and hit(event):
                os.kill(os.getpid(), signal.SIGINT if event == "sigint" else signal.SIGTERM)
            if event == "double-sigint" and hit(event):
                os.kill(os.getpid(), signal.SIGINT)
                state["armed"] = True
            return real_mb(*a, **k)
        trainer.micro_batches = micro_batches
        state = {"armed": False}

        real_bytes = cio.atomic_write_bytes
        def write_bytes(target, blob):
            if state["armed"]:  # a second Ctrl-C while the interrupt's checkpoint is being written
                state["armed"] = False
                with atomic_path(target) as tmp:
                    with open(tmp, "wb") as f:
                        f.write(blob[: len(blob) // 2])
                    os.kill(os.getpid(), signal.SIGINT)
            if str(target).endswith("vitkit.safetensors"):
                if hit("weights"):
                    with atomic_path(target) as tmp:
                        with open(tmp, "wb") as f:
                            f.write(blob[: len(blob) // 2])
                            f.flush()
                        die()
                if event == "weights-fsynced" and hit("weights-fsynced"):
                    with atomic_path(target) as tmp:
                        with open(tmp, "wb") as f:
                            f.write(blob)
                            f.flush()
                            os.fsync(f.fileno())
                        die()
            return real_bytes(target, blob)
        cio.atomic_write_bytes = write_bytes

        real_text = cio.atomic_write_text
        def write_text(target, text):
            if hit("config"):
                with atomic_path(target) as tmp:
                    with open(tmp, "w") as f:
                        f.write(text[: len(text) // 2])
                        f.flush()
                    die()
            return real_text(target, text)
        cio.atomic_write_text = write_text

        def fill_disk():
            # unbuffered: a write that finds the disk full leaves nothing behind for close() to flush
            with open(os.path.join(run, "..", "filler"), "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass

        real_json = trainer.write_json
        def write_json(path, obj):
            if str(path).endswith("config.json") and hit("run-config"):
                with atomic_path(path) as tmp:
                    with open(tmp, "w") as f:
                        f.write(json.dumps(obj)[:50])
                    die()
            out = real_json(path, obj)
            if str(path).endswith("classes.json") and event == "fill-disk-start":
                fill_disk()  # before the first step: the training log is the first file to grow
            return out
        trainer.write_json = write_json

        real_state = tck._write_trainer_state
        def write_state(st, path):
            if hit("trainer"):
                with atomic_path(path) as tmp:
                    torch.save(st, tmp)
                    with open(tmp, "r+b") as f:
                        f.truncate(os.path.getsize(tmp) // 2)
                    die()
            return real_state(st, path)
        tck._write_trainer_state = write_state

        real_replace = os.replace
        def replace(src, dst):
            s, d = os.path.basename(str(src)), os.path.basename(str(dst))
            if s == "last" and d == ".last.old" and hit("swap-old"):
                die()
            real_replace(src, dst)
            if s == "last" and d == ".last.old" and hit("swap-old-done"):
                die()
            if d == "last" and s.startswith(".last.") and s.endswith(".tmp") and os.path.isdir(dst):
                if hit("swap-new-done"):
                    die()
        tck.os.replace = replace

    def child(name, run, argv, event=None, n=0, log=None):
        pid = os.fork()
        if pid == 0:
            code = 99
            try:  # output and the save log beside the work folder (never on the small disk)
                out = os.open(os.path.join(work, name + ".out"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(out, 1)
                os.dup2(out, 2)
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                if event:
                    install(event, n, run, log)
                code = vitkit.cli.main.main(argv)
            except SystemExit as e:
                code = e.code
            except BaseException:
                import traceback
                traceback.print_exc()  # the test sees it in the output (and fails: no traceback is allowed)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        return pid

    def wait(pid):
        _, status = os.waitpid(pid, 0)
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def go(name, event=None, n=0, extra=(), out_dir=None):
        run = os.path.join(out_dir or work, name)
        log = os.path.join(work, name + ".saves")
        open(log, "w").close()
        t = time.perf_counter()
        rc = wait(child(name, run, ["train", "--data", data, "--out", run, *args, *extra], event, n, log))
        report[name] = {"rc": rc, "seconds": time.perf_counter() - t, "run": run,
                        "output": open(os.path.join(work, name + ".out")).read(),
                        "saves": [int(l) for l in open(log) if l.strip()]}

    go("reference", "none")
    for name, (event, n, _) in plan["kills"].items():
        go(name, event, n)
    for name in ("sigint", "sigterm", "double-sigint"):
        go(name, name, 3)
    # SIGKILL from outside at spread times (whatever the run is doing then)
    ref_s = report["reference"]["seconds"]
    for frac in plan["timed"]:
        name = f"timed-{frac}"
        run = os.path.join(work, name)
        open(run + ".saves", "w").close()
        open(run + ".out", "w").close()  # a kill may land before the child opens its own
        pid = child(name, run, ["train", "--data", data, "--out", run, *args], "none", 0, run + ".saves")
        time.sleep(frac * ref_s)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        report[name] = {"rc": wait(pid), "run": run, "output": open(run + ".out").read(),
                        "saves": [int(l) for l in open(run + ".saves") if l.strip()]}
    # a full disk: a small tmpfs in a private mount namespace, filled up after the first checkpoint
    if plan["tmpfs"]:
        disk = os.path.join(work, "disk")
        os.makedirs(disk)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", disk]).returncode == 0:
            for name, event in (("disk-full", "fill-disk"), ("disk-full-at-start", "fill-disk-start")):
                go(name, event, 1, out_dir=disk)
                r = report[name]
                r["leftovers"] = sorted(os.listdir(r["run"]))
                os.remove(os.path.join(disk, "filler"))
                shutil.copytree(r["run"], os.path.join(work, name), symlinks=True)
                r["run"] = os.path.join(work, name)
    json.dump(report, open(os.path.join(work, "report.json"), "w"))
''')


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """Run every fault once (in one driver process); return its report, keyed by fault name."""
    work = tmp_path_factory.mktemp("faults")
    # train/ (16 images per class) and test/ (2 per class): a held-out part, so no validation split is carved
    data = image_folder(work / "data", ("dark", "light"), n=16, test=2)
    driver = work / "driver.py"
    driver.write_text(DRIVER)
    plan = {"kills": KILLS, "timed": TIMED, "tmpfs": False}
    cmd = [sys.executable, str(driver), str(data), str(work), json.dumps(ARGS), None]
    # the full-disk case mounts a small tmpfs: possible inside a private mount namespace (unshare -m)
    if shutil.which("unshare") and subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0:
        plan["tmpfs"] = True
        cmd = ["unshare", "-m"] + cmd
    elif shutil.which("unshare") and subprocess.run(["unshare", "-r", "-m", "true"], capture_output=True).returncode == 0:
        plan["tmpfs"] = True
        cmd = ["unshare", "-r", "-m"] + cmd
    cmd[-1] = json.dumps(plan)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads((work / "report.json").read_text())
    # what the run directory looked like right after the kill between the two renames (tests resume it later)
    shutil.copytree(report["between-renames"]["run"], work / "between-renames-snapshot", symlinks=True)
    report["_data"] = str(data)
    report["_tmpfs"] = plan["tmpfs"]
    return report


def resume(run, capsys, *extra) -> tuple[int, str, str]:
    rc = main(["train", "--resume", str(run), "--threads", "1", "--quiet", *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def test_reference_run_completes(faults):
    r = faults["reference"]
    assert r["rc"] == 0, r["output"]
    assert tck.load_trainer_state(Path(r["run"]) / "last")["step"] == TOTAL_STEPS
    assert r["saves"][0] == 2 and r["saves"][-1] == TOTAL_STEPS


def _survivor_and_resume(faults, name, capsys):
    """The checks every SIGKILLed run must pass; returns the step of the surviving checkpoint (or None)."""
    r = faults[name]
    run = Path(r["run"])
    ck = tck.find_checkpoint(run, "last")
    if ck is None:  # killed before its first checkpoint: nothing to resume, said in one line
        assert r["saves"] == [], r
        rc, out, err = resume(run, capsys)
        assert rc == 1 and err.count("\n") == 1 and err.startswith("vitkit: error: "), err
        assert re.search(re.escape(str(run)) + r".*(nothing to resume|no config\.json there)", err), err
        # the run directory can be used again from scratch (the dead process's lock is stale)
        rc = main(["train", "--data", faults["_data"], "--out", str(run / "again"), *ARGS, "--quiet"])
        capsys.readouterr()
        assert rc == 0
        assert_same_weights(run / "again", faults["reference"]["run"])
        return None
    m = vitkit.load(ck)  # the surviving checkpoint is a complete, loadable model
    assert m.labels == ["dark", "light"]
    step = tck.load_trainer_state(ck)["step"]
    assert step in r["saves"] or step > max(r["saves"], default=0), (step, r["saves"])
    rc, out, err = resume(run, capsys)
    assert rc == 0, err
    assert tck.load_trainer_state(run / "last")["step"] == TOTAL_STEPS
    assert_same_weights(run, faults["reference"]["run"])
    assert not list(run.glob(".*.tmp")) and not (run / ".last.old").exists()
    return step


@pytest.mark.parametrize("name", list(KILLS))
def test_sigkill_at_a_chosen_moment(faults, name, capsys):
    r = faults[name]
    assert r["rc"] == -9, r["output"][-2000:]
    assert _survivor_and_resume(faults, name, capsys) == KILLS[name][2]


@pytest.mark.parametrize("frac", TIMED)
def test_sigkill_at_spread_times(faults, frac, capsys):
    name = f"timed-{frac}"
    r = faults[name]
    assert r["rc"] in (-9, 0), r["output"][-2000:]
    if r["rc"] == 0:  # the run ended before the kill: it must equal the reference
        assert_same_weights(r["run"], faults["reference"]["run"])
    else:
        _survivor_and_resume(faults, name, capsys)


def test_run_directory_loads_while_only_the_previous_checkpoint_exists(faults):
    """Killed between the two renames of the swap: `vitkit.load(RUN_DIR)` still finds the checkpoint."""
    copy = Path(faults["between-renames"]["run"]).parent / "between-renames-snapshot"
    assert not (copy / "last").exists() and (copy / ".last.old").is_dir()
    m = vitkit.load(copy)
    assert m.labels == ["dark", "light"]


@pytest.mark.parametrize("sig", ["sigint", "sigterm"])
def test_sigint_sigterm_save_and_say_how_to_resume(faults, sig, capsys):
    r = faults[sig]
    run = Path(r["run"])
    assert r["rc"] == 130, r["output"]
    assert f"continue with: vitkit train --resume {run}" in r["output"]
    assert "Traceback" not in r["output"]
    assert tck.load_trainer_state(run / "last")["step"] == 3  # saved at the step the signal arrived in
    vitkit.load(run / "last")
    rc, out, err = resume(run, capsys)
    assert rc == 0, err
    assert_same_weights(run, faults["reference"]["run"])


def test_second_ctrl_c_during_the_save_keeps_the_previous_checkpoint(faults, capsys):
    r = faults["double-sigint"]
    run = Path(r["run"])
    assert r["rc"] == 130, r["output"]
    assert r["output"].strip().splitlines()[-1] == "vitkit: interrupted"
    assert "Traceback" not in r["output"]
    assert tck.load_trainer_state(run / "last")["step"] == 2  # the save at step 3 was abandoned, cleanly
    assert not list(run.glob(".*.tmp")) and not list((run / "last").glob(".*.tmp"))
    rc, out, err = resume(run, capsys)
    assert rc == 0, err
    assert_same_weights(run, faults["reference"]["run"])


def test_full_disk_while_saving(faults, capsys):
    if not faults["_tmpfs"]:
        pytest.skip("cannot mount a small tmpfs here (no private mount namespace)")
    r = faults["disk-full"]
    run = Path(r["run"])
    err = [line for line in r["output"].splitlines() if line.startswith("vitkit")]
    assert r["rc"] == 1, r["output"]
    assert "Traceback" not in r["output"] and len(err) == 1, r["output"]
    assert re.fullmatch(r"vitkit: error: could not save checkpoint .*/last: .*no space left on device.*; the "
                        r"previous checkpoint .*/last is intact", err[0]), err[0]
    assert not [f for f in r["leftovers"] if f.endswith(".tmp")], r["leftovers"]
    assert tck.load_trainer_state(run / "last")["step"] == 2
    vitkit.load(run / "last")
    rc, out, err = resume(run, capsys)  # space again: the run goes on and ends where it would have
    assert rc == 0, err
    assert_same_weights(run, faults["reference"]["run"])


def test_full_disk_before_the_first_checkpoint(faults, capsys):
    """The disk fills up before the first step: the training log is the first write to fail."""
    if not faults["_tmpfs"]:
        pytest.skip("cannot mount a small tmpfs here (no private mount namespace)")
    r = faults["disk-full-at-start"]
    run = Path(r["run"])
    err = [line for line in r["output"].splitlines() if line.startswith("vitkit")]
    assert r["rc"] == 1 and "Traceback" not in r["output"] and len(err) == 1, r["output"]
    assert re.fullmatch(r"vitkit: error: .*/metrics\.jsonl: could not write the training log \(no space left on "
                        r"device\)", err[0]), err[0]
    assert ".lock" not in r["leftovers"] and not [f for f in r["leftovers"] if f.endswith(".tmp")], r["leftovers"]
    rc, out, err = resume(run, capsys)  # nothing was saved: said in one line
    assert rc == 1 and "nothing to resume" in err and err.count("\n") == 1, err


def test_second_run_on_a_run_directory_in_use_is_refused(faults, tmp_path, capsys):
    run = tmp_path / "busy"
    run.mkdir()
    import socket

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / ".lock").write_text(f"{socket.gethostname()} {holder.pid}\n")
        for argv in (["train", "--data", faults["_data"], "--out", str(run), *ARGS, "--quiet"],
                     ["train", "--resume", str(faults["reference"]["run"]), "--threads", "1", "--quiet"]):
            if "--resume" in argv:
                ref_lock = Path(faults["reference"]["run"]) / ".lock"
                ref_lock.write_text(f"{socket.gethostname()} {holder.pid}\n")
            rc = main(argv)
            err = capsys.readouterr().err.splitlines()
            assert rc == 1 and len(err) == 1, err
            assert re.search(rf"run directory is in use by process {holder.pid} .*lock file", err[0]), err[0]
    finally:
        holder.kill()
        holder.wait()
        (Path(faults["reference"]["run"]) / ".lock").unlink(missing_ok=True)
    # (a lock whose process is gone is stale and taken over: every --resume above after a SIGKILL does so)


def test_nonfinite_loss_through_the_cli(faults, tmp_path, capsys, monkeypatch):
    """A NaN loss at step 5 stops the run naming the step and keeping the last good checkpoint (step 4);
    --skip-nonfinite 1 lets the same run finish."""
    import dataclasses

    from vitkit.train import Trainer

    real = Trainer.train_step

    def poisoned(self, batch):  # step 5 computes a NaN loss, as a diverging run would
        result = real(self, batch)
        return dataclasses.replace(result, loss=float("nan"), nonfinite=True) if self.state.step == 4 else result

    monkeypatch.setattr(Trainer, "train_step", poisoned)
    argv = ["train", "--data", faults["_data"], *ARGS, "--quiet", "--set", "augment.label_smoothing=0"]
    rc = main([*argv, "--out", str(tmp_path / "nan")])
    err = capsys.readouterr().err.splitlines()
    assert rc == 1 and len(err) == 1, err
    assert re.fullmatch(r"vitkit: error: loss is nan at step 5 \(epoch 2\); stopped; the last good checkpoint "
                        r".*/last \(step 4\) is kept\. .*--skip-nonfinite N", err[0]), err[0]
    assert tck.load_trainer_state(tmp_path / "nan" / "last")["step"] == 4
    rc = main([*argv, "--out", str(tmp_path / "skip"), "--skip-nonfinite", "1"])
    capsys.readouterr()
    assert rc == 0 and tck.load_trainer_state(tmp_path / "skip" / "last")["skipped"] == 1
