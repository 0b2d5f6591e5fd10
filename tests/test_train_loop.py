"""End-to-end training on tiny in-memory data: run directory, exact resume after SIGKILL, stops, errors."""

import copy
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from helpers import assert_same_logits, assert_same_weights, run_weights, step_losses, tiny_set, tiny_splits
from helpers import tiny_run_config as cfg  # vit_test, 2 epochs of 4 steps (batch 8) on tiny_splits()

import vitkit
from vitkit.core.errors import CheckpointError, DataError, TrainingError
from vitkit.train import RunConfig, Trainer, train
from vitkit.train import checkpoint as tck

pytestmark = pytest.mark.usefixtures("one_thread")


def test_run_directory_contents(tmp_path):
    out = tmp_path / "run"
    s = train(cfg(eval_every=1, ema=0.9, plots=True), out, splits=tiny_splits(), log=lambda m: None)
    assert s["status"] == "completed" and s["step"] == 8 and s["epochs"] == 2
    assert 0 <= s["test_acc"] <= 1 and "val_acc" in s and s["train_seconds"] > 0
    for f in ("config.json", "classes.json", "metrics.jsonl", "summary.json", "last/vitkit.safetensors",
              "last/vitkit.json", "last/trainer.pt", "best/vitkit.safetensors", "best/vitkit.json"):
        assert (out / f).is_file(), f
    assert json.loads((out / "classes.json").read_text()) == ["a", "b"]
    saved = RunConfig.from_dict(json.loads((out / "config.json").read_text()))
    assert saved.ema == 0.9 and saved.threads == torch.get_num_threads() == 1 and saved.processes == 1  # as it ran
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["type"] == "step"] == list(range(1, 9))
    assert sum(r["type"] == "eval" for r in recs) == 2 and recs[-1]["type"] == "final"
    m = vitkit.load(out)  # a run directory loads as its best checkpoint
    assert m.labels == ["a", "b"] and m.cfg.num_classes == 2 and len(m.preprocess.mean) == 3
    state = tck.load_trainer_state(out / "last")
    assert {"optimizer", "rng", "ema", "step", "epoch", "pos"} <= set(state)
    if _has_matplotlib():
        assert (out / "loss.png").is_file() and (out / "accuracy.png").is_file() and (out / "lr.png").is_file()
    # a second run into the same directory is refused; a run holding the lock too
    with pytest.raises(TrainingError, match="already holds a run .*--resume"):
        train(cfg(), out, splits=tiny_splits(), log=lambda m: None)


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_learns_the_tiny_task(tmp_path):
    s = train(cfg(epochs=8), tmp_path / "r", splits=tiny_splits(), log=lambda m: None)
    assert s["test_acc"] == 1.0  # two colour classes: trivially separable


def test_finetune_new_head_new_resolution(tmp_path):
    src = tmp_path / "src"
    train(cfg(epochs=1), src, splits=tiny_splits(), log=lambda m: None)
    three = ("x", "y", "z")
    s = train(cfg(init_from=str(src), img_size=48, epochs=1, optim=dict(name="sgd", lr=0.01, weight_decay=0.0)),
              tmp_path / "ft", splits=tiny_splits(three), log=lambda m: None)
    m = vitkit.load(tmp_path / "ft")
    assert s["status"] == "completed" and m.cfg.num_classes == 3 and m.labels == list(three)
    assert m.cfg.img_size == (48, 48) and m.pos_embed.shape == (1, 1 + 36, 32)
    assert m(torch.zeros(1, 3, 48, 48)).shape == (1, 3)


def test_finetune_from_hf_weights_reads_them_as_convert_does(tmp_path):
    from helpers import random_model

    from vitkit.io.convert import from_hf, to_hf

    to_hf(random_model(), tmp_path / "hf")  # HF's config.json tells the heads and eps
    said = []
    train(cfg(init_from=str(tmp_path / "hf"), epochs=1), tmp_path / "ft", splits=tiny_splits(), log=said.append)
    assert said[0] == f"read hf: {tmp_path / 'hf'}" and said[1].startswith("model: width 32, depth 2, heads 2")
    m, hf = vitkit.load(tmp_path / "ft"), from_hf(tmp_path / "hf")
    assert m.cfg.replace(num_classes=10) == hf.cfg and m.labels == ["a", "b"]


def test_resume_with_other_classes_is_an_error(tmp_path):
    out = tmp_path / "r"
    train(cfg(epochs=1), out, splits=tiny_splits(), log=lambda m: None)
    with pytest.raises(TrainingError, match=r"the data's classes \(x, y\) differ from the run's \(a, b\)"):
        train(cfg(epochs=2), out, resume=True, splits=tiny_splits(("x", "y")), log=lambda m: None)
    with pytest.raises(TrainingError, match="nothing to resume"):
        train(cfg(), tmp_path / "empty", resume=True, splits=tiny_splits(), log=lambda m: None)


def poison_step(monkeypatch, at_step: int):
    """Every run from here on computes a NaN loss at (1-based) step ``at_step``, as a diverging run would."""
    real = Trainer.train_step

    def poisoned(self, batch):
        result = real(self, batch)
        if self.state.step + 1 == at_step:
            return dataclasses.replace(result, loss=float("nan"), nonfinite=True)
        return result

    monkeypatch.setattr(Trainer, "train_step", poisoned)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "r"
    poison_step(monkeypatch, 6)  # the 6th training step sees a NaN
    with pytest.raises(TrainingError, match=r"loss is nan at step 6 \(epoch 2\); stopped; the last good checkpoint "
                                            r".*last \(step 4\) is kept"):
        train(cfg(epochs=3), out, splits=tiny_splits(), log=lambda m: None)
    assert tck.load_trainer_state(out / "last")["step"] == 4
    assert not (out / ".lock").exists()
    # with --skip-nonfinite 1 the same run goes on
    msgs = []
    s = train(cfg(epochs=3, skip_nonfinite=1), tmp_path / "r2", splits=tiny_splits(), log=msgs.append)
    assert s["status"] == "completed" and tck.load_trainer_state(tmp_path / "r2" / "last")["skipped"] == 1
    assert "warning: non-finite loss/gradients at step 6; step skipped (1/1)" in msgs


def test_plots_are_refreshed_at_each_evaluation_and_written_on_a_stop(tmp_path):
    plots = ("loss.png", "accuracy.png", "lr.png")
    out = tmp_path / "run"
    seen = []

    def stop():  # polled once a step; step 5 is the first after the validation that ends epoch 1
        seen.append(all((out / p).is_file() for p in plots))
        return len(seen) == 6

    s = train(cfg(epochs=3, eval_every=1, plots=True), out, splits=tiny_splits(), stop=stop, log=lambda m: None)
    assert s["status"] == "interrupted" and seen == [False] * 4 + [True] * 2
    out = tmp_path / "stopped"  # stopped before any validation: the stop writes them
    s = train(cfg(plots=True), out, splits=tiny_splits(), stop=lambda: True, log=lambda m: None)
    assert s["status"] == "interrupted" and all((out / p).is_file() for p in plots)


@pytest.mark.parametrize("spent_at, lines", [(4, ["epoch 1: val"]), (6, ["epoch 1: val", "epoch 1.50: val"])])
def test_a_run_the_clock_ends_validates_once_and_says_how_far_it_got(tmp_path, monkeypatch, spent_at, lines):
    # the clock runs out at an epoch's end (step 4, after that epoch's validation: not validated again)
    # or half way through the second epoch (step 6): the end's line names the epochs trained
    from vitkit.train.schedule import Schedule

    monkeypatch.setattr(Schedule, "done", lambda self, step, seconds: step >= spent_at)
    said = []
    s = train(cfg(eval_every=1, epochs=3), tmp_path / "run", splits=tiny_splits(), log=said.append)
    assert s["status"] == "completed" and s["step"] == spent_at
    assert [m.split(" val loss")[0] for m in said if " val loss" in m] == [line[:-4] for line in lines]
    recs = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if r["type"] == "eval"]
    val = evals[-1]
    assert len(evals) == len(lines) and s["val_acc"] == val["acc"] and s["val_loss"] == val["loss"] and val["step"] == spent_at


def test_plots_of_a_run_with_no_logged_step_draw_without_warnings(tmp_path):
    pytest.importorskip("matplotlib")
    from vitkit.train.metrics import write_plots

    (tmp_path / "metrics.jsonl").write_text('{"type": "final", "status": "completed"}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's "No artists with labels found to put in legend"
        assert write_plots(tmp_path) is None
    assert all((tmp_path / p).is_file() for p in ("loss.png", "accuracy.png", "lr.png"))


def test_stop_request_saves_and_resumes_exactly(tmp_path):
    ref = tmp_path / "ref"
    train(cfg(epochs=3, ckpt_every=0), ref, splits=tiny_splits(), log=lambda m: None)
    out = tmp_path / "run"
    n = {"k": 0}

    def stop():  # Ctrl-C arrives during step 5 (mid-epoch)
        n["k"] += 1
        return n["k"] == 5

    msgs = []
    s = train(cfg(epochs=3), out, splits=tiny_splits(), stop=stop, log=msgs.append)
    assert s["status"] == "interrupted" and s["step"] == 5
    assert any(f"continue with: vitkit train --resume {out}" in m for m in msgs)
    train(cfg(epochs=3), out, resume=True, splits=tiny_splits(), log=lambda m: None)
    assert_same_weights(ref, out)



# ------------------------------------------------------------------------- runs bounded by the clock, replayed
CLOCKED = dict(max_minutes=1.0, epochs=10, eval_every=1, ema=0.9, ckpt_every=0)  # 60 s; 4 steps an epoch


def clock_by_steps(monkeypatch, seconds):
    """Trainer.elapsed reads ``seconds(step)`` rather than the wall clock: a run whose clock ends it at a known
    step, and whose learning rates depend on that clock."""
    monkeypatch.setattr(Trainer, "elapsed", lambda self: seconds(self.state.step))


def lrs(run) -> list[float]:
    return [json.loads(line)["lr"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["type"] == "step"]


@pytest.mark.parametrize("seconds, end", [(lambda s: 4.5 * s + s % 3, (14, 3, 2)),  # half way through epoch 4
                                          (lambda s: 5.0 * s, (12, 3, 0))])  # after epoch 3's validation
def test_a_run_bounded_by_the_clock_replays_bit_for_bit(tmp_path, monkeypatch, seconds, end):
    """The replay follows the steps the clock gave the run, whatever its own clock says: the same learning
    rates, data, EMA and validations, the same end, the same weights."""
    from helpers import same_files, timeless_records

    from vitkit.train.checkpoint import load_trainer_state
    from vitkit.train.schedule import Schedule

    first, again = tmp_path / "first", tmp_path / "again"
    with monkeypatch.context() as m:
        clock_by_steps(m, seconds)
        s = train(cfg(**CLOCKED), first, splits=tiny_splits(), log=lambda m: None)
    saved = load_trainer_state(first / "last")
    assert (s["step"], saved["epoch"], saved["pos"]) == end  # the clock ended it, before its 40 steps
    said = []
    r = train(cfg(**CLOCKED, replay=str(first)), again, splits=tiny_splits(), log=said.append)
    assert f"replays the {end[0]} steps of {first}" in next(m for m in said if m.startswith("training "))
    assert r["step"] == end[0] and r["epochs"] == s["epochs"]
    assert timeless_records(again) == timeless_records(first)
    assert same_files(first, again, "last") and same_files(first, again, "best")
    # the learning rates are the clock's, not the steps' alone: each at the share of the training time the
    # run recorded, at least the share of the 60-s budget its clock read (the budget keeps time for the end)
    shares = load_trainer_state(again / "last")["clock"].tolist()
    assert shares == load_trainer_state(first / "last")["clock"].tolist() and len(shares) == end[0]
    assert all(share >= seconds(k) / 60.0 for k, share in enumerate(shares))
    sched = Schedule(cfg().schedule, 3e-3, 40, 60.0)
    assert lrs(again) == lrs(first) == [sched.lr(k, share=share) for k, share in enumerate(shares)]
    assert lrs(first) != [Schedule(cfg().schedule, 3e-3, 40).lr(k) for k in range(end[0])]


def test_a_clock_bounded_run_stopped_or_resumed_replays_what_it_did(tmp_path, monkeypatch):
    """Stopped (Ctrl-C) at step 5: the replay takes those 5 steps and ends there as a finished run. Resumed
    on its clock to step 14: the replay takes the 14 steps of both segments. A replay stopped and resumed
    ends as an uninterrupted one."""
    from helpers import same_files, timeless_records

    run, stopped = tmp_path / "run", tmp_path / "stopped"
    polls = itertools.count(1)
    with monkeypatch.context() as m:
        clock_by_steps(m, lambda s: 4.5 * s + s % 3)
        s = train(cfg(**CLOCKED), run, splits=tiny_splits(), stop=lambda: next(polls) == 5, log=lambda m: None)
        assert s["status"] == "interrupted" and s["step"] == 5
        r = train(cfg(**CLOCKED, replay=str(run)), stopped, splits=tiny_splits(), log=lambda m: None)
        assert r["status"] == "completed" and r["step"] == 5
        assert same_files(run, stopped, "last")  # the weights the stop saved
        steps = timeless_records(run)
        assert timeless_records(stopped)[:len(steps)] == steps  # then the final validation and record
        assert train(cfg(**CLOCKED), run, resume=True, splits=tiny_splits(), log=lambda m: None)["step"] == 14
    again, halted = tmp_path / "again", tmp_path / "halted"
    train(cfg(**CLOCKED, replay=str(run)), again, splits=tiny_splits(), log=lambda m: None)
    assert timeless_records(again) == timeless_records(run) and same_files(run, again, "last")
    polls = itertools.count(1)
    s = train(cfg(**CLOCKED, replay=str(run)), halted, splits=tiny_splits(), stop=lambda: next(polls) == 9,
              log=lambda m: None)
    assert s["status"] == "interrupted" and s["step"] == 9
    s = train(cfg(**CLOCKED, replay=str(run)), halted, resume=True, splits=tiny_splits(), log=lambda m: None)
    assert s["step"] == 14 and same_files(run, halted, "last") and same_files(run, halted, "best")
    assert timeless_records(halted) == timeless_records(run)


def test_a_replay_of_steps_that_are_not_there_or_do_not_fit_is_one_line(tmp_path):
    from vitkit.core.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^replay: {tmp_path / 'nowhere'} records no steps to replay "
                                          r"\(no last/ checkpoint with its schedule\)$"):
        train(cfg(**CLOCKED, replay=str(tmp_path / "nowhere")), tmp_path / "a", splits=tiny_splits(), log=None)
    assert not (tmp_path / "a").exists()
    run = tmp_path / "run"
    polls = itertools.count(1)
    train(cfg(**CLOCKED), run, splits=tiny_splits(), stop=lambda: next(polls) == 5, log=None)  # epochs of 4 steps
    with pytest.raises(ConfigError, match=f"^replay: the 5 steps of {run} ended at step 1 of epoch 2, which epochs "
                                          "of 2 steps do not give; replay it on its data and batch size, or give "
                                          "--max-minutes to train bounded by the clock$"):
        train(cfg(**CLOCKED, batch_size=16, replay=str(run)), tmp_path / "b", splits=tiny_splits(), log=None)


def test_a_resumed_runs_total_time_holds_every_segment_as_its_train_time_does(tmp_path):
    """A second before the first segment's training (outside its train time): the resumed run's total
    counts it, as its train time counts the first segment's training; the total is never below it."""
    import time

    def slow(message):  # the line a run says before it trains
        if message.startswith("training "):
            time.sleep(1.0)

    out = tmp_path / "run"
    first = train(cfg(), out, splits=tiny_splits(), log=slow)
    assert first["total_seconds"] >= first["train_seconds"] + 1.0
    second = train(cfg(epochs=3), out, resume=True, splits=tiny_splits(), log=lambda m: None)
    assert second["total_seconds"] >= second["train_seconds"] + 1.0
    assert second["train_seconds"] > first["train_seconds"]


def test_a_run_whose_checkpoints_predate_vitkit_json_resumes_exactly(tmp_path):
    """last/ as written before vitkit.json (config.json + model.safetensors): --resume reads it, the run ends
    as an uninterrupted one, and its next save writes the new names."""
    ref = tmp_path / "ref"
    train(cfg(epochs=3, ckpt_every=0), ref, splits=tiny_splits(), log=lambda m: None)
    out = tmp_path / "run"
    n = {"k": 0}

    def stop():
        n["k"] += 1
        return n["k"] == 5

    assert train(cfg(epochs=3), out, splits=tiny_splits(), stop=stop, log=lambda m: None)["status"] == "interrupted"
    for ckpt in (out / "last", out / "best"):
        if ckpt.is_dir():
            (ckpt / "vitkit.json").rename(ckpt / "config.json")
            (ckpt / "vitkit.safetensors").rename(ckpt / "model.safetensors")
    assert vitkit.load(out).cfg == vitkit.load(ref).cfg
    train(cfg(epochs=3), out, resume=True, splits=tiny_splits(), log=lambda m: None)
    assert sorted(os.listdir(out / "last")) == ["trainer.pt", "vitkit.json", "vitkit.safetensors"]
    assert_same_weights(ref, out)


def test_resume_of_a_finetune_from_timm_weights_does_not_read_them(tmp_path):
    from helpers import random_model

    from vitkit.io.timm import save_timm

    weights = tmp_path / "vit.safetensors"
    save_timm(random_model(), weights)
    ft = lambda: cfg(init_from=str(weights), model_args=dict(num_heads=2), epochs=3)  # noqa: E731
    ref = tmp_path / "ref"
    train(ft(), ref, splits=tiny_splits(), log=lambda m: None)
    out = tmp_path / "run"
    n = {"k": 0}

    def stop():
        n["k"] += 1
        return n["k"] == 5

    assert train(ft(), out, splits=tiny_splits(), stop=stop, log=lambda m: None)["status"] == "interrupted"
    weights.rename(tmp_path / "moved.safetensors")  # the checkpoint holds the model: the weights are not needed
    train(ft(), out, resume=True, splits=tiny_splits(), log=lambda m: None)
    assert step_losses(out) == step_losses(ref)
    assert_same_weights(ref, out)

DRIVER = textwrap.dedent('''
    import os, signal, sys, torch
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
    from helpers import tiny_run_config as cfg, tiny_splits
    import vitkit.train.trainer as trainer
    from vitkit.train import train
    if sys.argv[3] == "kill":
        real = trainer.save_checkpoint
        def save_then_die(run_dir, name, *a, **k):
            out = real(run_dir, name, *a, **k)
            if name == "last":
                os.kill(os.getpid(), signal.SIGKILL)  # right after the first checkpoint
            return out
        trainer.save_checkpoint = save_then_die
    train(cfg(epochs=3, ckpt_every=3, model_args=dict(drop_rate=0.1, drop_path_rate=0.1)), sys.argv[2],
          resume=sys.argv[3] == "resume", splits=tiny_splits(), log=lambda m: None)
''')


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    here = os.path.abspath(__file__)
    src = os.path.join(os.path.dirname(here), "..", "src")  # the tree under test, not an installed copy
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), src]))

    def go(out, mode):
        return subprocess.run([sys.executable, str(driver), here, str(out), mode], env=env, capture_output=True,
                              text=True, timeout=120)

    ref, out = tmp_path / "ref", tmp_path / "run"
    p = go(out, "kill")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert tck.load_trainer_state(out / "last")["step"] == 3 and (out / ".lock").exists()  # stale lock left
    p = go(out, "resume")  # the stale lock of the dead process is taken over
    assert p.returncode == 0, p.stderr
    train(cfg(epochs=3, ckpt_every=3, model_args=dict(drop_rate=0.1, drop_path_rate=0.1)), ref,
          splits=tiny_splits(), log=lambda m: None)  # uninterrupted, in this process (also one thread)
    assert_same_weights(ref, out)
    sa, sb = tck.load_trainer_state(ref / "last"), tck.load_trainer_state(out / "last")
    assert sa["step"] == sb["step"] == 12
    assert step_losses(ref) == step_losses(out)  # the log has no gap or duplicate either


def test_disk_full_while_saving_is_one_line_and_keeps_previous(tmp_path, monkeypatch):
    import errno

    out = tmp_path / "r"
    real = tck._write_trainer_state
    n = {"k": 0}

    def flaky(state, path):
        n["k"] += 1
        if n["k"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(state, path)

    monkeypatch.setattr(tck, "_write_trainer_state", flaky)
    with pytest.raises(CheckpointError, match=r"could not save checkpoint .*last: no space left on device; the "
                                              r"previous checkpoint .*last is intact"):
        train(cfg(epochs=3), out, splits=tiny_splits(), log=lambda m: None)
    assert tck.load_trainer_state(out / "last")["step"] == 4


# a whitening conv stem (the small-data recipe's: a frozen 2x2 filter bank set from the images, a 3x3
# stride-2 conv, one 3x3 conv at the grid, BatchNorm) with an EMA: the layouts a channels-last run changes
WHITEN_STEM = dict(model_args=dict(stem="conv", patch_size=4, stem_width=8, stem_convs=1, stem_whiten=True), ema=0.9)


def test_a_channels_last_run_trains_as_a_contiguous_one(tmp_path):
    """Only the convolutions' order of sums differs: over 8 steps the losses agree to 1e-5 (they printed
    equal to the 5 decimals of metrics.jsonl) and the weights to 2e-5 (measured 8e-6), but for the
    attention's key biases (qkv.bias), which get no gradient in exact arithmetic: AdamW scales their
    rounding noise up to steps of lr (3e-3); they differed by 1.6e-4."""
    runs = {layout: tmp_path / layout for layout in ("channels_last", "contiguous")}
    for layout, run in runs.items():
        s = train(cfg(**WHITEN_STEM, channels_last=layout == "channels_last"), run, splits=tiny_splits(),
                  log=lambda m: None)
        assert s["fast_path"] == ("fp32, eager, channels_last" if layout == "channels_last" else "fp32, eager")
    a, b = (torch.tensor(step_losses(run)) for run in runs.values())
    assert len(a) == len(b) == 8 and (a - b).abs().max() < 1e-5, (a, b)
    wa, wb = run_weights(runs["channels_last"]), run_weights(runs["contiguous"])
    gap = {k: (wa[k] - wb[k]).abs().max().item() for k in wa}
    key_bias = {k: gap.pop(k) for k in list(gap) if k.endswith("attn.qkv.bias")}
    assert key_bias and max(key_bias.values()) < 1e-3, key_bias
    assert max(gap.values()) < 2e-5, gap


def test_a_channels_last_run_writes_contiguous_checkpoints_that_load_both_ways(tmp_path):
    out = tmp_path / "run"
    said = []
    train(cfg(**WHITEN_STEM), out, splits=tiny_splits(), log=said.append)  # auto: a conv stem on the CPU
    assert said[1].startswith("path: fp32, eager, channels_last (channels_last: a conv stem measured")
    saved = tck.load_trainer_state(out / "last")
    moments = [t for state in saved["optimizer"]["state"].values() for t in state.values() if t.ndim == 4]
    assert moments and all(t.is_contiguous() for t in moments + saved["ema"])
    for name in ("last", "best"):
        assert all(t.is_contiguous() for t in run_weights(out, name).values())
    model = vitkit.load(out)  # an ordinary model, whose logits a channels-last copy of it repeats
    assert all(p.is_contiguous() for p in model.parameters())
    assert_same_logits(copy.deepcopy(model).to(memory_format=torch.channels_last), model, tol=1e-5)
    # resumed the other way round: a channels-last run continued contiguous, and the other way
    s = train(cfg(**WHITEN_STEM, epochs=3, channels_last=False), out, resume=True, splits=tiny_splits(),
              log=lambda m: None)
    assert s["step"] == 12 and s["fast_path"] == "fp32, eager"
    from vitkit.core.hardware import cpu_capability  # the machine beside the figures: CPU, kernels, torch

    assert s["machine"].startswith("cpu: ") and f" {cpu_capability()} " in s["machine"]
    assert s["machine"].endswith(f"; torch {torch.__version__}")
    plain = tmp_path / "plain"
    train(cfg(**WHITEN_STEM, channels_last=False), plain, splits=tiny_splits(), log=lambda m: None)
    s = train(cfg(**WHITEN_STEM, epochs=3), plain, resume=True, splits=tiny_splits(), log=lambda m: None)
    assert s["step"] == 12 and s["fast_path"].startswith("fp32, eager, channels_last")


def test_a_channels_last_run_stopped_and_resumed_ends_as_an_uninterrupted_one(tmp_path):
    run = lambda: cfg(**WHITEN_STEM, epochs=3, channels_last=True)  # noqa: E731
    ref, out = tmp_path / "ref", tmp_path / "run"
    train(run(), ref, splits=tiny_splits(), log=lambda m: None)
    polls = itertools.count(1)
    s = train(run(), out, splits=tiny_splits(), stop=lambda: next(polls) == 5, log=lambda m: None)
    assert s["status"] == "interrupted" and s["step"] == 5  # mid-epoch: the moments and the EMA laid out again
    train(run(), out, resume=True, splits=tiny_splits(), log=lambda m: None)
    assert step_losses(out) == step_losses(ref)
    assert_same_weights(ref, out)
    best_ref, best_out = run_weights(ref, "best"), run_weights(out, "best")  # the EMA's weights
    assert all(torch.equal(best_out[k], v) for k, v in best_ref.items())


def test_bad_data_errors(tmp_path):
    with pytest.raises(DataError, match="training set: 4 images is fewer than one batch of 8"):
        sp = tiny_splits()
        sp.train = tiny_set(4)
        train(cfg(), tmp_path / "a", splits=sp, log=lambda m: None)
    with pytest.raises(DataError, match="found 1 class; a classifier needs at least 2"):
        train(cfg(), tmp_path / "b", splits=tiny_splits(("only",)), log=lambda m: None)


@pytest.mark.slow
def test_demo_command_reaches_its_accuracy(tmp_path):
    """`vitkit train` with no arguments: >= 98.5% on the 2,000 test digits within 5 minutes (2 cores)."""
    import subprocess
    import sys
    import time

    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "vitkit", "train", "--out", str(tmp_path / "demo"), "--json", "--quiet"],
                       capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["test_acc"] >= 0.985, s
    assert wall < 300, (wall, s)
