"""`vitkit train --nproc N`: vitkit starts the N DDP processes itself (as torchrun would)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from vitkit.cli import main
from vitkit.commands import launch as launch_mod
from vitkit.commands.train import check_processes
from vitkit.errors import ConfigError

from helpers import FAST_TRAIN_ARGS as FAST
from helpers import image_folder, step_losses

# no augmentation, no label smoothing: the 2-process run then follows the 1-process run (same global batch)
PLAIN = ["--set", "augment.crop=none", "--set", "augment.label_smoothing=0", "--set", "augment.hflip=0"]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "src"),
                                                  os.environ.get("PYTHONPATH", "")]))


def vitkit(*argv, timeout=180, **kw):
    return subprocess.run([sys.executable, "-m", "vitkit", *argv], capture_output=True, text=True,
                          timeout=timeout, env=ENV, **kw)


def test_two_launched_processes_match_one(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    common = ["train", "--data", str(data), *FAST, *PLAIN, "--epochs", "2", "--set", "log_every=1", "--json"]
    r = vitkit(*common, "--nproc", "2", "--out", str(tmp_path / "two"))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["processes"] == 2 and summary["status"] == "completed"
    assert json.loads((tmp_path / "two" / "config.json").read_text())["processes"] == 2
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    one, two = step_losses(tmp_path / "one"), step_losses(tmp_path / "two")
    assert len(one) == len(two) == 6
    # the same global batch of 8 split 4 + 4; only the order of floating-point sums differs
    assert torch.allclose(torch.tensor(one), torch.tensor(two), rtol=1e-4, atol=1e-5), (one, two)
    a = load_file(tmp_path / "one" / "last" / "model.safetensors")
    b = load_file(tmp_path / "two" / "last" / "model.safetensors")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k


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
        while not (run / "last" / "model.safetensors").exists():  # a first epoch saved
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


def test_a_failing_rank_is_reported_with_its_output(tmp_path, capsys):
    logs = [None, open(tmp_path / "log", "w+b")]
    logs[1].write(b"Traceback (most recent call last):\nRuntimeError: boom\n")
    assert launch_mod.report_exit([0, 3], logs, 2) == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "vitkit: error: process 1 of 2 failed (exit code 3)"
    assert err[-1] == "  [rank 1] RuntimeError: boom"
    logs[1].close()


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
