"""The loggers next to metrics.jsonl: metrics.csv, TensorBoard (read back with tensorboard's own reader),
offline wandb; a resumed run continues each without duplicates; a missing package is one line."""

import csv
import json
import re
import time

import pytest
from helpers import tiny_run_config as cfg  # vit_test, 2 epochs of 4 steps (batch 8) on tiny_splits()
from helpers import tiny_splits

from vitkit.cli.main import main
from vitkit.train import train
from vitkit.train.metrics import CSV_COLUMNS, csv_row

pytestmark = pytest.mark.usefixtures("one_thread")


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def csv_rows(run):
    with open(run / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        return list(reader)


def expected_csv(run):
    """metrics.csv as metrics.jsonl says it should be: a row for each step and eval record."""
    rows = [csv_row(r) for r in records(run)]
    return [{k: str(v) for k, v in r.items()} for r in rows if r is not None]


def crash_then_resume(run, loggers, epochs=3):
    """Train, crash during step 7 (the last checkpoint is epoch 1's, at step 4: steps 5 and 6 are logged
    past it), then resume to the end."""
    def crash():
        crash.calls += 1
        if crash.calls == 7:
            raise RuntimeError("crash")
        return False

    crash.calls = 0
    c = cfg(epochs=epochs, eval_every=1, loggers=loggers)
    with pytest.raises(RuntimeError):
        train(c, run, splits=tiny_splits(), stop=crash, log=lambda m: None)
    assert [r["step"] for r in records(run) if r["type"] == "step"] == [1, 2, 3, 4, 5, 6]
    return train(c, run, resume=True, splits=tiny_splits(), log=lambda m: None)


def test_csv_holds_the_steps_and_evaluations_and_is_trimmed_on_resume(tmp_path):
    run = tmp_path / "run"
    s = crash_then_resume(run, ["csv"])
    assert s["status"] == "completed" and s["step"] == 12
    rows = csv_rows(run)
    assert rows == expected_csv(run)
    assert [r["step"] for r in rows if r["split"] == "train"] == [str(i) for i in range(1, 13)]  # each once
    assert [(r["type"], r["step"]) for r in rows if r["split"] == "val"] == [("eval", "4"), ("eval", "8"),
                                                                             ("eval", "12")]


def test_tensorboard_scalars_read_back_with_tensorboards_reader(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    crash_then_resume(run, ["tensorboard"])
    acc = EventAccumulator(str(run))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["test/acc", "test/loss", "train/acc", "train/img_per_s", "train/loss",
                                             "train/lr", "val/acc", "val/loss"]
    recs = records(run)
    steps = [r for r in recs if r["type"] == "step"]
    evals = [r for r in recs if r["type"] == "eval"]
    final = recs[-1]
    for tag, want in [("train/loss", [(r["step"], r["loss"]) for r in steps]),
                      ("train/acc", [(r["step"], r["train_acc"]) for r in steps]),
                      ("train/lr", [(r["step"], r["lr"]) for r in steps]),
                      ("val/acc", [(r["step"], r["acc"]) for r in evals]),
                      ("test/acc", [(final["step"], final["test_acc"])])]:
        got = [(e.step, e.value) for e in acc.Scalars(tag)]  # the crashed segment's steps 5, 6: purged
        assert [s for s, _ in got] == [s for s, _ in want], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), tag


def test_wandb_logs_offline_and_a_resumed_run_continues_it(tmp_path):
    pytest.importorskip("wandb")
    run = tmp_path / "run"
    train(cfg(loggers=["wandb"]), run, splits=tiny_splits(), log=lambda m: None)
    run_id = (run / "wandb-id.txt").read_text().strip()
    train(cfg(epochs=3, loggers=["wandb"]), run, resume=True, splits=tiny_splits(), log=lambda m: None)
    assert (run / "wandb-id.txt").read_text().strip() == run_id
    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))  # offline: nothing was sent anywhere
    assert len(files) == 2 and all(f.name == f"run-{run_id}.wandb" for f in files)
    # wandb's own service process writes the files: give it a moment to finish them
    deadline = time.monotonic() + 30
    while not all(b"train/loss" in f.read_bytes() and b"val/acc" in f.read_bytes() for f in files):
        assert time.monotonic() < deadline, [(f, f.stat().st_size) for f in files]
        time.sleep(0.2)


def test_loggers_are_recorded_in_the_run_config(tmp_path, capsys):
    from helpers import FAST_TRAIN_ARGS, image_folder

    data = image_folder(tmp_path / "data")
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", "--out", str(run), "--log", "csv", *FAST_TRAIN_ARGS]) == 0
    assert json.loads((run / "config.json").read_text())["loggers"] == ["csv"]
    assert csv_rows(run) == expected_csv(run)


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_a_missing_logger_package_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, nproc):
    import importlib.util

    import vitkit.train.launch as launch

    started = []
    monkeypatch.setattr(launch, "launch", lambda argv, n: started.append(n) or 0)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    code = main(["train", "--data", str(tmp_path / "nodata"), "--out", str(tmp_path / "r"), "--nproc", nproc,
                 "--threads", "1", "--log", "csv,wandb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and not started and not (tmp_path / "r").exists()
    assert err == ["vitkit: error: loggers: wandb needs the wandb package: pip install 'vitkit[wandb]'"]


def test_an_unknown_logger_is_one_line(tmp_path, capsys):
    code = main(["train", "--data", str(tmp_path), "--log", "tensorbord", "--threads", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert re.fullmatch(r"vitkit: error: config.loggers\[0\]: expected one of 'csv', 'tensorboard', 'wandb', "
                        r"got 'tensorbord'", err[0]), err
