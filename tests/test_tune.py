"""What a fine-tuning run trains (train/tune.py): the rule that picks the whole model, its last blocks or
a linear probe from the budget and the model's size, the freezing each mode does, and `vitkit finetune`
naming its choice."""

import json

import pytest
import torch
from helpers import FAST_TRAIN_ARGS as FAST
from helpers import TINY_MODEL, image_folder

import vitkit
from vitkit.cli.main import main
from vitkit.core.errors import ConfigError
from vitkit.model.variants import get_config
from vitkit.train.config import RunConfig
from vitkit.train.tune import MIN_EPOCHS, choose_tune, freeze_for, step_flops

B16 = get_config("vit_base_patch16_224")
S16 = get_config("vit_small_patch16_224")


def test_the_cost_of_a_step_follows_what_trains():
    full, last, probe = (step_flops(B16, m, 2) for m in ("full", "last", "probe"))
    assert full == pytest.approx(3 * probe) and probe < last < full
    assert last == pytest.approx(probe * (1 + 2 * 2 / 12))


@pytest.mark.parametrize("minutes, images, want", [
    (None, 10_000, "full"),  # fixed epochs: the whole model
    (120, 3_000, "full"),  # ViT-S/16 on two cores: an epoch of 3,000 images is estimated at about 33 min
    (60, 3_000, "last"),  # ... the last 2 blocks at about 15 min
    (5, 3_000, "probe"),  # ... and the head alone at about 11 min: the least there is
])
def test_the_budget_chooses_the_mode(minutes, images, want):
    mode, why = choose_tune(S16, images, minutes, threads=2, blocks=2)
    assert mode == want, why
    if minutes:
        assert f"({MIN_EPOCHS} needed)" in why


def test_a_measured_speed_replaces_the_estimate():
    """The speed measured before the run (whole-model images a second) sets each mode's epochs: at 100 img/s a
    5-minute budget on 3,000 images is 10 epochs of the whole model, where the FLOP estimate chose the probe;
    at 2 img/s it is 0.2 (and the last blocks' 0.2 x full / last), so the probe."""
    mode, why = choose_tune(S16, 3_000, 5, threads=2, blocks=2, measured=100.0)
    assert mode == "full" and why == f"the budget gives a measured full ~10.0 epochs ({MIN_EPOCHS} needed)"
    mode, why = choose_tune(S16, 3_000, 5, threads=2, blocks=2, measured=2.0)
    last = 2.0 * 300 / 3_000 * step_flops(S16, "full", 2) / step_flops(S16, "last", 2)
    assert mode == "probe" and why.startswith(f"the budget gives a measured full ~0.2, last ~{last:.1f} epochs")


def test_a_probe_chosen_by_the_budget_says_layer_decay_does_not_apply():
    from vitkit.train.tune import settle_tune

    given = dict(tune="auto", max_minutes=5, threads=1, processes=2, device="cpu")
    cfg = RunConfig.from_dict({**given, "optim": {"layer_decay": 0.75}})
    line = settle_tune(cfg, S16, 3_000)
    assert cfg.tune == "probe" and line.endswith(
        "(--tune forces one); --layer-decay does not apply: the probe trains the head alone, at the full lr")
    assert "layer-decay" not in settle_tune(RunConfig.from_dict(given), S16, 3_000)  # not given: not named
    assert "layer-decay" not in settle_tune(RunConfig.from_dict({**given, "max_minutes": 60,
                                                                  "optim": {"layer_decay": 0.75}}), S16, 3_000)


def test_a_gpu_trains_the_whole_model():
    assert choose_tune(B16, 3_000, 5, 2, 2, on_cpu=False)[0] == "full"


@pytest.mark.parametrize("mode, trained", [
    ("probe", {"head"}),
    ("last", {"head", "norm", "blocks.1"}),
    ("full", {"head", "norm", "blocks.0", "blocks.1", "patch_embed", "pos_embed", "cls_token"}),
])
def test_freezing_leaves_only_what_the_mode_trains(mode, trained):
    model = vitkit.create_model(TINY_MODEL)
    n = freeze_for(model, mode, blocks=1)
    train = {name for name, p in model.named_parameters() if p.requires_grad}
    assert {t.split(".")[0] if not t.startswith("blocks") else ".".join(t.split(".")[:2]) for t in train} == trained
    assert n == sum(p.numel() for _, p in model.named_parameters() if p.requires_grad)


def test_a_frozen_batchnorm_keeps_its_statistics():
    model = vitkit.create_model("vit_hybrid_mini_patch4_28")
    freeze_for(model, "probe", 1)
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    before = bn.running_mean.clone()
    model.train()
    model(torch.randn(4, 1, 28, 28) * 3 + 1)
    assert torch.equal(bn.running_mean, before)


def test_tune_needs_weights():
    with pytest.raises(ConfigError, match="^tune: 'probe' fine-tunes weights; it needs init_from"):
        RunConfig(tune="probe").validate()


def test_finetune_names_its_choice_and_trains_only_that(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    vitkit.save(vitkit.create_model(TINY_MODEL, num_classes=3, seed=1), ckpt)
    data = image_folder(tmp_path / "data")
    run = tmp_path / "run"
    assert main(["finetune", str(ckpt), "--data", str(data), "--epochs", "1", *FAST[2:], "--tune", "last",
                 "--tune-blocks", "1", "--out", str(run), "--json"]) == 0
    capsys.readouterr()
    assert json.loads((run / "config.json").read_text())["tune"] == "last"
    start, end = vitkit.load(ckpt), vitkit.load(run / "last")
    assert torch.equal(start.blocks[0].attn.qkv.weight, end.blocks[0].attn.qkv.weight)  # frozen
    assert not torch.equal(start.blocks[1].attn.qkv.weight, end.blocks[1].attn.qkv.weight)  # trained


def test_auto_is_settled_in_the_run_record(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    vitkit.save(vitkit.create_model(TINY_MODEL, num_classes=3), ckpt)
    data = image_folder(tmp_path / "data")
    loud = [a for a in FAST[2:] if a != "--quiet"]
    assert main(["finetune", str(ckpt), "--data", str(data), "--max-minutes", "0.05", *loud,
                 "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr()
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["tune"] in ("full", "last", "probe")
    assert f"fine-tuning {saved['tune']}: " in out.out + out.err
