"""Same random weights, same logits in vitkit and timm's VisionTransformer, both directions (float32, 1e-5).

timm is not in the main environment: these tests skip there. `bash benchmarks/parity.sh` runs them.
"""

import pytest
import torch

from vitkit import ViTConfig, VisionTransformer
from vitkit.errors import CheckpointError
from vitkit.io.convert import from_timm, to_timm
from vitkit.io.timm import save_timm, timm_model_kwargs

from helpers import assert_same_logits, random_images, randomize

timm_vit = pytest.importorskip("timm.models.vision_transformer")

TOL = 1e-5

CONFIGS = {
    "token": dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=10),
    "avg_no_cls": dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=7,
                       class_token=False, global_pool="avg", fc_norm=False),
    "avg_fc_norm": dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5,
                        global_pool="avg"),
    "nonsquare_layer_scale": dict(img_size=(24, 40), patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                  num_classes=3, layer_scale=1e-5, qkv_bias=False),
    "eps_grey_mlp2": dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=4,
                          num_classes=4, norm_eps=1e-12, mlp_ratio=2.0),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_vitkit_to_timm(name):
    cfg = ViTConfig(**CONFIGS[name])
    model = randomize(VisionTransformer(cfg))
    ref = timm_vit.VisionTransformer(**timm_model_kwargs(cfg)).eval()
    ref.load_state_dict(to_timm(model), strict=True)
    assert_same_logits(model, ref, random_images(cfg), tol=TOL)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_timm_to_vitkit(name, tmp_path):
    cfg = ViTConfig(**CONFIGS[name])
    ref = randomize(timm_vit.VisionTransformer(**timm_model_kwargs(cfg)), seed=2)
    torch.save(ref.state_dict(), tmp_path / "w.pth")
    sets = {"num_heads": cfg.num_heads, "norm_eps": cfg.norm_eps}
    if cfg.img_size[0] != cfg.img_size[1]:
        sets["img_size"] = list(cfg.img_size)
    model = from_timm(tmp_path / "w.pth", overrides=sets)
    for field in ("embed_dim", "depth", "patch_size", "in_chans", "class_token", "global_pool", "use_fc_norm",
                  "qkv_bias", "num_classes", "img_size", "mlp_hidden"):
        assert getattr(model.cfg, field) == getattr(cfg, field), field
    assert (model.cfg.layer_scale is None) == (cfg.layer_scale is None)
    assert_same_logits(model, ref, random_images(cfg), tol=TOL)


@pytest.mark.parametrize("pos", ["sincos2d", "sincos1d", "none", "no_embed_class"])
def test_fixed_and_patch_only_position_tables_become_learned(pos):
    extra = {"no_embed_class": True} if pos == "no_embed_class" else {"pos_embed": pos}
    cfg = ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=3, **extra)
    model = randomize(VisionTransformer(cfg))
    ref = timm_vit.VisionTransformer(**timm_model_kwargs(cfg)).eval()
    ref.load_state_dict(to_timm(model), strict=True)
    assert_same_logits(model, ref, random_images(cfg), tol=TOL)


def test_resampled_position_table_matches_timm_with_antialias(tmp_path):
    """--img-size with antialias reproduces timm's own resampling (timm resamples with antialias)."""
    from timm.layers import resample_abs_pos_embed

    cfg = ViTConfig(**CONFIGS["token"])
    model = randomize(VisionTransformer(cfg))
    model.resample_to(48, antialias=True)
    ref_pe = resample_abs_pos_embed(to_timm(randomize(VisionTransformer(cfg)))["pos_embed"], (6, 6),
                                    num_prefix_tokens=1)
    assert (model.pos_embed - ref_pe).abs().max().item() <= 1e-6


@pytest.mark.parametrize("new_patch", [16, 4])
def test_patch_size_resampling_matches_timm(new_patch):
    """resample_patch_size reproduces timm's loading of a checkpoint into a model of another patch size
    (checkpoint_filter_fn: resample_patch_embed and resample_abs_pos_embed at their defaults)."""
    from timm.layers import resample_patch_embed

    cfg = ViTConfig(**CONFIGS["token"])  # patch 8 at 32x32
    model = randomize(VisionTransformer(cfg))
    weights = to_timm(model)
    model.resample_patch_size(new_patch)
    ref_kernel = resample_patch_embed(weights["patch_embed.proj.weight"], [new_patch, new_patch])
    torch.testing.assert_close(model.patch_embed.proj.weight, ref_kernel, rtol=1e-5,
                               atol=1e-5 * ref_kernel.abs().max().item())
    ref = timm_vit.VisionTransformer(**timm_model_kwargs(model.cfg)).eval()
    ref.load_state_dict(timm_vit.checkpoint_filter_fn(weights, ref), strict=True)
    assert_same_logits(model, ref, random_images(model.cfg), tol=TOL)


def test_save_timm_files_load_in_timm(tmp_path):
    cfg = ViTConfig(**CONFIGS["avg_fc_norm"])
    model = randomize(VisionTransformer(cfg))
    x = random_images(cfg)
    for name in ("w.safetensors", "w.pth"):
        save_timm(model, tmp_path / name)
        ref = timm_vit.VisionTransformer(**timm_model_kwargs(cfg)).eval()
        from vitkit.io.checkpoint import load_state_dict_file

        ref.load_state_dict(load_state_dict_file(tmp_path / name), strict=True)
        assert_same_logits(model, ref, x, tol=TOL)


def test_timm_features_vitkit_lacks_are_named():
    kw = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    ref = timm_vit.VisionTransformer(**kw, reg_tokens=2)
    with pytest.raises(CheckpointError, match=r"^timm state dict: holds register tokens \(reg_token \(1, 2, 32\)\)"):
        from_timm(ref.state_dict(), overrides={"num_heads": 2})
    ref = timm_vit.VisionTransformer(**kw, qk_norm=True)
    with pytest.raises(CheckpointError, match=r"unexpected: blocks\.0\.attn\.q_norm\.weight, blocks\.0\.attn\.q_norm"):
        from_timm(ref.state_dict(), overrides={"num_heads": 2})
