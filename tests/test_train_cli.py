"""`vitkit train` / `vitkit finetune` on a tiny image folder: flags, config files, JSON, errors."""

import json

import pytest

from vitkit.cli import main

from helpers import FAST_TRAIN_ARGS as FAST
from helpers import image_folder as make_folder


def last_json(capsys):
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1]), out


def test_train_json_and_finetune(tmp_path, capsys):
    data = make_folder(tmp_path / "data")
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "2", "--out", str(run), "--json", *FAST,
                 "optim.weight_decay=0.01"]) == 0
    s, lines = last_json(capsys)
    assert s["status"] == "completed" and s["run_dir"] == str(run) and 0 <= s["test_acc"] <= 1
    assert "train_seconds" in s and "val_acc" not in s  # a train/ + test/ folder: no val split by default
    assert lines[-2].startswith("test accuracy")
    saved = json.loads((run / "config.json").read_text())
    assert saved["optim"]["weight_decay"] == 0.01 and saved["model"] == "vit_test" and saved["epochs"] == 2

    # a second run on the same directory: refused in one line
    assert main(["train", "--data", str(data), "--out", str(run), *FAST]) == 1
    assert "vitkit: error:" in capsys.readouterr().err

    # resume after the end: nothing left to do, same weights; more epochs extend the run
    assert main(["train", "--resume", str(run), "--epochs", "3", "--json", *FAST]) == 0
    s, _ = last_json(capsys)
    assert s["step"] == 9  # 24 training images / 8 = 3 steps per epoch

    # fine-tune the run's model on 3 new classes at a higher resolution
    new = make_folder(tmp_path / "new", classes=("a", "b", "c"))
    ft = tmp_path / "ft"
    assert main(["finetune", str(run), "--data", str(new), "--img-size", "48", "--epochs", "1", "--out", str(ft),
                 "--json", "--threads", "1", "--quiet", "--batch-size", "8", "--set", "plots=false"]) == 0
    s, _ = last_json(capsys)
    cfg = json.loads((ft / "config.json").read_text())
    assert cfg["optim"]["name"] == "sgd" and cfg["optim"]["weight_decay"] == 0.0 and cfg["img_size"] == 48
    import vitkit

    m = vitkit.load(ft)
    assert m.labels == ["a", "b", "c"] and m.cfg.img_size == (48, 48)


@pytest.mark.parametrize("argv, message", [
    (["--set", "optim.lrr=1"], r"config.optim: unknown field\(s\) 'lrr'"),
    (["epochs=ten"], r"config.epochs: expected an integer, got 'ten'"),
    (["--model", "vit_nope"], r"model 'vit_nope' is not a known name"),
    (["--precision", "fp16", "--device", "cpu"], r"precision: 'fp16' needs a CUDA device"),
    (["stray"], r"unexpected argument 'stray': overrides are KEY=VALUE"),
])
def test_config_errors_are_one_line(tmp_path, capsys, argv, message):
    import re

    assert main(["train", "--out", str(tmp_path / "r"), "--threads", "1", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("vitkit: error: ") and re.search(message, err), err


def test_data_errors_are_one_line(tmp_path, capsys):
    cases = []
    cases.append((tmp_path / "missing", "no such"))
    (tmp_path / "empty").mkdir()
    cases.append((tmp_path / "empty", "empty"))
    few = make_folder(tmp_path / "few", n=1, test=1)
    cases.append((few / "train", "validation split needs at least 2 per class"))
    bad = make_folder(tmp_path / "bad", n=12, test=2)
    for f in (bad / "train" / "cat").iterdir():
        f.write_bytes(b"not an image")
    cases.append((bad, "cat"))
    for path, message in cases:
        code = main(["train", "--data", str(path), "--out", str(tmp_path / f"r-{path.name}"), *FAST,
                     "data.val_fraction=0.1"])
        err = capsys.readouterr().err.strip()
        assert code == 1 and len(err.splitlines()) == 1 and err.startswith("vitkit: error: "), (path, err)
        assert message in err.lower() or message in err, err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--epochs", "x"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["finetune"])
    assert e.value.code == 2


def test_plain_folder_gets_a_validation_split(tmp_path, capsys):
    data = make_folder(tmp_path / "data", n=20)
    assert main(["train", "--data", str(data / "train"), "--epochs", "1", "--out", str(tmp_path / "r"), "--json",
                 *FAST]) == 0
    s, lines = last_json(capsys)
    assert "val_acc" in s and "test_acc" not in s  # 10% of each class held out (2 of 20)
    assert any("held out for validation" in l for l in lines) is False  # --quiet: no progress lines


def test_sigterm_saves_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    import os
    import signal

    import vitkit.train.trainer as trainer

    data = make_folder(tmp_path / "data")
    real = trainer.save_checkpoint
    sent = []

    def save_then_term(run_dir, name, *a, **k):
        out = real(run_dir, name, *a, **k)
        if name == "last" and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)  # the handler of `vitkit train` turns it into a clean stop
        return out

    monkeypatch.setattr(trainer, "save_checkpoint", save_then_term)
    run = tmp_path / "run"
    code = main(["train", "--data", str(data), "--epochs", "50", "--ckpt-every", "2", "--out", str(run), "--json",
                 *[a for a in FAST if a != "--quiet"]])
    out = capsys.readouterr().out
    assert code == 130
    assert f"stopped at step 3 (epoch 1); saved {run / 'last'}; continue with: vitkit train --resume {run}" in out
    assert json.loads(out.strip().splitlines()[-1])["status"] == "interrupted"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is removed again


@pytest.mark.parametrize("override, message", [
    ("augment.flip=0.5", r"config.augment: unknown field\(s\) 'flip'"),
    ("augment.hflip=2", r"AugmentConfig.hflip: is a probability, expected 0..1, got 2"),
])
def test_a_bad_augment_key_is_one_error_before_any_process_starts(tmp_path, capsys, monkeypatch, override, message):
    import re

    import vitkit.commands.launch as launch

    started = []
    monkeypatch.setattr(launch, "launch", lambda argv, n: started.append(n) or 0)
    code = main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "r"), "--nproc", "2", "--threads", "1",
                 "--set", override])
    err = capsys.readouterr().err.strip()
    assert code == 1 and not started
    assert len(err.splitlines()) == 1 and err.startswith("vitkit: error: ") and re.search(message, err), err
