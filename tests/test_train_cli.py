"""`vitkit train` / `vitkit finetune` on a tiny image folder: flags, config files, JSON, errors."""

import json

import pytest
from helpers import FAST_TRAIN_ARGS as FAST
from helpers import image_folder as make_folder
from helpers import step_losses
from helpers import timeless_records as records

from vitkit.cli.main import main


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


def test_train_fsdp_then_resume_without_it(tmp_path, capsys):
    """--strategy fsdp in one process; its checkpoint is an ordinary one, which a run without FSDP resumes."""
    import vitkit

    data = make_folder(tmp_path / "data")
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", "--out", str(run), "--strategy", "fsdp", "--ema", "0.9",
                 "--json", *FAST]) == 0
    s, _ = last_json(capsys)
    assert s["status"] == "completed" and json.loads((run / "config.json").read_text())["strategy"] == "fsdp"
    assert main(["train", "--resume", str(run), "--epochs", "2", "--strategy", "ddp", "--json", *FAST]) == 0
    s, _ = last_json(capsys)
    assert s["step"] == 6 and json.loads((run / "config.json").read_text())["strategy"] == "ddp"
    assert vitkit.load(run).labels == ["cat", "dog"]


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
        code = main(["train", "--data", str(path), "--out", str(tmp_path / f"r-{path.name}"), "--nproc", "1", *FAST,
                     "data.val_fraction=0.1"])  # one process, so that its error reaches capsys
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

    import vitkit.train.launch as launch

    started = []
    monkeypatch.setattr(launch, "launch", lambda argv, n: started.append(n) or 0)
    code = main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "r"), "--nproc", "2", "--threads", "1",
                 "--set", override])
    err = capsys.readouterr().err.strip()
    assert code == 1 and not started
    assert len(err.splitlines()) == 1 and err.startswith("vitkit: error: ") and re.search(message, err), err


# ------------------------------------------------------------------------------- pretrained weights in one step
# finetune flags for a tiny run of 8 logged steps: no --model here (finetune's --model names foreign weights)
FT = ["--epochs", "2", "--batch-size", "8", "--threads", "1", "--device", "cpu", "--precision", "fp32",
      "--set", "plots=false", "--set", "log_every=1"]


def test_finetune_from_timm_weights_equals_convert_then_finetune(tmp_path, capsys):
    from helpers import assert_same_weights, random_model, step_losses

    from vitkit.io.timm import save_timm

    data = make_folder(tmp_path / "data", classes=("a", "b", "c"))
    weights = tmp_path / "vit.safetensors"
    save_timm(random_model(), weights)  # vit_test in timm's layout: width 32, so the heads are not visible

    one = tmp_path / "one"
    assert main(["finetune", str(weights), "--data", str(data), "--out", str(one), "--set", "model_args.num_heads=2",
                 *FT]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "fine-tuning full: the whole model; a run of fixed epochs trains the whole model (--tune forces one)"
    assert out[1:4] == [
        f"read timm: {weights}",
        "model: width 32, depth 2, heads 2, patch 8, image 32x32, classes 10, pool token, 0.02M parameters",
        "not in the weights, assumed: norm_eps=1e-06, act=gelu, global_pool=token (change with --model NAME or "
        "--set model_args.KEY=VALUE)",
    ]
    assert json.loads((one / "config.json").read_text())["init_from"] == str(weights)

    ckpt = tmp_path / "ckpt"
    assert main(["convert", str(weights), str(ckpt), "--from", "timm", "--set", "num_heads=2"]) == 0
    two = tmp_path / "two"
    assert main(["finetune", str(ckpt), "--data", str(data), "--out", str(two), "--quiet", *FT]) == 0
    assert len(step_losses(one)) == 8 and step_losses(one) == step_losses(two)
    assert_same_weights(one, two)

    # a named model supplies what the weights do not show; a vitkit checkpoint needs none
    capsys.readouterr()
    assert main(["finetune", str(weights), "--model", "vit_test", "--data", str(data), "--out", str(tmp_path / "n"),
                 "--epochs", "1", *FT[2:]]) == 0
    assert "not in the weights" not in capsys.readouterr().out
    assert main(["finetune", str(ckpt), "--model", "vit_test", "--data", str(data), "--out", str(tmp_path / "x"),
                 *FT]) == 1
    assert "init_model: " in capsys.readouterr().err


def test_finetune_names_an_unknown_container(tmp_path, capsys):
    data = make_folder(tmp_path / "data")
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    assert main(["finetune", str(tmp_path / "model.onnx"), "--data", str(data), "--out", str(tmp_path / "r"), *FT]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"vitkit: error: {tmp_path / 'model.onnx'}: not a weights container vitkit knows; expected a vitkit "
                   "checkpoint or run directory (vitkit.json beside vitkit.safetensors), an HF model directory "
                   "(config.json with model_type 'vit'), a JAX .npz file, a timm .pth, .pt, .bin or .safetensors file")


# ------------------------------------------------------------------------------------------- replayable runs
def test_a_run_replayed_from_its_config_gives_the_same_metrics(tmp_path, capsys):
    from helpers import assert_same_weights

    data = make_folder(tmp_path / "data")
    first = tmp_path / "first"
    assert main(["train", "--data", str(data), "--epochs", "2", "--out", str(first), *FAST,
                 "--set", "log_every=1", "--set", "eval_every=1", "--set", "data.val_fraction=0.2"]) == 0
    saved = json.loads((first / "config.json").read_text())
    assert saved["threads"] == 1 and saved["processes"] == 1  # what it ran with, resolved

    again = tmp_path / "again"
    assert main(["train", "--config", str(first), "--out", str(again), "--quiet"]) == 0
    assert json.loads((again / "config.json").read_text()) == saved
    assert len(records(first)) == 8 and records(again) == records(first)  # 4 steps, 2 epochs, 2 validations
    assert_same_weights(first, again)

    # flags override the replayed config, whether it is named by its directory or its file
    third = tmp_path / "third"
    assert main(["train", "--config", str(first / "config.json"), "--out", str(third), "--epochs", "1", "--quiet"]) == 0
    assert records(third)[0]["loss"] == records(first)[0]["loss"]  # the same start, on a shorter schedule
    assert json.loads((third / "config.json").read_text()) == dict(saved, epochs=1)
    # a checkpoint's vitkit.json is not a run's
    assert main(["train", "--config", str(first / "best" / "vitkit.json"), "--out", str(tmp_path / "x")]) == 1
    assert "is a checkpoint's config, not a run's" in capsys.readouterr().err


def test_a_run_bounded_by_the_clock_replayed_from_its_directory_takes_its_steps(tmp_path, capsys, monkeypatch):
    """`--config RUN` of a run the clock ended (here a clock that reads 7 s a step: 9 steps in its 60 s) takes
    RUN's 9 steps on the schedule RUN followed, whatever the time now, and says so first."""
    from helpers import same_files, tiny_run_config

    from vitkit.train import Trainer, train

    data = make_folder(tmp_path / "data")
    first, again = tmp_path / "first", tmp_path / "again"
    with monkeypatch.context() as m:
        m.setattr(Trainer, "elapsed", lambda self: 7.0 * self.state.step)
        run = tiny_run_config(max_minutes=1.0, epochs=20, threads=1, eval_every=1, channels_last=False,
                              data=dict(path=str(data), val_fraction=0.2))
        assert train(run, first)["step"] == 9
    capsys.readouterr()
    assert main(["train", "--config", str(first), "--out", str(again)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("training vit_test ") and out[1].endswith(f"; replays the 9 steps of {first}")
    saved = json.loads((first / "config.json").read_text())
    assert json.loads((again / "config.json").read_text()) == dict(saved, replay=str(first))
    assert records(again) == records(first)
    assert same_files(first, again, "last") and same_files(first, again, "best")
    # named by its config.json, the same
    by_file = tmp_path / "by-file"
    assert main(["train", "--config", str(first / "config.json"), "--out", str(by_file), "--quiet"]) == 0
    assert json.loads((by_file / "config.json").read_text())["replay"] == str(first)
    assert same_files(first, by_file, "last")
    # a replay replayed: the same steps again, and its config names the replay it follows
    third = tmp_path / "third"
    assert main(["train", "--config", str(again), "--out", str(third), "--quiet"]) == 0
    assert json.loads((third / "config.json").read_text())["replay"] == str(again)
    assert records(third) == records(first) and same_files(first, third, "last")


# ------------------------------------------------------------------------------------------- familiar flags
def test_timm_style_flags_set_their_config_keys(tmp_path, capsys):
    from vitkit.cli.commands.train import flags_from_args, overrides_from_args
    from vitkit.cli.main import parse_args
    from vitkit.train.config import resolve_config

    args = parse_args(["train", "--img-size", "48", "--weight-decay", "0.01", "--drop-path", "0.1", "--smoothing",
                       "0.2", "--mixup", "0.8", "--cutmix", "1.0", "--workers", "2", "--threads", "3"])
    cfg = resolve_config(None, flags_from_args(args), overrides_from_args(args))
    assert (cfg.img_size, cfg.optim.weight_decay, cfg.model_args["drop_path_rate"], cfg.augment.label_smoothing,
            cfg.augment.mixup_alpha, cfg.augment.cutmix_alpha, cfg.data.workers, cfg.threads) == \
        (48, 0.01, 0.1, 0.2, 0.8, 1.0, 2, 3)
    # a flag and an override of the same key: neither silently wins
    assert main(["train", "--weight-decay", "0.1", "--set", "optim.weight_decay=0.2", "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("vitkit: error: override 'optim.weight_decay=0.2': optim.weight_decay is also given by a flag; "
                   "give one of the two")


@pytest.mark.parametrize("flag, key", [("sync-bn", "sync_bn"), ("channels-last", "channels_last")])
def test_on_off_flags_set_their_key_and_their_absence_leaves_it_automatic(flag, key):
    from vitkit.cli.commands.train import flags_from_args, overrides_from_args
    from vitkit.cli.main import parse_args
    from vitkit.train.config import resolve_config

    for flags, expected in (([], None), ([f"--{flag}"], True), ([f"--no-{flag}"], False)):
        args = parse_args(["train", *flags])
        assert getattr(resolve_config(None, flags_from_args(args), overrides_from_args(args)), key) is expected


def test_grad_checkpointing_flag_reaches_the_run_and_keeps_its_losses(tmp_path, capsys):
    data = make_folder(tmp_path / "data")
    runs = {}
    for name, flag in (("plain", []), ("ckpt", ["--grad-checkpointing"])):
        runs[name] = tmp_path / name  # drop-path on: the checkpointed blocks replay its random draws
        assert main(["train", "--data", str(data), "--epochs", "1", "--drop-path", "0.2", "--out", str(runs[name]),
                     *FAST, "log_every=1", *flag]) == 0
    saved = {k: json.loads((run / "config.json").read_text())["grad_checkpointing"] for k, run in runs.items()}
    assert saved == {"plain": False, "ckpt": True}
    plain, ckpt = step_losses(runs["plain"]), step_losses(runs["ckpt"])
    assert len(plain) == len(ckpt) > 1 and plain == pytest.approx(ckpt, abs=1e-6)


def test_the_last_line_says_which_weights_each_accuracy_is_of():
    from vitkit.cli.commands.train import accuracy_parts

    ended_best = {"val_acc": 0.65, "best_val_acc": 0.65, "test_acc": 0.7}
    assert accuracy_parts(ended_best) == ["test accuracy 70.00%", "val accuracy 65.00%"]
    earlier = {"val_acc": 0.6, "best_val_acc": 0.65, "test_acc": 0.7, "test_acc_final": 0.68}
    assert accuracy_parts(earlier) == ["test accuracy 70.00% (best/; the final weights 68.00%)",
                                       "val accuracy 60.00% (the final weights; best/ 65.00%)"]
    assert accuracy_parts({"val_acc": 0.6, "best_val_acc": 0.65}) == [
        "val accuracy 60.00% (the final weights; best/ 65.00%)"]


def test_a_run_records_the_validation_share_it_held_out(tmp_path, capsys):
    """A class folder with neither a validation nor a test part: 10% held out, and config.json says so (a
    replay of its config carves the same images)."""
    from vitkit.tools.evaluate import evaluate

    data = make_folder(tmp_path / "data", n=10) / "train"  # cat/ and dog/ alone
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", "--out", str(run), "--json", *FAST]) == 0
    s, _ = last_json(capsys)
    assert json.loads((run / "config.json").read_text())["data"]["val_fraction"] == 0.1
    assert main(["train", "--config", str(run), "--out", str(tmp_path / "again"), "--json", *FAST]) == 0
    again, _ = last_json(capsys)
    assert again["val_acc"] == s["val_acc"] and again["val_loss"] == s["val_loss"]
    assert evaluate(run)["scored"] == "the run's validation carve (seed 0, 10% of the training images): all 2 images"
