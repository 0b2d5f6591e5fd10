"""The linear probe (train/probe.py, train/features.py): the head trained on the frozen backbone's pooled
features, computed once and cached under <cache_dir>/features/; the cache's checks; a probe's run
directory as any run's; the probe in tune's rule."""

import dataclasses
import json

import pytest
import torch
from helpers import FAST_TRAIN_ARGS as FAST
from helpers import assert_same_weights, image_folder, tiny_model, tiny_run_config, tiny_set, tiny_splits
from safetensors.torch import save_file

import vitkit
from vitkit.cli.main import main
from vitkit.core.errors import ConfigError, DataError
from vitkit.data import eval_batch
from vitkit.model.variants import get_config
from vitkit.tools.loading import load_model
from vitkit.train import features as features_module
from vitkit.train.config import RunConfig
from vitkit.train.features import split_features
from vitkit.train.distributed import DistInfo
from vitkit.train.loop import train
from vitkit.train.probe import probe_trainer
from vitkit.train.tune import choose_tune, freeze_for

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


@pytest.fixture
def weights(tmp_path):
    ckpt = tmp_path / "weights"
    vitkit.save(tiny_model(num_classes=3, seed=1), ckpt)
    return ckpt


@pytest.fixture
def computed(monkeypatch):
    """The splits whose features were computed (not read from the cache), in order."""
    calls = []
    real = features_module.compute_features

    def counted(model, images, *args, **kwargs):
        calls.append(len(images))
        return real(model, images, *args, **kwargs)

    monkeypatch.setattr(features_module, "compute_features", counted)
    return calls


def probe_cfg(weights, **fields):
    return tiny_run_config(init_from=str(weights), tune="probe", epochs=4, eval_every=1, optim=dict(lr=0.05), **fields)


def pooled(model, images) -> torch.Tensor:
    with torch.no_grad():
        x = eval_batch(images.images, model.cfg.img_size, model.preprocess)
        return model.forward_head(model.forward_features(x), pre_logits=True)


# ============================================================================================ features
@pytest.mark.parametrize("overrides", [{}, {"global_pool": "avg", "representation_size": 16}])
def test_the_cached_features_are_the_models_pooled_features(tmp_path, overrides, computed):
    model, images = tiny_model(seed=1, **overrides), tiny_set(20)
    got, info = split_features(model, {"val": images}, device=CPU, batch_size=8, cache_dir=tmp_path, where="x")
    assert info["feature_cache"] == "miss" and computed == [20]
    assert got["val"].images.shape == (20, model.num_features) and torch.equal(got["val"].labels, images.labels)
    torch.testing.assert_close(got["val"].images, pooled(model, images), atol=1e-6, rtol=0)
    again, info = split_features(model, {"val": images}, device=CPU, batch_size=8, cache_dir=tmp_path, where="x")
    assert info["feature_cache"] == "hit" and computed == [20]
    assert torch.equal(again["val"].images, got["val"].images)


def test_other_weights_data_or_preprocessing_are_other_entries(tmp_path, computed):
    model, images = tiny_model(seed=1), tiny_set(16)

    def run(m, s):
        return split_features(m, {"train": s}, device=CPU, cache_dir=tmp_path, where="x")[1]

    assert run(model, images)["feature_cache"] == "miss"
    other = tiny_model(seed=2)
    assert run(other, images)["feature_cache"] == "miss"
    assert run(model, tiny_set(16, seed=5))["feature_cache"] == "miss"  # other pixels
    assert run(tiny_model(seed=1, img_size=48), images)["feature_cache"] == "miss"  # another size
    model.preprocess = dataclasses.replace(model.preprocess, mean=(0.4, 0.4, 0.4))
    assert run(model, images)["feature_cache"] == "miss"
    model.reset_head(7)  # the head is what a probe trains: not part of the key
    assert run(model, images)["feature_cache"] == "hit"
    assert len(computed) == 5


def _truncate(f):
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip_last_byte(f):
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))


def _misshapen(f):  # the right key, but not this split's features
    from safetensors import safe_open

    with safe_open(str(f), framework="pt") as g:
        meta, feats, labels = g.metadata(), g.get_tensor("features"), g.get_tensor("labels")
    save_file({"features": feats[:, :-1].contiguous(), "labels": labels}, str(f), metadata=meta)


@pytest.mark.parametrize("damage", [_truncate, _flip_last_byte, _misshapen,
                                    lambda f: f.write_bytes(b"not safetensors at all"),
                                    lambda f: f.write_bytes(b"")], ids=["truncated", "flipped", "misshapen",
                                                                        "garbage", "empty"])
def test_a_damaged_entry_is_computed_afresh(tmp_path, damage, computed):
    model, images = tiny_model(seed=1), tiny_set(16)
    first, _ = split_features(model, {"train": images}, device=CPU, cache_dir=tmp_path, where="x")
    (entry,) = (tmp_path / "features").iterdir()
    damage(entry)
    again, info = split_features(model, {"train": images}, device=CPU, cache_dir=tmp_path, where="x")
    assert info["feature_cache"] == "miss" and computed == [16, 16]
    assert torch.equal(again["train"].images, first["train"].images)
    assert [p.name for p in (tmp_path / "features").iterdir()] == [entry.name]  # written again, whole
    assert split_features(model, {"train": images}, device=CPU, cache_dir=tmp_path, where="x")[1]["feature_cache"] == "hit"


def test_an_entry_that_cannot_be_written_is_a_note(tmp_path):
    model, images = tiny_model(seed=1), tiny_set(16)
    split_features(model, {"train": images}, device=CPU, cache_dir=tmp_path, where="x")
    (entry,) = (tmp_path / "features").iterdir()
    entry.unlink()
    entry.mkdir()  # a folder in the way: read as a miss, and not replaced
    got, info = split_features(model, {"train": images}, device=CPU, cache_dir=tmp_path, where="x")
    assert info["feature_cache"] == "miss, not cached" and entry.is_dir()
    assert len(info["notes"]) == 1 and info["notes"][0].startswith("features not cached (")
    torch.testing.assert_close(got["train"].images, pooled(model, images), atol=1e-6, rtol=0)


@pytest.fixture
def clocked(monkeypatch):
    """Features that take 10 ms an image on a clock of the test's own (zeros, at once): the images computed."""
    clock, calls = [0.0], []

    def fake(model, images, *args, **kwargs):
        clock[0] += 0.01 * len(images)
        calls.append(len(images))
        return torch.zeros(len(images), model.num_features)

    monkeypatch.setattr(features_module, "compute_features", fake)
    monkeypatch.setattr(features_module, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    return calls


def test_a_feature_pass_past_its_time_cuts_the_training_images_balanced(clocked):
    parts = {"train": tiny_set(40), "val": tiny_set(16, seed=1), "test": tiny_set(16, seed=2)}  # 72 images: 0.72 s
    feats, info = split_features(tiny_model(), parts, device=CPU, batch_size=8, seconds=0.505)
    # timed on 8 validation images; 0.425 s left, 0.24 s of them for the rest of validation and test: 18 a class
    assert torch.bincount(feats["train"].labels).tolist() == [9, 9]
    assert (len(feats["val"]), len(feats["test"])) == (16, 16)
    assert clocked[0] == 8 and sum(clocked) == 16 + 16 + 18  # the timed batch is kept, not computed again
    assert info["notes"] == ["the budget fits the features of 9 training images a class (18 of 40, classes balanced; "
                             "about 1 s for all of them, 1 s left)"]
    clocked.clear()
    split_features(tiny_model(), parts, device=CPU, batch_size=8, seconds=0.8)  # all of them fit
    assert sum(clocked) == 72
    clocked.clear()
    with pytest.raises(ConfigError, match=r"^--max-minutes: the probe's features of 72 images take about 1 s .*"
                                          r"2 training images a class .* raise --max-minutes$"):
        split_features(tiny_model(), parts, device=CPU, batch_size=8, seconds=0.3)
    assert clocked == [8]  # refused after the timed batch, before the pass


def test_a_corrupted_cache_file_is_recomputed_by_the_run(tmp_path, weights, capsys):
    data, cache = image_folder(tmp_path / "data"), tmp_path / "cache"
    args = ["finetune", str(weights), "--data", str(data), "--epochs", "3", *FAST[2:], "--tune", "probe",
            "--cache-dir", str(cache), "--json"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    for entry in (cache / "features").iterdir():
        entry.write_bytes(b"\0" * 64)
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert summary["feature_cache"] == "miss" and summary["status"] == "completed"
    assert_same_weights(tmp_path / "a", tmp_path / "b")


# ================================================================================================ runs
def test_a_probe_learns_and_its_second_run_reads_the_cache(tmp_path, weights, computed, capsys):
    data, cache = image_folder(tmp_path / "data"), tmp_path / "cache"
    args = ["finetune", str(weights), "--data", str(data), "--epochs", "5", *[a for a in FAST[2:] if a != "--quiet"],
            "--tune", "probe", "--lr", "0.1", "--cache-dir", str(cache), "--json"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    first = capsys.readouterr().out
    summary = json.loads(first.strip().splitlines()[-1])
    assert summary["val_acc"] == 1.0 and summary["test_acc"] == 1.0  # two brightness levels: separable
    assert summary["probe"] == "trained on cached features" and summary["feature_cache"] == "miss"
    assert f"probe: the head trains on the frozen backbone's features (train 22, val 2, test 8; dimension 32), " \
           f"computed, cached in {cache}" in first
    val_lines = [line for line in first.splitlines() if ": val loss " in line]
    assert val_lines and all("(best)" in line for line in val_lines)  # a line only when the head improves
    entries = {p: p.stat().st_mtime_ns for p in (cache / "features").iterdir()}
    assert len(entries) == 3 and len(computed) == 3  # train, val, test
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    second = capsys.readouterr().out
    assert json.loads(second.strip().splitlines()[-1])["feature_cache"] == "hit"
    assert f"read from the cache in {cache}" in second
    assert {p: p.stat().st_mtime_ns for p in (cache / "features").iterdir()} == entries and len(computed) == 3
    assert_same_weights(tmp_path / "a", tmp_path / "b")
    assert main(["eval", str(tmp_path / "b")]) == 0  # a probe's run directory is any run's to the tools
    assert "100.00%" in capsys.readouterr().out


def test_a_probe_checkpoint_predicts_as_the_probe(tmp_path, weights):
    cache = tmp_path / "cache"
    summary = train(probe_cfg(weights), tmp_path / "run", splits=tiny_splits(), cache_dir=cache, log=lambda m: None)
    assert summary["status"] == "completed" and summary["feature_cache"] == "miss"
    model = load_model(tmp_path / "run")  # best/
    splits = tiny_splits()
    feats = split_features(model, {"val": splits.val}, device=CPU, cache_dir=cache, where="built-in")
    assert feats[1]["feature_cache"] == "hit"  # the run's own entry: the head is not part of the key
    with torch.no_grad():
        on_features = model.head(feats[0]["val"].images)
        on_images = model(eval_batch(splits.val.images, model.cfg.img_size, model.preprocess))
    torch.testing.assert_close(on_images, on_features, atol=1e-5, rtol=0)
    acc = (on_features.argmax(-1) == splits.val.labels).float().mean().item()
    assert acc == pytest.approx(summary["best_val_acc"]) and acc == 1.0
    frozen, start = vitkit.load(tmp_path / "run" / "last"), vitkit.load(weights)
    assert torch.equal(frozen.blocks[1].mlp.fc1.weight, start.blocks[1].mlp.fc1.weight)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in records if r["type"] == "eval"]) == 4  # one validation an epoch


def test_a_stopped_probe_resumes_to_the_same_head(tmp_path, weights):
    cfg, cache = probe_cfg(weights), tmp_path / "cache"
    train(cfg, tmp_path / "whole", splits=tiny_splits(), cache_dir=cache, log=lambda m: None)
    polls = iter(range(1000))
    s = train(cfg, tmp_path / "part", splits=tiny_splits(), cache_dir=cache, stop=lambda: next(polls) >= 5,
              log=lambda m: None)
    assert s["status"] == "interrupted" and s["feature_cache"] == "hit"
    assert (tmp_path / "part" / "best").is_dir()
    s = train(cfg, tmp_path / "part", resume=True, splits=tiny_splits(), cache_dir=cache, log=lambda m: None)
    assert s["status"] == "completed"
    assert_same_weights(tmp_path / "whole", tmp_path / "part")


@pytest.mark.parametrize("flags", [["--no-cache"], ["--cache-dir", "none"]])
def test_no_cache_writes_nothing(tmp_path, weights, flags, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    data = image_folder(tmp_path / "data")
    cache = [] if flags[0] == "--cache-dir" else ["--cache-dir", str(tmp_path / "cache")]
    assert main(["finetune", str(weights), "--data", str(data), "--epochs", "2", *FAST[2:], "--tune", "probe",
                 *cache, *flags, "--out", str(tmp_path / "run"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["feature_cache"] == "off" and summary["probe"] == "trained on features computed once (not cached)"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "xdg").exists()


# ============================================================================================ the rule
def test_a_probe_trains_the_head_alone():
    model = tiny_model(global_pool="avg", representation_size=16)
    assert model.cfg.use_fc_norm
    freeze_for(model, "probe", 1)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {"head.weight", "head.bias"}
    model = tiny_model(global_pool="avg", representation_size=16)
    freeze_for(model, "last", 1)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"fc_norm.weight", "pre_logits.fc.weight", "head.weight"} <= trained


def test_the_rule_weighs_the_probe_as_one_pass_over_the_data():
    s16 = get_config("vit_small_patch16_224")
    mode, why = choose_tune(s16, 3_000, 5, threads=2, blocks=2)
    assert mode == "probe" and "the probe's features take ~" in why and "probe ~" not in why


def test_a_probe_runs_in_one_process(tmp_path, weights, capsys):
    with pytest.raises(ConfigError, match="^tune: 'probe' trains the head on features computed once, in one "
                                          "process, not 2; use --nproc 1"):
        RunConfig(init_from="w", tune="probe", processes=2).validate()
    data = image_folder(tmp_path / "data")
    assert main(["finetune", str(weights), "--data", str(data), *FAST[2:], "--tune", "probe", "--nproc", "2",
                 "--out", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("vitkit: error: tune: 'probe' trains the head") and len(err.splitlines()) == 1
    assert not (tmp_path / "run" / "last").exists()
    # processes a launcher other than vitkit's started (torchrun): the run's first step refuses them
    with pytest.raises(ConfigError, match="^tune: 'probe' .* in one process, not 4;"):
        probe_trainer(probe_cfg(weights), tiny_model(), tiny_splits(), tmp_path / "r", dist=DistInfo(1, 4),
                      device=CPU)



def test_a_set_smaller_than_a_batch_is_refused_before_its_features(tmp_path, weights, computed):
    with pytest.raises(DataError, match="^training set: 32 images is fewer than one batch of 64; lower --batch-size"):
        probe_trainer(probe_cfg(weights, batch_size=64), tiny_model(num_classes=3), tiny_splits(), tmp_path / "r",
                      dist=DistInfo(), device=CPU)
    assert computed == []  # no pass over the data was spent on it
