"""The final model's BatchNorm statistics, re-estimated on training images as they are evaluated."""

import json

import torch
from helpers import tiny_run_config, tiny_set, tiny_splits

import vitkit
from vitkit.data import eval_batch
from vitkit.io import checkpoint as ckpt_io
from vitkit.train import train
from vitkit.train.precise_bn import batchnorms, recalibrate_bn
from vitkit.train.tune import freeze_for

CONV = dict(stem="conv", stem_width=8, patch_size=4)  # a conv stem: BatchNorm layers


def _bn_inputs(model, x):
    """The input of each BatchNorm layer for the batch ``x`` when every BatchNorm normalises with its batch."""
    seen = []
    hooks = [m.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone())) for m in batchnorms(model)]
    model.eval()
    for m in batchnorms(model):
        m.train()
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return seen


def test_the_statistics_are_those_of_the_training_images_as_evaluated():
    model = vitkit.create_model("vit_test", num_classes=2, seed=0, **CONV)
    images = tiny_set(24)
    for m in batchnorms(model):  # statistics far from the data's, as after training on other crops
        m.running_mean.fill_(3.0)
        m.running_var.fill_(9.0)
    model.eval()
    used = recalibrate_bn(model, images, torch.device("cpu"), count=24, batch_size=64)
    assert used == 24 and not any(m.training for m in model.modules())  # its mode restored
    x = eval_batch(images.images, model.cfg.img_size, model.preprocess)
    probe = vitkit.create_model("vit_test", num_classes=2, seed=0, **CONV)
    probe.load_state_dict(model.state_dict())
    for m, inp in zip(batchnorms(model), _bn_inputs(probe, x)):
        dims = [0, *range(2, inp.dim())]
        torch.testing.assert_close(m.running_mean, inp.mean(dims), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(m.running_var, inp.var(dims, unbiased=True), atol=1e-4, rtol=1e-4)
        assert m.momentum == 0.1  # restored


def test_a_model_without_batchnorm_or_a_frozen_stem_is_left_alone():
    plain = vitkit.create_model("vit_test", num_classes=2, seed=0)
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    assert recalibrate_bn(plain, tiny_set(8), torch.device("cpu")) == 0
    assert all(torch.equal(before[k], v) for k, v in plain.state_dict().items())
    frozen = vitkit.create_model("vit_test", num_classes=2, seed=0, **CONV)
    freeze_for(frozen, "probe", 1)  # a linear probe keeps the stem's statistics as they were trained
    stats = [m.running_mean.clone() for m in frozen.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert stats and recalibrate_bn(frozen, tiny_set(8), torch.device("cpu")) == 0
    after = [m.running_mean for m in frozen.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert all(torch.equal(a, b) for a, b in zip(stats, after))


RRC = dict(crop="rrc", rrc_scale=[0.35, 1.0], hflip=0.5)


def test_a_run_saves_and_scores_the_recalibrated_model(tmp_path):
    cfg = tiny_run_config(model_args=CONV, ema=0.9, epochs=1, augment=RRC)  # auto: on after random resized crops
    summary = train(cfg, tmp_path / "run", splits=tiny_splits(("a", "b")), log=lambda m: None)
    best = ckpt_io.load(tmp_path / "run")
    redo = ckpt_io.load(tmp_path / "run")
    recalibrate_bn(redo, tiny_splits(("a", "b")).train, torch.device("cpu"), seed=cfg.seed)
    for a, b in zip(batchnorms(best), batchnorms(redo)):  # best/ holds statistics already re-estimated
        torch.testing.assert_close(a.running_mean, b.running_mean, atol=1e-6, rtol=1e-6)
    assert summary["val_acc"] == summary["best_val_acc"]
    for name, over in {"off": dict(bn_recalibrate=False, augment=RRC), "padded": {}}.items():
        # off, or auto after padded crops (no change of scale: measured to lose there): the statistics as trained
        off = train(tiny_run_config(model_args=CONV, ema=0.9, epochs=1, **over), tmp_path / name,
                    splits=tiny_splits(("a", "b")), log=lambda m: None)
        kept, again = ckpt_io.load(tmp_path / name), ckpt_io.load(tmp_path / name)
        recalibrate_bn(again, tiny_splits(("a", "b")).train, torch.device("cpu"), seed=cfg.seed)
        assert any(not torch.allclose(a.running_mean, b.running_mean, atol=1e-4)
                   for a, b in zip(batchnorms(kept), batchnorms(again)))  # best/ was not re-estimated
        assert off["status"] == "completed"
    assert json.loads((tmp_path / "off" / "config.json").read_text())["bn_recalibrate"] is False
