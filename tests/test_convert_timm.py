"""timm state dicts: architecture inference, key and shape checks, refusals and the convert CLI (no timm needed)."""

import json
import pickle

import pytest
import torch
from helpers import Payload, assert_same_logits, randomize
from helpers import random_model as rand_model  # vit_test (2 heads, 10 classes), every weight random

import vitkit
from vitkit import VisionTransformer, ViTConfig
from vitkit.cli.main import main
from vitkit.core.errors import CheckpointError, ConfigError
from vitkit.io.convert import from_timm, to_timm
from vitkit.io.timm import save_timm


@pytest.mark.parametrize("kw", [
    dict(),
    dict(class_token=False, global_pool="avg", fc_norm=False, patch_size=4),
    dict(global_pool="avg", qkv_bias=False, layer_scale=1e-4, num_classes=0),
    dict(no_embed_class=True, in_chans=1, mlp_ratio=3.0),
    dict(reg_tokens=4, qk_norm=True),
    dict(reg_tokens=2, no_embed_class=True, global_pool="map"),
    dict(reg_tokens=1, class_token=False, global_pool="avg", layer_scale=1e-5, qkv_bias=False),
    dict(class_token=False, global_pool="map", qk_norm=True),
])
def test_round_trip_infers_the_architecture(kw):
    model = rand_model(**kw)
    back = from_timm(to_timm(model), overrides={"num_heads": 2})
    c, b = model.cfg, back.cfg
    for f in ("embed_dim", "depth", "patch_size", "in_chans", "img_size", "class_token", "global_pool", "use_fc_norm",
              "qkv_bias", "num_classes", "mlp_hidden", "reg_tokens", "qk_norm"):
        assert getattr(b, f) == getattr(c, f), f
    assert (b.layer_scale is None) == (c.layer_scale is None)
    assert b.no_embed_class is False  # written with a class slot (zeros when vitkit adds none)
    assert_same_logits(model, back)


@pytest.mark.parametrize("kw", [dict(), dict(reg_tokens=4), dict(reg_tokens=1, class_token=False, global_pool="avg")])
def test_patch_only_position_table_is_read_as_no_embed_class(kw):
    model = rand_model(no_embed_class=True, **kw)
    back = from_timm(model.state_dict(), overrides={"num_heads": 2})  # timm's no_embed_class layout
    assert back.cfg.no_embed_class and back.cfg.img_size == (32, 32)
    assert back.cfg.reg_tokens == model.cfg.reg_tokens
    assert_same_logits(model, back)


def test_dinov2_with_registers_layout():
    """timm's vit_small_patch14_reg4_dinov2 (one block here): 518 px, patch 14, 4 registers after [cls],
    a position table over the 37 x 37 patches only, LayerScale, no head. Everything but eps and the
    activation is read from the weights (heads from the width table)."""
    cfg = ViTConfig(img_size=518, patch_size=14, embed_dim=384, depth=1, num_heads=6, num_classes=0, reg_tokens=4,
                    no_embed_class=True, layer_scale=1e-5)
    model = randomize(VisionTransformer(cfg))
    sd = model.state_dict()  # timm's layout for this config, key for key
    assert (sd["reg_token"].shape, sd["pos_embed"].shape) == ((1, 4, 384), (1, 37 * 37, 384))
    from vitkit.io.timm import read_timm

    back, info = read_timm(sd)
    assert back.cfg == cfg.replace(fc_norm=False)  # token pooling, no fc_norm: timm's defaults
    assert info["assumed"] == {"num_heads": 6, "norm_eps": 1e-6, "act": "gelu", "global_pool": "token"}
    assert_same_logits(model, back, torch.randn(1, 3, 518, 518))


def test_registers_without_a_class_token_and_table_errors_name_the_slots():
    model = rand_model(reg_tokens=2, img_size=(16, 40))
    sd = to_timm(model)  # 10 patches + 3 slots: not square either way
    with pytest.raises(CheckpointError, match=r"the position table has 13 positions but img_size 32x32 with patch 8 "
                                              r"makes 16 patches \(\+3 slots for the class and register tokens\)"):
        from_timm(sd, overrides={"num_heads": 2, "img_size": 32})
    back = from_timm(sd, overrides={"num_heads": 2, "img_size": [16, 40]})
    assert (back.cfg.reg_tokens, back.cfg.no_embed_class) == (2, False)
    assert_same_logits(model, back)


def test_timm_keys_of_the_new_features():
    model = rand_model(reg_tokens=3, qk_norm=True, global_pool="map", no_embed_class=True)
    sd = to_timm(model)
    assert list(sd)[:3] == ["cls_token", "reg_token", "pos_embed"]
    assert torch.equal(sd["pos_embed"][:, :4], torch.zeros(1, 4, 32))  # zero slots: vitkit adds no position there
    assert torch.equal(sd["pos_embed"][:, 4:], model.pos_embed)
    assert sd["blocks.1.attn.q_norm.weight"].shape == sd["blocks.1.attn.k_norm.bias"].shape == (16,)
    pool = sorted(k[len("attn_pool."):] for k in sd if k.startswith("attn_pool."))
    assert pool == ["kv.bias", "kv.weight", "latent", "mlp.fc1.bias", "mlp.fc1.weight", "mlp.fc2.bias",
                    "mlp.fc2.weight", "norm.bias", "norm.weight", "proj.bias", "proj.weight", "q.bias", "q.weight"]
    from vitkit.io.timm import timm_model_kwargs

    kw = timm_model_kwargs(model.cfg)
    assert (kw["reg_tokens"], kw["qk_norm"], kw["global_pool"], kw["no_embed_class"]) == (3, True, "map", False)


def _foreign(sd: dict, key: str, shape=(4,)) -> dict:
    return {**sd, key: torch.zeros(shape)}


@pytest.mark.parametrize("change, what", [
    (lambda sd: _foreign(sd, "blocks.0.mlp.fc1_g.weight", (64, 32)), r"SwiGLU MLPs \(blocks\.0\.mlp\.fc1_g\.weight\)"),
    (lambda sd: {**sd, "blocks.0.mlp.fc1.weight": torch.zeros(128, 32), "blocks.0.mlp.fc1.bias": torch.zeros(128)},
     r"SwiGLU MLPs \(blocks\.0\.mlp\.fc1\.weight \(128, 32\) makes twice the 64 inputs of blocks\.0\.mlp\.fc2"),
    (lambda sd: _foreign(sd, "blocks.0.attns.0.attn.qkv.weight", (96, 32)), r"parallel blocks \(blocks\.0\.attns\."),
    (lambda sd: _foreign(sd, "blocks.0.in_proj.weight", (224, 32)), r"parallel blocks \(blocks\.0\.in_proj\.weight\)"),
    (lambda sd: _foreign(sd, "blocks.1.gamma_1"), r"rotary position embeddings \(timm's Eva: blocks\.1\.gamma_1\)"),
    (lambda sd: _foreign(sd, "rope.freqs"), r"rotary position embeddings \(timm's Eva: rope\.freqs\)"),
    (lambda sd: {("embeds." + k if not k.startswith("blocks.") else k): v for k, v in sd.items()},
     r"NaFlex embeddings \(timm's NaFlexVit: embeds\.cls_token\)"),
    (lambda sd: _foreign(sd, "blocks.0.attn.lambda_q1", (16,)),
     r"differential attention \(blocks\.0\.attn\.lambda_q1\)"),
])
def test_other_timm_families_are_refused_naming_the_feature(change, what):
    sd = change(to_timm(rand_model(reg_tokens=1)))
    with pytest.raises(CheckpointError, match=f"^timm state dict: holds {what}.*, which vitkit's VisionTransformer "
                                              "does not have$"):
        from_timm(sd, overrides={"num_heads": 2})


@pytest.mark.parametrize("width, heads", [(192, 3), (384, 6), (1024, 16), (128, 2)])
def test_heads_from_the_width_table_else_width_over_64(width, heads):
    sd = to_timm(VisionTransformer(ViTConfig(img_size=16, patch_size=8, embed_dim=width, depth=1, num_heads=1,
                                             num_classes=0)))
    from vitkit.io.timm import infer

    seen, guessed, pos_len = infer(sd, "x")
    assert guessed["num_heads"] == heads and pos_len == 5


def test_what_the_weights_do_not_show_is_reported(tmp_path):
    save_timm(rand_model(embed_dim=64, num_heads=4, depth=4), tmp_path / "w.safetensors")
    from vitkit.io.timm import read_timm

    model, info = read_timm(tmp_path / "w.safetensors")
    assert model.cfg.num_heads == 1  # 64 / 64: the weights cannot tell 4 heads from 1
    assert info["assumed"] == {"num_heads": 1, "norm_eps": 1e-6, "act": "gelu", "global_pool": "token"}
    model, info = read_timm(tmp_path / "w.safetensors", model_name="vit_mini_patch4_32",
                            overrides={"patch_size": 8, "norm_eps": 1e-12})
    assert model.cfg.num_heads == 4 and model.cfg.norm_eps == 1e-12 and info["assumed"] == {}


def test_qk_norm_weights_show_the_heads(tmp_path, capsys):
    """The q / k norms are one head wide, so qk-norm weights tell the heads: 64 / 16 = 4, not 64 / 64."""
    model = rand_model(embed_dim=64, num_heads=4, qk_norm=True)
    save_timm(model, tmp_path / "W.safetensors")
    assert main(["convert", str(tmp_path / "W.safetensors"), str(tmp_path / "out"), "--from", "timm"]) == 0
    out = capsys.readouterr().out
    assert "heads 4," in out and "num_heads" not in out  # read, so not among the assumed fields
    assert "not in the weights, assumed: norm_eps=1e-06, act=gelu, global_pool=token" in out
    assert_same_logits(model, vitkit.load(tmp_path / "out"))
    assert_same_logits(model, vitkit.create_model(weights=tmp_path / "W.safetensors"))
    from helpers import tiny_run_config

    from vitkit.train.build import read_init  # what `vitkit finetune W.safetensors` reads

    tuned, report = read_init(tiny_run_config(init_from=str(tmp_path / "W.safetensors")))
    assert tuned.cfg.num_heads == 4 and "num_heads" not in report["assumed"]
    from vitkit.io.timm import read_timm

    back, info = read_timm(to_timm(model))
    assert back.cfg.num_heads == 4 and "num_heads" not in info["assumed"]
    assert from_timm(to_timm(rand_model(embed_dim=64, num_heads=2, qk_norm=True))).cfg.num_heads == 2
    with pytest.raises(CheckpointError, match=r"q_norm\.weight \(16,\) -> blocks\.0\.attn\.q_norm\.weight \(32,\)"):
        from_timm(to_timm(model), overrides={"num_heads": 2})  # an override that disagrees: the tensor is named


def test_named_model_must_agree_on_structure():
    sd = to_timm(rand_model())
    with pytest.raises(CheckpointError, match=r"^timm state dict: the weights have embed_dim 32 but model "
                                              r"'vit_base_patch16_224' has 768$"):
        from_timm(sd, model_name="vit_base_patch16_224")
    with pytest.raises(ConfigError, match=r"model 'vit_nope' is not a known name"):
        from_timm(sd, model_name="vit_nope")


def test_non_square_grid_needs_the_image_size():
    model = rand_model(img_size=(16, 40))
    sd = to_timm(model)
    with pytest.raises(CheckpointError, match=r"position table's 11 positions are no square grid; pass the image "
                                              r"size \(--set img_size=\[H,W\]\)"):
        from_timm(sd, overrides={"num_heads": 2})
    with pytest.raises(CheckpointError, match=r"the position table has 11 positions but img_size 32x32 with patch 8 "
                                              r"makes 16 patches \(\+1 class slot\)"):
        from_timm(sd, overrides={"num_heads": 2, "img_size": 32})
    back = from_timm(sd, overrides={"num_heads": 2, "img_size": [16, 40]})
    assert_same_logits(model, back)


def test_bad_state_dict_is_one_line_listing_the_problems():
    sd = to_timm(rand_model())
    del sd["blocks.1.norm2.bias"]
    sd["blocks.0.attn.q_norm.weight"] = torch.ones(16)
    sd["head.bias"] = torch.zeros(11)
    with pytest.raises(CheckpointError) as e:
        from_timm(sd, overrides={"num_heads": 2})
    assert str(e.value) == (
        "timm state dict: weights do not fit the model; missing: blocks.1.norm2.bias; "
        "unexpected: blocks.0.attn.q_norm.weight; mis-shaped: head.bias (11,) -> head.bias (10,)")
    with pytest.raises(CheckpointError, match=r"not a timm ViT state dict \(no patch_embed\.proj\.weight"):
        from_timm({"conv1.weight": torch.zeros(8, 3, 3, 3)})


def test_many_problems_are_truncated():
    sd = {k: v for k, v in to_timm(rand_model(depth=3)).items() if not k.startswith("blocks.1.")}
    sd["blocks.2.extra"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"missing: blocks\.1\.norm1\.weight, .* \(\+6 more\); unexpected: "
                                              r"blocks\.2\.extra$"):
        from_timm(sd, overrides={"num_heads": 2})


@pytest.mark.parametrize("kw", [dict(), dict(stem_whiten=True, stem_convs=1), dict(stem_whiten=True, stem_early_convs=2)])
def test_conv_stem_is_written_as_timms_hybrid_embed(kw):
    """The stem's layers under patch_embed.backbone.* (HybridEmbed's names), the 1x1 projection as its proj."""
    model = rand_model(stem="conv", stem_width=4, patch_size=4, **kw)
    sd = to_timm(model)
    own = model.state_dict()
    stem = [k for k in own if k.startswith("patch_embed.stem.")]
    assert stem and not any(k.startswith("patch_embed.stem.") for k in sd)
    for k in stem:
        assert torch.equal(sd["patch_embed.backbone." + k[len("patch_embed.stem."):]], own[k].cpu())
    assert torch.equal(sd["patch_embed.proj.weight"], own["patch_embed.proj.weight"])
    assert sd["patch_embed.backbone.1.num_batches_tracked"].dtype == torch.int64
    from vitkit.io.timm import timm_conv_stem_args, timm_model_kwargs

    args = timm_conv_stem_args(model.cfg)
    assert args == dict(in_chans=3, widths=[24, 8] if kw else [4, 8], extra=kw.get("stem_convs", 0),
                        whiten=bool(kw), early=[4] * kw.get("stem_early_convs", 0))
    assert timm_model_kwargs(model.cfg)["patch_size"] == 1 and timm_conv_stem_args(rand_model().cfg) is None
    with pytest.raises(CheckpointError, match=r"holds a CNN stem, whose strides the weights do not show .*"
                                              r"\(timm's HybridEmbed: patch_embed\.backbone\.0\.weight\)"):
        from_timm(sd)


@pytest.mark.parametrize("kw, what", [
    (dict(norm="post"), "post-LN blocks"),
    (dict(act="relu"), "activation 'relu'"),
    (dict(representation_size=16), "a pre-logits layer"),
])
def test_what_timm_cannot_hold_is_refused(kw, what, tmp_path):
    with pytest.raises(CheckpointError, match=f"^timm's VisionTransformer cannot hold this model: {what}"):
        save_timm(rand_model(**kw), tmp_path / "w.pth")
    assert not (tmp_path / "w.pth").exists()


def test_pickles_that_run_code_are_refused(tmp_path):
    torch.save({"patch_embed.proj.weight": torch.zeros(1), "x": Payload(tmp_path / "ran")}, tmp_path / "evil.pth",
               pickle_module=pickle)
    with pytest.raises(CheckpointError, match=r"evil\.pth: refused to load"):
        from_timm(tmp_path / "evil.pth")


def test_load_into_a_given_model():
    model = rand_model()
    target = VisionTransformer(model.cfg)
    assert from_timm(to_timm(model), model=target) is target
    assert_same_logits(model, target)


# -------------------------------------------------------------------------------------------- CLI
def test_cli_timm_to_vitkit_and_back(tmp_path, capsys):
    model = rand_model(num_heads=4)
    model.pos_embed.data.normal_()
    save_timm(model, tmp_path / "w.pth")
    rc = main(["convert", str(tmp_path / "w.pth"), str(tmp_path / "ckpt"), "--from", "timm", "--set", "num_heads=4",
               "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    report = json.loads(out[-1])
    assert report["config"]["num_heads"] == 4 and report["assumed"] == {
        "norm_eps": 1e-6, "act": "gelu", "global_pool": "token"}
    assert out[1].startswith("model: width 32, depth 2, heads 4, patch 8, image 32x32, classes 10, pool token")
    assert_same_logits(model, vitkit.load(tmp_path / "ckpt"))

    rc = main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "back.safetensors"), "--to", "timm"])
    assert rc == 0
    from vitkit.io.checkpoint import load_state_dict_file

    back = load_state_dict_file(tmp_path / "back.safetensors")
    assert back.keys() == to_timm(model).keys()
    assert all(torch.equal(back[k], v) for k, v in to_timm(model).items())


def test_cli_resamples_to_a_new_size(tmp_path, capsys):
    from vitkit.model.layers import resample_pos_embed

    model = rand_model()
    vitkit.save(model, tmp_path / "ckpt")
    rc = main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "w.safetensors"), "--to", "timm",
               "--img-size", "48x64", "--antialias"])
    assert rc == 0
    assert "resampled position embeddings 32x32 -> 48x64 (bicubic, antialias)" in capsys.readouterr().out
    from vitkit.io.checkpoint import load_state_dict_file

    pe = load_state_dict_file(tmp_path / "w.safetensors")["pos_embed"]
    assert torch.equal(pe, resample_pos_embed(model.pos_embed.data, (6, 8), (4, 4), 1, antialias=True))


def test_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["convert", "a", "b"])
    assert e.value.code == 2
    assert "give --from FORMAT" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["convert", "a", "b", "--from", "onnx"])
    assert e.value.code == 2
    assert "invalid choice: 'onnx'" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "none.pth"), str(tmp_path / "out"), "--from", "timm"]) == 1
    assert capsys.readouterr().err.strip() == f"vitkit: error: {tmp_path / 'none.pth'}: no such file"
    torch.save(to_timm(rand_model()), tmp_path / "w.pth")
    assert main(["convert", str(tmp_path / "w.pth"), str(tmp_path / "out"), "--from", "timm", "--set", "heads=2"]) == 1
    assert capsys.readouterr().err.startswith("vitkit: error: --set heads: not a ViTConfig field")
    vitkit.save(rand_model(), tmp_path / "ckpt")
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "w.txt"), "--to", "timm"]) == 1
    assert "a timm state dict is written as .safetensors or .pth (got '.txt')" in capsys.readouterr().err


# ----------------------------------------------------------------------- any format in one step: the container
def test_the_container_tells_the_format(tmp_path):
    import numpy as np

    from vitkit.io.convert import detect_format, to_hf

    model = rand_model()
    for name in ("w.pth", "w.bin", "w.safetensors"):
        save_timm(model, tmp_path / name)
        assert detect_format(tmp_path / name) == "timm"
    np.savez(tmp_path / "w.npz", x=np.zeros(1))
    assert detect_format(tmp_path / "w.npz") == "jax"
    to_hf(model, tmp_path / "hf")
    assert detect_format(tmp_path / "hf") == "hf"
    ckpt = vitkit.save(model, tmp_path / "ckpt")
    assert detect_format(ckpt) == "vitkit" and detect_format(ckpt / "vitkit.safetensors") == "vitkit"
    (tmp_path / "run" / "best").mkdir(parents=True)  # a run directory: its config.json beside best/
    vitkit.save(model, tmp_path / "run" / "best")
    (tmp_path / "run" / "config.json").write_text("{}")
    assert detect_format(tmp_path / "run") == "vitkit"
    (tmp_path / "w.onnx").write_bytes(b"onnx")
    (tmp_path / "empty").mkdir()
    for bad in ("w.onnx", "empty"):
        with pytest.raises(CheckpointError) as e:
            detect_format(tmp_path / bad)
        assert str(e.value) == (f"{tmp_path / bad}: not a weights container vitkit knows; expected a vitkit checkpoint "
                                "or run directory (vitkit.json beside vitkit.safetensors), an HF model directory "
                                "(config.json with model_type 'vit'), a JAX .npz file, a timm .pth, .pt, .bin or .safetensors file")
    with pytest.raises(CheckpointError, match=r"none\.pth: no such file or directory"):
        detect_format(tmp_path / "none.pth")


def test_a_file_of_an_hf_model_directory_is_hf(tmp_path):
    """model.safetensors (or config.json) inside an HF model directory is that directory, not timm weights;
    a model.safetensors beside no HF config stays timm's."""
    from vitkit.io.convert import detect_format, read, to_hf

    model = rand_model()
    to_hf(model, tmp_path / "hf")
    for name in ("model.safetensors", "config.json"):
        assert detect_format(tmp_path / "hf" / name) == "hf"
    back, info = read(tmp_path / "hf" / "model.safetensors")
    assert info["format"] == "hf"
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)
    (tmp_path / "timm").mkdir()
    save_timm(model, tmp_path / "timm" / "model.safetensors")
    assert detect_format(tmp_path / "timm" / "model.safetensors") == "timm"


def test_create_model_reads_weights_of_any_format(tmp_path):
    from vitkit.io.convert import to_hf

    model = rand_model()
    save_timm(model, tmp_path / "w.safetensors")
    to_hf(model, tmp_path / "hf")
    # the architecture from the weights; a name (or single fields) for what they do not show
    assert_same_logits(model, vitkit.create_model("vit_test", weights=tmp_path / "w.safetensors"))
    assert_same_logits(model, vitkit.create_model(weights=tmp_path / "w.safetensors", num_heads=2))
    assert_same_logits(model, vitkit.create_model("auto", weights=tmp_path / "hf", norm_eps=1e-6))
    ckpt = vitkit.save(model, tmp_path / "ckpt")
    assert_same_logits(model, vitkit.create_model(weights=ckpt))
    # num_classes: a new, zero-initialised head, as for fine-tuning
    three = vitkit.create_model("vit_test", weights=tmp_path / "w.safetensors", num_classes=3)
    assert three.cfg.num_classes == 3 and not three.head.weight.any() and not three.training
    with pytest.raises(CheckpointError, match=r"number of heads is not visible .* --model NAME"):
        vitkit.create_model(weights=tmp_path / "w.safetensors")
    with pytest.raises(ConfigError, match=r"a vitkit checkpoint has its config"):
        vitkit.create_model("vit_test", weights=ckpt)
    with pytest.raises(ConfigError, match=r"give a model name .* or weights=PATH"):
        vitkit.create_model()


def test_cli_without_from_reads_the_format_from_the_container(tmp_path, capsys):
    model = rand_model()
    save_timm(model, tmp_path / "w.pth")
    assert main(["convert", str(tmp_path / "w.pth"), str(tmp_path / "ckpt"), "--model", "vit_test"]) == 0
    assert capsys.readouterr().out.startswith(f"read timm: {tmp_path / 'w.pth'}\nmodel: width 32, depth 2, heads 2")
    assert_same_logits(model, vitkit.load(tmp_path / "ckpt"))
    with pytest.raises(SystemExit) as e:  # a vitkit checkpoint goes nowhere without --to
        main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "again")])
    assert e.value.code == 2 and "give --from FORMAT" in capsys.readouterr().err
