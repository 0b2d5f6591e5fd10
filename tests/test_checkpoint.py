"""The canonical checkpoint: round trip, run directories, and every way a checkpoint can be bad."""

import json
import os
import pickle

import pytest
import torch

import vitkit
from vitkit import CheckpointError
from vitkit.io.atomic import atomic_write_bytes
from vitkit.io.checkpoint import load_state_dict_file

from helpers import Payload, tiny_model


@pytest.fixture()
def ckpt(tmp_path):
    m = tiny_model(num_classes=3, head_std=1.0, labels=["cat", "dog", "eel"])
    return m, vitkit.save(m, tmp_path / "ckpt")


def test_round_trip(ckpt):
    m, path = ckpt
    assert sorted(os.listdir(path)) == ["vitkit.json", "vitkit.safetensors"]
    loaded = vitkit.load(path)
    assert not loaded.training and loaded.labels == ["cat", "dog", "eel"]
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(loaded(x), m(x))
    cfg = json.loads((path / "vitkit.json").read_text())
    assert cfg["format"] == "vitkit" and cfg["model"]["embed_dim"] == 32 and cfg["preprocess"]["mean"] == [0.5] * 3


def test_load_accepts_weights_file_and_run_dir(ckpt, tmp_path):
    m, path = ckpt
    assert vitkit.load(path / "vitkit.safetensors").cfg == m.cfg
    run = tmp_path / "run"
    vitkit.save(m, run / "best")
    assert vitkit.load(run).labels == m.labels


def test_missing_path(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope: no such file or directory"):
        vitkit.load(tmp_path / "nope")


def test_not_a_checkpoint_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty: not a vitkit checkpoint"):
        vitkit.load(tmp_path / "empty")


def test_missing_config(ckpt):
    _, path = ckpt
    (path / "vitkit.json").unlink()
    with pytest.raises(CheckpointError, match=r"vitkit.json: missing \(a vitkit checkpoint holds vitkit.json beside"):
        vitkit.load(path)


@pytest.mark.parametrize(
    "edit,msg",
    [
        (lambda c: c["model"].update(embed_dims=4), r"vitkit.json: model: unknown field\(s\) 'embed_dims'"),
        (lambda c: c["model"].update(depth="2"), r"vitkit.json: model.depth: expected an integer, got '2'"),
        (lambda c: c["model"].update(num_heads=5), r"vitkit.json: ViTConfig.num_heads: embed_dim 32 is not divisible"),
        (lambda c: c.update(labels=["a"]), r"vitkit.json: 1 labels for a head of 3 classes"),
        (lambda c: c["preprocess"].update(std=[0, 1, 1]), r"vitkit.json: Preprocess.std"),
        (lambda c: c.pop("model"), r"vitkit.json: expected a JSON object with a 'model' table"),
    ],
)
def test_bad_config(ckpt, edit, msg):
    _, path = ckpt
    cfg = json.loads((path / "vitkit.json").read_text())
    edit(cfg)
    (path / "vitkit.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=msg):
        vitkit.load(path)


def test_config_not_json(ckpt):
    _, path = ckpt
    (path / "vitkit.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(CheckpointError, match=r"vitkit.json: not valid JSON"):
        vitkit.load(path)


def _as_before_vitkit_json(path):
    """Checkpoint ``path`` in the layout written before vitkit.json: config.json + model.safetensors."""
    (path / "vitkit.json").rename(path / "config.json")
    (path / "vitkit.safetensors").rename(path / "model.safetensors")
    return path


def test_checkpoints_written_before_vitkit_json_still_load(ckpt, tmp_path, capsys):
    from vitkit.cli.main import main
    from vitkit.io.convert import detect_format

    m, path = ckpt
    _as_before_vitkit_json(path)
    x = torch.randn(2, 3, 32, 32)
    for where in (path, path / "model.safetensors", path / "config.json"):
        assert torch.equal(vitkit.load(where)(x), m(x)) and vitkit.load(where).labels == m.labels
        assert detect_format(where) == "vitkit"
    run = tmp_path / "run"
    _as_before_vitkit_json(vitkit.save(m, run / "best"))
    (run / "config.json").write_text("{}")  # the run's own config, beside best/
    assert torch.equal(vitkit.load(run)(x), m(x)) and detect_format(run) == "vitkit"
    assert torch.equal(vitkit.create_model(weights=run)(x), m(x))
    assert main(["convert", str(path), str(tmp_path / "w.safetensors"), "--to", "timm"]) == 0
    assert f"read vitkit: {path}" in capsys.readouterr().out
    # saving into an old checkpoint replaces its files (other libraries would read them) with vitkit's
    vitkit.save(m, path)
    assert sorted(os.listdir(path)) == ["vitkit.json", "vitkit.safetensors"]


@pytest.mark.parametrize("cls", ["ViTForImageClassification", "AutoModelForImageClassification"])
def test_transformers_refuses_a_vitkit_checkpoint(ckpt, cls):
    """HF's from_pretrained finds neither config.json nor model.safetensors in a vitkit checkpoint: it fails
    instead of building a default ViT-B and loading none of the weights into it."""
    transformers = pytest.importorskip("transformers")
    _, path = ckpt
    with pytest.raises((OSError, ValueError)) as e:
        getattr(transformers, cls).from_pretrained(str(path), local_files_only=True)
    assert "model.safetensors" in str(e.value) or "config.json" in str(e.value)


@pytest.mark.parametrize("cut", [0, 7, 100, -50])
def test_truncated_safetensors(ckpt, cut):
    _, path = ckpt
    f = path / "vitkit.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    with pytest.raises(CheckpointError, match=r"vitkit.safetensors: not a readable safetensors file"):
        vitkit.load(path)


def test_corrupted_safetensors_header(ckpt):
    _, path = ckpt
    f = path / "vitkit.safetensors"
    data = bytearray(f.read_bytes())
    data[8:20] = b"!!garbage!!!"
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"not a readable safetensors file"):
        vitkit.load(path)


def test_weights_that_do_not_fit_list_the_keys(ckpt):
    from safetensors.torch import save_file

    m, path = ckpt
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    del sd["norm.weight"]
    sd["extra.weight"] = torch.zeros(2)
    sd["head.bias"] = torch.zeros(4)
    save_file(sd, str(path / "vitkit.safetensors"))
    with pytest.raises(CheckpointError) as e:
        vitkit.load(path)
    msg = str(e.value)
    assert "missing: norm.weight" in msg and "unexpected: extra.weight" in msg
    assert "mis-shaped: head.bias (4,) != (3,)" in msg and "\n" not in msg


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "evil.pth"
    with open(bad, "wb") as f:
        pickle.dump({"w": Payload(marker)}, f)
    with pytest.raises(CheckpointError, match=r"evil.pth: refused to load"):
        load_state_dict_file(bad)
    assert not marker.exists()


def test_torch_save_zip_payload_is_refused(tmp_path):
    marker = tmp_path / "pwned2"
    bad = tmp_path / "evil2.pt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "x": Payload(marker)}, bad)
    with pytest.raises(CheckpointError, match=r"evil2.pt: refused to load: not a plain weights file \(it imports "):
        load_state_dict_file(bad)
    assert not marker.exists()


def test_pth_state_dict_loads(tmp_path):
    torch.save({"model": {"a": torch.ones(2)}}, tmp_path / "ok.pth")
    assert torch.equal(load_state_dict_file(tmp_path / "ok.pth")["a"], torch.ones(2))
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"junk.pth: "):
        load_state_dict_file(tmp_path / "junk.pth")


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    import errno

    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")

    real_replace = os.replace

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(CheckpointError, match=r"f.bin: could not write \(no space left on device\)"):
        atomic_write_bytes(target, b"new")
    monkeypatch.setattr(os, "replace", real_replace)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]  # no temporary file left behind


def test_save_over_a_file_is_an_error(tmp_path):
    (tmp_path / "x").write_text("hi")
    with pytest.raises(CheckpointError, match=r"x: exists and is not a directory"):
        vitkit.save(vitkit.create_model("vit_test"), tmp_path / "x")
