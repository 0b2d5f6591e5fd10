"""HF ViT directories: config.json fields, key tables, file variants and errors (no transformers needed)."""

import json
from functools import partial

import pytest
import torch
from helpers import assert_same_logits, random_model

import vitkit
from vitkit.cli.main import main
from vitkit.core.errors import CheckpointError
from vitkit.io.convert import from_hf, to_hf
from vitkit.io.hf import to_hf_state

# vit_test with 4 heads and 3 classes (what config.json and the key counts below say), every weight random
rand_model = partial(random_model, num_heads=4, num_classes=3)


def test_config_json_describes_the_model(tmp_path):
    model = rand_model(img_size=(16, 40), norm_eps=1e-6, qkv_bias=False, act="gelu_tanh", in_chans=1)
    to_hf(model, tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    assert c["architectures"] == ["ViTForImageClassification"] and c["model_type"] == "vit"
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["intermediate_size"]) == (32, 2, 4, 64)
    assert (c["image_size"], c["patch_size"], c["num_channels"], c["qkv_bias"]) == ([16, 40], 8, 1, False)
    assert (c["layer_norm_eps"], c["hidden_act"]) == (1e-6, "gelu_pytorch_tanh")
    assert c["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    back = from_hf(tmp_path)
    assert back.cfg == model.cfg.replace(fc_norm=back.cfg.fc_norm)  # fc_norm None or False: both off
    assert_same_logits(model, back)


def test_hf_keys_and_qkv_split():
    model = rand_model()
    sd = to_hf_state(model)
    q = sd["vit.encoder.layer.1.attention.attention.query.weight"]
    k = sd["vit.encoder.layer.1.attention.attention.key.weight"]
    assert torch.equal(torch.cat([q, k, sd["vit.encoder.layer.1.attention.attention.value.weight"]]),
                       model.blocks[1].attn.qkv.weight)
    assert torch.equal(sd["vit.encoder.layer.0.output.dense.weight"], model.blocks[0].mlp.fc2.weight)
    assert torch.equal(sd["classifier.weight"], model.head.weight)
    assert len(sd) == 4 + 2 + 2 + 2 * 16  # embeddings, final norm, classifier, 16 tensors a block


def test_default_eps_is_hf_default_and_modern_names_in_a_bin(tmp_path):
    """A config without layer_norm_eps means HF's 1e-12; transformers 5 in-memory names are read too."""
    model = rand_model(norm_eps=1e-12)
    to_hf(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["layer_norm_eps"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file

    legacy = load_file(tmp_path / "model.safetensors")
    modern = {k.replace("encoder.layer.", "layers.").replace("attention.attention.query", "attention.q_proj")
              .replace("attention.attention.key", "attention.k_proj").replace("attention.attention.value", "attention.v_proj")
              .replace("attention.output.dense", "attention.o_proj").replace("intermediate.dense", "mlp.fc1")
              .replace("output.dense", "mlp.fc2"): v for k, v in legacy.items()}
    assert "vit.layers.0.attention.o_proj.weight" in modern and "vit.layers.0.mlp.fc2.weight" in modern
    (tmp_path / "model.safetensors").unlink()
    torch.save(modern, tmp_path / "pytorch_model.bin")
    back = from_hf(tmp_path)
    assert back.cfg.norm_eps == 1e-12
    assert_same_logits(model, back)


def test_sharded_index(tmp_path):
    from safetensors.torch import save_file

    model = rand_model()
    sd = to_hf_state(model)
    to_hf(model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    keys = sorted(sd)
    half = {"a.safetensors": keys[: len(keys) // 2], "b.safetensors": keys[len(keys) // 2:]}
    for name, ks in half.items():
        save_file({k: sd[k] for k in ks}, tmp_path / name)
    index = {"weight_map": {k: name for name, ks in half.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_same_logits(model, from_hf(tmp_path))


def test_vitmodel_without_head(tmp_path):
    model = rand_model(num_classes=0, representation_size=16)
    to_hf(model, tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    assert c["architectures"] == ["ViTModel"] and c["pooler_output_size"] == 16 and "id2label" not in c
    from safetensors.torch import load_file

    keys = load_file(tmp_path / "model.safetensors").keys()
    assert "pooler.dense.weight" in keys and not any(k.startswith("vit.") for k in keys)
    assert_same_logits(model, from_hf(tmp_path))


def test_errors(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope: not a directory \(an HF model is a directory"):
        from_hf(tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        from_hf(tmp_path)
    to_hf(rand_model(), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "deit"}))
    with pytest.raises(CheckpointError, match=r"model_type 'deit' is not a plain ViT \('vit'\)"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 3}))
    with pytest.raises(CheckpointError, match=r"config\.json: ViTConfig\.num_heads: embed_dim 32 is not divisible by num_heads 3"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "image_size": 48}))
    with pytest.raises(CheckpointError, match=r"mis-shaped: vit\.embeddings\.position_embeddings \(1, 17, 32\) -> "
                                              r"pos_embed \(1, 37, 32\)$"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_act": "silu"}))
    with pytest.raises(CheckpointError, match=r"hidden_act 'silu' has no vitkit equivalent"):
        from_hf(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no model\.safetensors or pytorch_model\.bin beside config\.json"):
        from_hf(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match=r"file: exists and is not a directory"):
        to_hf(rand_model(), tmp_path / "file")


def test_cli_round_trip_with_labels(tmp_path, capsys):
    model = rand_model()
    model.labels = ["ant", "bee", "cow"]
    vitkit.save(model, tmp_path / "ckpt")
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--to", "hf", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(report["files"]) == sorted(str(tmp_path / "hf" / f) for f in
                                             ("model.safetensors", "config.json", "preprocessor_config.json"))
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--from", "hf"]) == 0
    back = vitkit.load(tmp_path / "back")
    assert back.labels == ["ant", "bee", "cow"]
    assert_same_logits(model, back)


@pytest.mark.parametrize("kw, what", [
    (dict(reg_tokens=4), r"register tokens \(reg_tokens\)"),
    (dict(qk_norm=True), r"qk-norm \(qk_norm\)"),
    (dict(global_pool="map"), r"attention pooling \(global_pool='map'\)"),
])
def test_registers_qk_norm_and_attention_pooling_are_refused(kw, what, tmp_path):
    model = rand_model(**kw)
    with pytest.raises(CheckpointError, match=f"^HF ViT cannot hold this model: {what}$"):
        to_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(CheckpointError, match=what):
        to_hf_state(model)


def test_a_conv_stem_model_is_refused_in_one_line_naming_the_exports(tmp_path, capsys):
    """transformers has no conv-stem ViT: the refusal points to `vitkit export` (ONNX, TorchScript) and timm."""
    from vitkit.tools.demo import DEMO_MODEL

    assert main(["convert", str(DEMO_MODEL), str(tmp_path / "hf"), "--to", "hf"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vitkit: error: HF ViT cannot hold this model: ")
    assert ("the convolutional stem (stem='conv'; transformers has no conv-stem ViT: `vitkit export` writes ONNX or "
            "TorchScript, or `--to timm`)") in err
    assert not (tmp_path / "hf").exists()
