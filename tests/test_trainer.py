"""Units of the Trainer and its parts: the EMA, the trainer state, one step, the non-finite handler, how
epochs end (steps, budget, stop), and the model's config resolved once."""

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_run_config as cfg
from helpers import TINY_RUN, tiny_splits

import vitkit
from vitkit.core.errors import ConfigError, TrainingError
from vitkit.data import AugmentConfig
from vitkit.io import checkpoint as ckpt_io
from vitkit.train import EMA, RunConfig, StepResult, Trainer, TrainerState, model_config, preflight
from vitkit.train.build import build_model, prepare_model
from vitkit.train.budget import FORWARD_AT, FORWARD_TIMINGS, RunBudget
from vitkit.train.ema import ema_decay
from vitkit.train import trainer as trainer_module
from vitkit.train.trainer import EpochEnd

pytestmark = pytest.mark.usefixtures("one_thread")
TINY_AUG = TINY_RUN["augment"]


def make_trainer(where, log=None, channels_last=False, **kw) -> Trainer:
    """A trainer on the tiny data (32 training images, batch 8: 4 steps per epoch, 2 epochs), writing
    where/run."""
    c = cfg(**kw)
    splits = tiny_splits()
    model = prepare_model(c, model_config(c), splits.classes, splits.train)
    (where / "run").mkdir(parents=True, exist_ok=True)
    return Trainer(c, model, splits.train, where / "run", val_set=splits.val, log=log or (lambda m: None),
                   channels_last=channels_last)


def first_batch(trainer):
    _, x, y = next(iter(trainer.loader.epoch(0)))
    return x, y


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


# -------------------------------------------------------------------------------------------------- EMA
def test_ema_averages_in_float32_and_swaps_in_the_model_dtype():
    model = vitkit.create_model("vit_test", seed=0, stem="conv", stem_width=8)  # BatchNorm: an int64 buffer
    ema = EMA(model, 0.9)
    expect = [t.detach().clone().float() for t in model.state_dict().values()]
    for step in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model.patch_embed.stem[1].num_batches_tracked += 1
        ema.update(model, step)
        d = ema_decay(0.9, step)
        for i, v in enumerate(model.state_dict().values()):  # each tensor: a float32 lerp, or a copy
            expect[i] = torch.lerp(expect[i], v.float(), 1.0 - d) if v.is_floating_point() else v.float()
    assert all(torch.equal(a, b) for a, b in zip(ema.shadow, expect))
    half = EMA(model.to(torch.bfloat16), 0.9)
    half.load_state_dict(ema.state_dict())
    swapped = half.averaged_copy(model)
    for (k, v), e in zip(swapped.state_dict().items(), expect):
        assert v.dtype == model.state_dict()[k].dtype and torch.equal(v, e.to(v.dtype)), k
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in ema.state_dict())


# ------------------------------------------------------------------------------------------- the state
def test_trainer_state_keys_round_trip():
    st = TrainerState(step=5, epoch=1, pos=1, seconds=2.5, wall_seconds=3.5, skipped=1, best_acc=0.75, best_step=4,
                      history=[{"type": "eval", "step": 4, "acc": 0.75}])
    d = st.to_dict()
    assert set(d) == {"version", "step", "epoch", "pos", "seconds", "wall_seconds", "skipped", "best_acc",
                      "best_step", "history"}
    assert d["version"] == 1 and isinstance(d["history"], str)
    assert TrainerState.load(d) == st
    del d["history"]  # a trainer.pt without a history resumes with an empty one
    assert TrainerState.load(d).history == []
    del d["wall_seconds"]  # nor one written before the run's whole wall-clock was kept: its train time
    assert TrainerState.load(d).wall_seconds == 2.5


def test_trainer_state_dict_restores_where_the_run_stood(tmp_path):
    a = make_trainer(tmp_path, ema=0.9)
    a.apply(a.train_step(first_batch(a)), 0)
    a.state.best_acc, a.state.history = 0.5, [{"type": "eval", "step": 1}]
    torch.save(a.state_dict(), tmp_path / "trainer.pt")
    expected_draw = torch.rand(3)
    saved = torch.load(tmp_path / "trainer.pt", weights_only=True)
    assert saved["classes"] == ["a", "b"] and saved["total_steps"] == 8 and saved["step"] == 1
    b = make_trainer(tmp_path / "b", ema=0.9)
    b.restore(saved)
    assert b.state == a.state
    assert all(torch.equal(x, y) for x, y in zip(a.ema.shadow, b.ema.shadow))
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where it was saved


def test_a_channels_last_trainer_lays_out_what_it_restores_as_its_parameters(tmp_path):
    """The conv weights train channels-last, and so do their moments and their EMA; trainer.pt holds them
    contiguous, and a restore lays them out as the parameters are, whichever layout saved them."""
    from vitkit.train.checkpoint import load_trainer_state

    kw = dict(model_args=dict(stem="conv", stem_width=8), ema=0.9)
    a = make_trainer(tmp_path / "a", channels_last=True, **kw)
    conv = lambda t: t.model.patch_embed.stem[0].weight  # noqa: E731 - the first 3x3 conv's (8, 3, 3, 3) weight
    channels_last = lambda x: x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()  # noqa: E731
    i = list(a.model.state_dict()).index("patch_embed.stem.0.weight")  # its place in the EMA
    assert channels_last(conv(a))
    a.apply(a.train_step(first_batch(a)), 0)
    assert channels_last(a.optimizer.state[conv(a)]["exp_avg"]) and channels_last(a.ema.shadow[i])
    a.save("last")
    saved = load_trainer_state(a.run_dir / "last")
    for layout in (True, False):
        b = make_trainer(tmp_path / str(layout), channels_last=layout, **kw)
        b.restore(saved)
        for t in (b.optimizer.state[conv(b)]["exp_avg"], b.ema.shadow[i]):
            assert channels_last(t) is layout and t.stride() == conv(b).stride()
        assert torch.equal(b.optimizer.state[conv(b)]["exp_avg"], a.optimizer.state[conv(a)]["exp_avg"])
        assert all(torch.equal(x, y) for x, y in zip(a.ema.shadow, b.ema.shadow))


# ------------------------------------------------------------------------------------------- one step
def test_train_step_computes_and_apply_takes_it(tmp_path):
    t = make_trainer(tmp_path)
    before = weights(t.model)
    r = t.train_step(first_batch(t))
    assert math.isfinite(r.loss) and not r.nonfinite and not r.stop
    assert r.seen == 8 and 0 <= r.correct <= 8 and r.grad_norm > 0
    assert all(torch.equal(v, before[k]) for k, v in t.model.state_dict().items())  # nothing applied yet
    t.apply(r, 0)
    assert (t.state.step, t.state.pos, t.state.skipped) == (1, 1, 0)
    assert any(not torch.equal(v, before[k]) for k, v in t.model.state_dict().items())
    assert all(p.grad is None for p in t.model.parameters())


def test_grad_checkpointing_is_set_on_the_run_model(tmp_path):
    assert not make_trainer(tmp_path / "a").model.grad_checkpointing
    assert make_trainer(tmp_path / "b", grad_checkpointing=True).model.grad_checkpointing


def test_a_nonfinite_step_is_skipped_counted_then_stops_the_run(tmp_path):
    msgs = []
    t = make_trainer(tmp_path, log=msgs.append, skip_nonfinite=1)
    before = weights(t.model)
    r = t.train_step(first_batch(t))
    bad = StepResult(loss=float("nan"), nonfinite=True, stop=False, seconds=r.seconds, seen=8)
    t.apply(bad, 0)  # within --skip-nonfinite 1: skipped, counted
    assert msgs == ["warning: non-finite loss/gradients at step 1; step skipped (1/1)"]
    assert (t.state.step, t.state.skipped) == (1, 1)
    assert all(torch.equal(v, before[k]) for k, v in t.model.state_dict().items())
    assert all(p.grad is None for p in t.model.parameters())
    with pytest.raises(TrainingError, match=r"^loss is nan at step 2 \(epoch 1\); stopped; no checkpoint had been "
                                            r"saved yet\. Lower --lr, or allow skipping with --skip-nonfinite N$"):
        t.apply(bad, 1)
    t.state.skipped = 0
    t.save("last")  # a checkpoint at step 1: the error names it
    grad = StepResult(loss=0.7, nonfinite=True, stop=False, seconds=0.0, grad_norm=float("inf"))
    t.apply(grad, 1)
    with pytest.raises(TrainingError, match=r"^gradient norm is inf at step 3 \(epoch 1\); stopped; the last good "
                                            r"checkpoint .*last \(step 1\) is kept\."):
        t.apply(grad, 2)


def test_fsdp_step_reports_the_whole_norm_and_skips_a_nonfinite_step(tmp_path):
    """Under FSDP (here a group of one) a step computes what a plain one does, the gradients' norm over
    all the shards included (a plain number); a non-finite step leaves the sharded weights as they were."""
    from vitkit.train.distributed import DistInfo, process_group
    from vitkit.train.fsdp import full_weights

    with process_group(DistInfo(), torch.device("cpu"), alone=True):
        plain, sharded = make_trainer(tmp_path / "a"), make_trainer(tmp_path / "b", strategy="fsdp", skip_nonfinite=1)
        a, b = plain.train_step(first_batch(plain)), sharded.train_step(first_batch(sharded))
        assert type(b.grad_norm) is float and (b.grad_norm, b.loss) == (a.grad_norm, a.loss)
        sharded.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            sharded.model.head.bias.fill_(float("nan"))
        before = full_weights(sharded.model, everywhere=True)
        bad = sharded.train_step(first_batch(sharded))
        assert bad.nonfinite and math.isnan(bad.loss)
        sharded.apply(bad, 0)
        assert sharded.state.skipped == 1 and all(p.grad is None for p in sharded.model.parameters())
        torch.testing.assert_close(full_weights(sharded.model, everywhere=True), before, rtol=0, atol=0, equal_nan=True)


# ----------------------------------------------------------------------------------- how epochs end
def canned_steps(t: Trainer, stop_at: int | None = None, seconds=lambda step: 0.0) -> None:
    """Replace the computed steps of ``t`` by finite ones (fast): a stop request at step ``stop_at``,
    and ``seconds(step)`` of training time after each."""

    def step(batch):
        n = t.state.step + 1
        return StepResult(loss=0.5, nonfinite=False, stop=n == stop_at, seconds=seconds(n), seen=len(batch[0]))

    t.train_step = step


def test_an_epoch_ends_at_its_end_when_the_steps_are_spent_or_on_a_stop(tmp_path):
    t = make_trainer(tmp_path)
    canned_steps(t)
    assert t.run_epoch() is EpochEnd.FINISHED and (t.state.step, t.state.pos, t.state.epoch) == (4, 4, 0)
    t.end_epoch()
    assert (t.state.epoch, t.state.pos) == (1, 0) and (t.run_dir / "last" / "trainer.pt").is_file()
    assert t.run_epoch() is EpochEnd.SPENT and (t.state.step, t.state.pos, t.state.epoch) == (8, 4, 1)
    assert t.run_epoch() is EpochEnd.FINISHED and t.state.step == 8  # nothing left in this epoch

    t = make_trainer(tmp_path / "b")
    canned_steps(t, stop_at=3)
    assert t.fit() == "interrupted" and (t.state.step, t.state.pos, t.state.epoch) == (3, 3, 0)
    canned_steps(t)
    assert t.fit() == "completed" and t.state.step == 8


def test_the_time_budget_ends_the_run(tmp_path):
    t = make_trainer(tmp_path, max_minutes=1.0)  # 60 s
    canned_steps(t, seconds=lambda step: 25.0 * step)
    assert t.fit() == "completed" and t.state.step == 3  # 75 s after step 3
    # a run resumed with its budget spent stops before any step
    t = make_trainer(tmp_path / "resumed", max_minutes=1.0)
    canned_steps(t)
    t.state.seconds = 61.0  # as restored from the run's last/
    assert t.fit() == "completed" and t.state.step == 0


def budget_steps(t: Trainer, seconds) -> None:
    """Canned steps (``canned_steps``) that carry the trainer's reserve for the run's end, as computed steps do."""
    def step(batch):
        n = t.state.step + 1
        return StepResult(loss=0.5, nonfinite=False, stop=False, seconds=seconds(n), seen=len(batch[0]),
                          reserve=t.reserve())

    t.train_step = step


def test_a_budget_stops_training_where_the_estimated_end_still_fits(tmp_path):
    t = make_trainer(tmp_path, max_minutes=1.0, tta=True)  # 60 s; validation and test at 2 views
    t.test_set = tiny_splits().test
    t.budget.forward = 0.5  # s an image-view, as a timed validation measured: the end scores (16 + 16) x 2
    t.budget.save = 0.0
    budget_steps(t, seconds=lambda step: 10.0 * step)
    assert t.fit() == "completed" and t.state.step == 2  # 32 s of end (x END_MARGIN 1.25 = 40 s) leave 20 s
    assert t.schedule.budget == pytest.approx(60 - 40, abs=0.5)  # the schedule planned for those 20 s
    # an end past the whole budget at 2 views is planned at one; the run's end scores it, with a line
    lines = []
    t = make_trainer(tmp_path / "fewer", log=lines.append, max_minutes=1.0, tta=True)
    t.test_set, t.budget.forward, t.budget.save = tiny_splits().test, 1.2, 0.0  # 2 views: 96 s; 1 view: 48 s
    budget_steps(t, seconds=lambda step: 5.0 * step)
    t.budget.add_step(0.0)
    t.budget.add_step(0.0)  # settled
    assert t.fit() == "completed" and t.state.step == 3  # 60 - 48 = 12 s: stopped at 15
    summary = t.complete(t.test_set)
    assert summary["eval_views"] == 1 and (t.tta, t.tta_shift) == (False, 0)
    # the summary says what the end was given and what it took (here no plots: the estimate is its views')
    assert summary["end_estimate_seconds"] == pytest.approx(48.0, abs=0.01) and 0 < summary["end_seconds"] < 48
    assert [line for line in lines if line.startswith("budget: ")] == [
        "budget: evaluating with 1 view rather than 2 views (flips), about 48.0 s for the 60.0 s left"]


@pytest.mark.parametrize("world", [1, 2])
def test_the_end_is_estimated_from_an_evaluation_batch_scored_as_the_end_scores_it(tmp_path, monkeypatch, world):
    # the processes score their shares of a split side by side, each in batches of the evaluation's size: an
    # image-view's wall-clock is one such batch's seconds over the images of all the processes' batches
    t = make_trainer(tmp_path, max_minutes=1.0)  # 16 validation images; evaluation batches of 64
    t.dist = replace(t.dist, world_size=world)
    clock, seen = [100.0], []
    seconds = iter([9.0, 3.0, 1.5, 1.0, 2.0, 4.0])  # a slow warm-up, then the timed batches: the machine busy at times

    def forward_takes_its_seconds(module, args):
        seen.append(args[0].shape[0])
        clock[0] += next(seconds)

    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    t.model.register_forward_pre_hook(forward_takes_its_seconds)
    t.time_forward()
    share = 16 // world  # each process scores its share of the 16 at once: fewer than a batch of 64
    assert seen == [share] * (1 + FORWARD_TIMINGS)  # a warm-up, then the timed batches
    assert t.budget.forward == pytest.approx(1.0 / (share * world))  # the fastest, 1 s for 16 image-views, on 1 or 2


def test_the_end_s_forward_is_timed_twice_and_the_faster_kept_until_a_validation_is_timed():
    # a run's first seconds may find the machine busy: an evaluation batch is timed once the steps' time is
    # settled and again once their median is (FORWARD_AT), the faster kept; a timed validation then rules
    b = RunBudget(60.0)
    b.add_step(3.0)  # the first step (its warm-up): not settled
    assert not b.wants_forward_timing()
    b.add_step(1.0)
    assert b.wants_forward_timing()
    b.timed_forward(2.0, 100)  # busy: 20 ms an image-view
    for _ in range(FORWARD_AT[1] - 2):
        b.add_step(1.0)
        assert not b.wants_forward_timing()
    b.add_step(1.0)
    assert b.wants_forward_timing()
    b.timed_forward(0.8, 100)
    assert b.forward == pytest.approx(0.008) and not b.wants_forward_timing()
    b.timed_forward(1.6, 100)  # a slower timing never raises it
    assert b.forward == pytest.approx(0.008)
    b.timed_eval(1.0, 100)  # a whole validation: its rate, slower or not, and no more batch timings
    assert b.forward == pytest.approx(0.01) and not b.wants_forward_timing()
    b.timed_forward(0.1, 100)
    assert b.forward == pytest.approx(0.01)
    fresh = RunBudget(60.0)  # a validation before any batch was timed: none is timed then
    fresh.add_step(1.0), fresh.add_step(1.0), fresh.timed_eval(1.0, 100)
    assert not fresh.wants_forward_timing() and fresh.forward == pytest.approx(0.01)


# ------------------------------------------------------------------------------ the config, once
def test_model_config_is_the_model_the_run_builds(tmp_path):
    c = cfg(img_size=48, model_args=dict(drop_path_rate=0.1, num_classes=7), seed=3)
    mcfg = model_config(c)
    assert mcfg == vitkit.get_config("vit_test", img_size=48, drop_path_rate=0.1)
    model = build_model(c, mcfg, ["a", "b"])
    assert model.cfg == mcfg.replace(num_classes=2) and model.labels == ["a", "b"]
    same = vitkit.create_model("vit_test", seed=3, img_size=48, drop_path_rate=0.1, num_classes=2)
    assert all(torch.equal(v, same.state_dict()[k]) for k, v in model.state_dict().items())  # seed -> weights
    with pytest.raises(ConfigError, match="model 'vit_nope' is not a known name"):
        model_config(cfg(model="vit_nope"))
    # init_from: the checkpoint's model, model_args laid over it, at img_size
    ckpt_io.save(vitkit.create_model("vit_test", seed=0, in_chans=1), tmp_path / "ck")
    ft = cfg(init_from=str(tmp_path / "ck"), img_size=48, model_args=dict(drop_path_rate=0.2))
    mcfg = model_config(ft)
    assert (mcfg.in_chans, mcfg.img_size, mcfg.drop_path_rate) == (1, (48, 48), 0.2)
    model = build_model(ft, mcfg, ["x", "y", "z"])
    assert model.cfg == mcfg.replace(num_classes=3) and model.pos_embed.shape == (1, 1 + 36, 32)
    with pytest.raises(ConfigError, match=r"model_args: ViTConfig: unknown field\(s\) 'depthh'"):
        model_config(cfg(init_from=str(tmp_path / "ck"), model_args=dict(depthh=3)))


def test_progressive_resizing_trains_the_first_share_of_the_run_small_then_at_the_models_size(tmp_path):
    """augment.low_size: the steps before low_share of the run's progress see low_size images, the rest the
    model's size; the model takes both (built with dynamic_img_size) and is scored at its own size."""
    aug = dict(TINY_AUG, low_size=16, low_share=0.5)
    c = cfg(augment=aug)
    assert model_config(c) == vitkit.get_config("vit_test", dynamic_img_size=True)
    t = make_trainer(tmp_path, augment=aug)  # 2 epochs of 4 steps
    sizes = []
    t.model.register_forward_pre_hook(lambda m, args: sizes.append(tuple(args[0].shape[-2:])))
    assert t.fit() == "completed"
    assert sizes == [(16, 16)] * 4 + [(32, 32)] * 4  # the 8 steps
    # bounded by the clock: the share of the time, as the schedule counts it
    t = make_trainer(tmp_path / "clock", augment=aug, max_minutes=1.0)
    sizes = []  # the training steps' (the budget also times a forward pass at the model's size)
    t.model.register_forward_pre_hook(lambda m, args: sizes.append(tuple(args[0].shape[-2:])) if m.training else None)
    for seconds in (0.0, 29.0, 30.0):
        t.state.seconds = seconds
        t.train_step(first_batch(t))
    assert sizes == [(16, 16), (16, 16), (32, 32)]
    with pytest.raises(ConfigError, match="augment.low_size: 12 is not a multiple of the model's patch size 8"):
        model_config(cfg(augment=dict(TINY_AUG, low_size=12, low_share=0.5)))
    with pytest.raises(ConfigError, match="augment.low_size: 32 is not below the model's image size 32x32"):
        model_config(cfg(augment=dict(TINY_AUG, low_size=32, low_share=0.5)))


def test_preflight_checks_the_augmentation():
    c = cfg()
    c.augment.hflip = 2.0
    with pytest.raises(ConfigError, match=r"AugmentConfig.hflip: is a probability, expected 0..1, got 2.0"):
        preflight(c)
    with pytest.raises(ConfigError, match=r"config.augment: unknown field\(s\) 'flip'"):
        RunConfig.from_dict({"augment": {"flip": 0.5}})
    # a config.json that holds some augment fields still loads; to_dict() gives them all
    old = RunConfig.from_dict({"augment": {"crop": "rrc", "hflip": 0.25}})
    assert old.augment == AugmentConfig(crop="rrc", hflip=0.25)
    assert old.to_dict()["augment"] == AugmentConfig(crop="rrc", hflip=0.25).to_dict()
    assert RunConfig().augment == AugmentConfig(crop="pad", pad=2, hflip=0.0, label_smoothing=0.1)


def test_alternating_flips_flip_each_image_once_in_two_epochs(tmp_path):
    from vitkit.data.augment import alternating_flips

    t = make_trainer(tmp_path, augment=dict(crop="none", hflip=0.5, flip_mode="alternate"))
    flipped = torch.zeros(len(t.train_set), dtype=torch.long)
    for epoch in (0, 1):
        t.state.epoch = epoch
        for pos in range(len(t.loader)):
            t.state.pos = pos
            idx = t.loader.batch_indices(epoch, pos)
            flips = t.batch_flips()
            assert torch.equal(flips, alternating_flips(t.first_flips[idx], epoch))
            flipped[idx] += flips.long()
    assert torch.equal(flipped, torch.ones_like(flipped))  # 32 images, 4 steps of 8: every image seen twice
    assert make_trainer(tmp_path / "b").batch_flips() is None  # random flips: drawn by BatchAugment


def test_a_whitening_stem_is_set_from_the_training_images(tmp_path):
    from vitkit.data import eval_batch
    from vitkit.model.layers import patch_whitening

    t = make_trainer(tmp_path, model_args=dict(stem="conv", patch_size=4, stem_width=8, stem_whiten=True))
    model = t.model
    x = eval_batch(t.train_set.images, model.cfg.img_size, model.preprocess)
    w = patch_whitening(x)
    torch.testing.assert_close(model.patch_embed.whitening.weight, torch.cat([w, -w]))
    t.fit()  # frozen: training leaves the filters as they were
    torch.testing.assert_close(model.patch_embed.whitening.weight, torch.cat([w, -w]))


def test_validation_with_tta_scores_the_mean_of_both_views(tmp_path):
    from vitkit.data import eval_batch
    from vitkit.infer.paths import model_logits
    from vitkit.train.trainer import evaluate_split

    t = make_trainer(tmp_path, tta=True)
    t.fit()
    model, val = t.model.eval(), t.val_set
    x = eval_batch(val.images, model.cfg.img_size, model.preprocess)
    with torch.no_grad():
        logits = model_logits(model, x, tta=True)
    want = torch.nn.functional.cross_entropy(logits, val.labels).item()
    r = t.validate(model)
    assert r["loss"] == pytest.approx(want, abs=1e-6)
    one_view = evaluate_split(model, val, torch.device("cpu"), tta=False)["loss"]
    assert abs(one_view - want) > 1e-6
    with torch.no_grad():
        shifted = model_logits(model, x, tta=True, shift=1)
    want = torch.nn.functional.cross_entropy(shifted, val.labels).item()
    assert evaluate_split(model, val, torch.device("cpu"), tta=True, tta_shift=1)["loss"] == pytest.approx(want, abs=1e-6)
    assert abs(r["loss"] - want) > 1e-6  # the translated views are their own result


def test_tta_shift_is_a_nonnegative_size_that_rides_on_tta():
    from vitkit.core.errors import ConfigError
    from vitkit.train.config import RunConfig

    assert RunConfig(tta=True, tta_shift=1).validate().tta_shift == 1
    assert RunConfig(tta=False, tta_shift=1).validate().tta_shift == 1  # kept, scoring nothing: --no-tta wins
    with pytest.raises(ConfigError, match=r"^tta_shift: must be >= 0 px \(0 = flips only\), got -1$"):
        RunConfig(tta=True, tta_shift=-1).validate()
