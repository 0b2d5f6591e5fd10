import math
from functools import partial

import pytest
import torch
from helpers import tiny_model

import vitkit
from vitkit import ConfigError, ShapeError, VisionTransformer, ViTConfig
from vitkit.model.variants import REGISTRY

ATOL = 1e-5

# vit_test with 5 classes; the paper's zero head makes every logit 0, so the head is random: tests see real outputs
tiny = partial(tiny_model, num_classes=5, head_std=0.1)


# ---------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize(
    "name,millions",
    [
        ("vit_tiny_patch16_224", 5.72),
        ("vit_small_patch16_224", 22.05),
        ("vit_base_patch16_224", 86.57),
        ("vit_large_patch16_224", 304.33),
        ("vit_huge_patch14_224", 632.05),
    ],
)
def test_published_parameter_counts(name, millions):
    with torch.device("meta"):
        m = vitkit.create_model(name)
    assert round(vitkit.count_params(m) / 1e6, 2) == millions


def test_exact_base_count():
    with torch.device("meta"):
        m = vitkit.create_model("vit_base_patch16_224")
    assert vitkit.count_params(m) == 86_567_656  # ViT-B/16, 224 px, 1000 classes


def test_every_registered_model_builds():
    for name in REGISTRY:
        with torch.device("meta"):
            m = vitkit.create_model(name)
        assert m.cfg.embed_dim % m.cfg.num_heads == 0, name


def test_list_models_pattern():
    assert "vit_base_patch16_224" in vitkit.list_models("vit_base*")
    assert all("patch32" in n for n in vitkit.list_models("patch32"))
    assert vitkit.list_models("nothing-like-this") == []


def test_unknown_model_name():
    with pytest.raises(ConfigError, match="'vit_bsae_patch16_224' is not a known name"):
        vitkit.create_model("vit_bsae_patch16_224")


def test_tutorial_mnist_preset():
    m = vitkit.create_model("tutorial_mnist", seed=0).eval()
    c = m.cfg
    assert (c.img_size, c.patch_size, c.grid_size, c.embed_dim, c.num_heads, c.depth) == ((28, 28), 4, (7, 7), 8, 2, 1)
    assert c.mlp_hidden == 8 and c.act == "relu" and c.pos_embed == "sincos1d"
    assert isinstance(m.blocks[0].mlp.act, torch.nn.ReLU)
    probs = m(torch.rand(4, 1, 28, 28)).softmax(-1)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))


# ---------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(embed_dim=30, num_heads=4), r"ViTConfig.num_heads: embed_dim 30 is not divisible by num_heads 4"),
        (dict(img_size=30, patch_size=8), r"ViTConfig.img_size: 30x30 is not divisible by patch_size 8"),
        (dict(class_token=False, global_pool="token"), r"ViTConfig.global_pool: 'token' pooling needs class_token"),
        (dict(pos_embed="sincos2d", embed_dim=34, num_heads=2), r"ViTConfig.pos_embed: 'sincos2d' needs embed_dim"),
        (dict(drop_rate=1.0), r"ViTConfig.drop_rate: expected a finite number in \[0, 1\), got 1.0"),
        (dict(stem="conv", patch_size=6, img_size=36), r"ViTConfig.stem: .*power-of-two"),
        (dict(stem_convs=1), r"ViTConfig.stem_convs: extra stem convolutions need stem='conv'"),
        (dict(stem="conv", stem_convs=-1), r"ViTConfig.stem_convs: must be an integer >= 0"),
        (dict(img_size=(32, 0)), r"ViTConfig.img_size"),
        (dict(num_classes=-1), r"ViTConfig.num_classes"),
        (dict(reg_tokens=-1), r"ViTConfig.reg_tokens: must be an integer >= 0, got -1"),
        (dict(reg_tokens=4, class_token=False), r"ViTConfig.global_pool: 'token' pooling needs class_token"),
    ],
)
def test_bad_config_names_the_field(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        tiny(**kw)


def test_conv_stem_layers_and_grid():
    # patch 8: three stride-2 blocks (width 8, 16, 32), then two stride-1 blocks at the 4x4 grid, then 1x1
    m = tiny(stem="conv", stem_width=8, stem_convs=2)
    convs = [l for l in m.patch_embed.stem if isinstance(l, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.stride[0]) for c in convs] == [
        (3, 8, 2), (8, 16, 2), (16, 32, 2), (32, 32, 1), (32, 32, 1)]
    assert m.patch_embed.proj.in_channels == 32 and m.patch_embed.proj.out_channels == m.cfg.embed_dim
    x = torch.randn(2, 3, *m.cfg.img_size)
    assert m.patch_embed(x).shape == (2, m.cfg.num_patches, m.cfg.embed_dim)


def test_config_from_dict_is_strict():
    with pytest.raises(ConfigError, match=r"unknown field\(s\) 'embed_dims'"):
        ViTConfig.from_dict({"embed_dims": 3})
    with pytest.raises(ConfigError, match=r"ViTConfig.depth: expected an integer, got 'twelve'"):
        ViTConfig.from_dict({"depth": "twelve"})
    with pytest.raises(ConfigError, match=r"ViTConfig.global_pool: expected one of"):
        ViTConfig.from_dict({"global_pool": "max"})
    c = ViTConfig.from_dict(ViTConfig(img_size=(32, 64), patch_size=16).to_dict())
    assert c.img_size == (32, 64)


# ---------------------------------------------------------------------------------------- forward
def test_staged_api():
    m = tiny()
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    assert feats.shape == (2, 1 + 16, 32)
    pre = m.forward_head(feats, pre_logits=True)
    assert pre.shape == (2, 32)
    torch.testing.assert_close(m.forward_head(feats), m.head(pre))
    torch.testing.assert_close(m(x), m.forward_head(feats))


def test_fused_and_manual_models_agree_and_attention_maps():
    fused = tiny()
    manual = tiny(attn_impl="manual")
    manual.load_state_dict(fused.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(fused(x), manual(x), atol=ATOL, rtol=0)
    maps = fused.attention_maps(x)
    assert len(maps) == 2 and maps[0].shape == (2, 2, 17, 17)
    logits, maps2 = fused.forward_with_attention(x)
    torch.testing.assert_close(logits, fused(x), atol=ATOL, rtol=0)
    for a, b in zip(maps, maps2):
        torch.testing.assert_close(a, b)


def test_intermediate_layers():
    m = tiny(depth=3)
    x = torch.randn(2, 3, 32, 32)
    outs = m.get_intermediate_layers(x, n=2)
    assert len(outs) == 2 and outs[0].shape == (2, 17, 32)
    torch.testing.assert_close(m.norm(outs[-1]), m.forward_features(x))
    fmaps = m.get_intermediate_layers(x, n=[0, -1], reshape=True, return_prefix_tokens=True, norm=True)
    fmap, prefix = fmaps[1]
    assert fmap.shape == (2, 32, 4, 4) and prefix.shape == (2, 1, 32)
    # the map holds the patch tokens in raster order
    torch.testing.assert_close(fmap[:, :, 0, 1], m.forward_features(x)[:, 2])


def test_get_intermediate_layers_takes_timm_argument_order():
    m = tiny(depth=3)
    x = torch.randn(2, 3, 32, 32)
    maps = m.get_intermediate_layers(x, 2, True)  # (x, n, reshape, return_prefix_tokens, norm) as timm and DINO
    assert [t.shape for t in maps] == [(2, 32, 4, 4)] * 2
    pairs = m.get_intermediate_layers(x, [1], False, True, True)  # NLC patch tokens and the prefix, normalised
    (patches, prefix), = pairs
    tokens = m.get_intermediate_layers(x, [1], norm=True)[0]
    assert torch.equal(patches, tokens[:, 1:]) and torch.equal(prefix, tokens[:, :1])
    assert len(m.get_intermediate_layers(x, [2, 0, -1])) == 2  # block order, each block once (timm)


# ------------------------------------------------------------------------------- forward_intermediates
@pytest.mark.parametrize("kw", [dict(), dict(reg_tokens=2), dict(class_token=False, global_pool="avg")])
def test_forward_intermediates_layout(kw):
    m = tiny(depth=3, **kw)
    P = m.num_prefix_tokens
    x = torch.randn(2, 3, 32, 32)
    final, maps = m.forward_intermediates(x)  # every block, NCHW, un-normalised
    torch.testing.assert_close(final, m.forward_features(x))
    assert len(maps) == 3 and all(t.shape == (2, 32, 4, 4) for t in maps)
    tokens = m.get_intermediate_layers(x, 3)
    for fmap, t in zip(maps, tokens):
        assert torch.equal(fmap.flatten(2).transpose(1, 2), t[:, P:])  # patch tokens in raster order
    nlc = m.forward_intermediates(x, indices=[-1, 0], norm=True, output_fmt="NLC", intermediates_only=True)
    assert [t.shape for t in nlc] == [(2, 16, 32)] * 2  # block order, prefix cut off
    torch.testing.assert_close(nlc[1], m.forward_features(x)[:, P:])
    with_prefix = m.forward_intermediates(x, 1, return_prefix_tokens=True, intermediates_only=True)
    if P:
        (fmap, prefix), = with_prefix
        assert fmap.shape == (2, 32, 4, 4) and prefix.shape == (2, P, 32)
    else:  # nothing to pair with: plain maps, as timm
        assert with_prefix[0].shape == (2, 32, 4, 4)


def test_forward_intermediates_stop_early_and_dict():
    m = tiny(depth=3, reg_tokens=1)
    x = torch.randn(2, 3, 32, 32)
    final, (fmap,) = m.forward_intermediates(x, indices=[1], stop_early=True)
    block1 = m.get_intermediate_layers(x, [1])[0]
    torch.testing.assert_close(final, m.norm(block1))  # the last block run is block 1
    out = m.forward_intermediates(x, 2, return_prefix_tokens=True, output_fmt="NLC", output_dict=True)
    assert sorted(out) == ["image_features", "image_intermediates", "image_intermediates_prefix"]
    assert [t.shape for t in out["image_intermediates_prefix"]] == [(2, 2, 32)] * 2
    out = m.forward_intermediates(x, 2, output_dict=True, intermediates_only=True)
    assert sorted(out) == ["image_intermediates"]


@pytest.mark.parametrize("call, msg", [
    (dict(indices=4), r"^forward_intermediates: indices: the number of last blocks must be in 1\.\.3, got 4$"),
    (dict(indices=[0, 3]), r"^forward_intermediates: indices: block indices must be in -3\.\.2, got \[0, 3\]$"),
    (dict(indices=[]), r"block indices must be in -3\.\.2, got \[\]$"),
    (dict(output_fmt="NHWC"), r"^forward_intermediates: output_fmt must be 'NCHW' or 'NLC', got 'NHWC'$"),
])
def test_forward_intermediates_errors(call, msg):
    with pytest.raises(ConfigError, match=msg):
        tiny(depth=3).forward_intermediates(torch.randn(1, 3, 32, 32), **call)
    with pytest.raises(ConfigError, match=r"^get_intermediate_layers: n: block indices must be in -3\.\.2"):
        tiny(depth=3).get_intermediate_layers(torch.randn(1, 3, 32, 32), [-4], True)


# ---------------------------------------------------------------------------------------- registers
def test_register_tokens_order_shapes_and_positions():
    m = tiny(reg_tokens=3)
    assert (m.num_prefix_tokens, m.num_reg_tokens, tuple(m.reg_token.shape)) == (4, 3, (1, 3, 32))
    assert m.pos_embed.shape == (1, 4 + 16, 32)  # a slot for every token (timm's default layout)
    x = torch.randn(2, 3, 32, 32)
    tokens = m.embed_positions(m.patch_embed(x), (4, 4))  # [cls], registers, patches
    torch.testing.assert_close(tokens[:, 0], (m.cls_token + m.pos_embed[:, :1])[:, 0].expand(2, -1))
    torch.testing.assert_close(tokens[:, 1:4], (m.reg_token + m.pos_embed[:, 1:4]).expand(2, -1, -1))
    assert m.forward_features(x).shape == (2, 4 + 16, 32)
    assert [a.shape for a in m.attention_maps(x)] == [(2, 2, 20, 20)] * 2  # every token, registers included
    patch_only = tiny(reg_tokens=3, no_embed_class=True)  # DINOv2 with registers: no position on the prefix
    assert patch_only.pos_embed.shape == (1, 16, 32)
    tokens = patch_only.embed_positions(patch_only.patch_embed(x), (4, 4))
    assert torch.equal(tokens[:, 1:4], patch_only.reg_token.expand(2, -1, -1))


@pytest.mark.parametrize("pool", ["avg", "map"])
def test_registers_are_not_pooled(pool):
    m = tiny(reg_tokens=2, global_pool=pool)
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    changed = feats.clone()
    changed[:, :3] = torch.randn(2, 3, 32)  # new [cls] and register tokens: the pooled features stay
    torch.testing.assert_close(m.forward_head(changed), m.forward_head(feats), atol=0, rtol=0)
    if pool == "avg":
        torch.testing.assert_close(m.pool(feats), feats[:, 3:].mean(1))


def test_registers_resample_and_dynamic_size_agree():
    m = tiny(reg_tokens=2)
    dyn = tiny(reg_tokens=2, dynamic_img_size=True)
    dyn.load_state_dict(m.state_dict())
    x = torch.randn(1, 3, 48, 40)
    y = dyn(x)
    m.resample_to((48, 40))
    assert m.pos_embed.shape == (1, 3 + 30, 32)
    torch.testing.assert_close(m(x), y, atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------- qk-norm and MAP
def test_qk_norm_is_one_layernorm_over_the_head_dim():
    fused = tiny(qk_norm=True)
    attn = fused.blocks[0].attn
    assert isinstance(attn.q_norm, torch.nn.LayerNorm) and attn.q_norm.normalized_shape == (16,)
    assert attn.k_norm.eps == fused.cfg.norm_eps
    for p in attn.q_norm.parameters():  # make the norms matter
        p.data.normal_()
    manual = tiny(qk_norm=True, attn_impl="manual")
    manual.load_state_dict(fused.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(fused(x), manual(x), atol=ATOL, rtol=0)
    logits, maps = fused.forward_with_attention(x)
    torch.testing.assert_close(logits, fused(x), atol=ATOL, rtol=0)
    # the maps come from the normalised queries and keys
    tokens = fused.embed_positions(fused.patch_embed(x), (4, 4))
    q, k, _ = attn.split_heads(fused.blocks[0].norm1(tokens))
    ref = (q @ k.transpose(-2, -1) * attn.scale).softmax(-1)
    torch.testing.assert_close(maps[0], ref, atol=ATOL, rtol=0)


def test_attention_pooling_head():
    m = tiny(global_pool="map", reg_tokens=1)
    pool = m.attn_pool
    assert m.cfg.use_fc_norm is False and isinstance(m.fc_norm, torch.nn.Identity)
    assert tuple(pool.latent.shape) == (1, 1, 32) and pool.kv.weight.shape == (64, 32)
    assert pool.mlp.fc1.out_features == m.cfg.mlp_hidden
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    patches = feats[:, m.num_prefix_tokens:]
    pooled, probs = pool.forward_with_attention(patches)
    assert pooled.shape == (2, 32) and probs.shape == (2, 2, 1, 16)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, 1), atol=ATOL, rtol=0)
    torch.testing.assert_close(pooled, pool(patches), atol=ATOL, rtol=0)  # fused and manual agree
    torch.testing.assert_close(m.forward_head(feats, pre_logits=True), pool(patches))
    # the probe's attention weights the values: pooled = mlp residual on proj(sum_t p_t v_t)
    k, v = pool.kv(patches).reshape(2, 16, 2, 2, 16).permute(2, 0, 3, 1, 4).unbind(0)
    attended = pool.proj((probs @ v).transpose(1, 2).reshape(2, 1, 32))
    torch.testing.assert_close(pooled, (attended + pool.mlp(pool.norm(attended)))[:, 0], atol=ATOL, rtol=0)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False), torch.no_grad():  # as `vitkit bench` counts FLOPs
        m(x[:1])


def test_new_parameters_initialisation():
    torch.manual_seed(0)
    m = VisionTransformer(ViTConfig(img_size=64, patch_size=16, embed_dim=256, depth=1, num_heads=4, reg_tokens=16,
                                    global_pool="map", qk_norm=True))
    assert 0.5e-6 < m.reg_token.std().item() < 1.5e-6  # timm: normal, std 1e-6
    std = 256**-0.5
    assert m.attn_pool.latent.abs().max().item() <= 2 * std  # truncated normal at 2 std (timm)
    assert torch.equal(m.blocks[0].attn.q_norm.weight, torch.ones(64))
    assert m.attn_pool.mlp.fc1.bias.abs().max().item() < 1e-5  # the paper's MLP bias init, here too
    assert {"reg_token", "cls_token", "pos_embed"} <= m.no_weight_decay()


@pytest.mark.parametrize(
    "kw",
    [
        dict(global_pool="avg", class_token=False),
        dict(global_pool="avg"),
        dict(global_pool="none"),
        dict(pos_embed="sincos1d"),
        dict(pos_embed="sincos2d", global_pool="avg", class_token=False),
        dict(pos_embed="none"),
        dict(no_embed_class=True),
        dict(norm="post"),
        dict(act="relu", mlp_ratio=1.0),
        dict(stem="conv"),
        dict(stem="conv", stem_convs=2),
        dict(patch_embed="linear"),
        dict(representation_size=16),
        dict(layer_scale=1e-5),
        dict(num_classes=0),
        dict(img_size=(32, 48)),
        dict(in_chans=1),
        dict(reg_tokens=4),
        dict(reg_tokens=2, no_embed_class=True),
        dict(reg_tokens=1, class_token=False, global_pool="avg", pos_embed="sincos2d"),
        dict(reg_tokens=2, global_pool="none"),
        dict(qk_norm=True),
        dict(qk_norm=True, norm="post"),
        dict(global_pool="map"),
        dict(global_pool="map", class_token=False, reg_tokens=3, qk_norm=True, attn_impl="manual"),
    ],
)
def test_variants_run(kw):
    m = tiny(**kw)
    c = m.cfg
    x = torch.randn(2, c.in_chans, *c.img_size)
    y = m(x)
    if c.global_pool == "none":
        assert y.shape == (2, c.num_prefix_tokens + c.num_patches, c.num_classes)
    else:
        assert y.shape == (2, c.num_classes or m.num_features)
    assert torch.isfinite(y).all()


def test_pooling_semantics():
    m = tiny(global_pool="avg", class_token=False)
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    torch.testing.assert_close(m.forward_head(feats, pre_logits=True), m.fc_norm(feats.mean(1)))
    assert isinstance(m.norm, torch.nn.Identity)  # timm: with avg pooling the norm moves after pooling
    m = tiny()
    feats = m.forward_features(x)
    torch.testing.assert_close(m.forward_head(feats, pre_logits=True), feats[:, 0])


def test_post_ln_block():
    m = tiny(norm="post", depth=1)
    blk = m.blocks[0]
    x = torch.randn(2, 17, 32)
    h = blk.norm1(x + blk.attn(x))
    ref = blk.norm2(h + blk.mlp(h))
    torch.testing.assert_close(blk(x), ref, atol=ATOL, rtol=0)
    out, attn = blk.forward_with_attention(x)  # the same block, and its attention on request
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=0)
    assert attn.shape == (2, 2, 17, 17)
    assert isinstance(m.norm, torch.nn.Identity)


def test_sincos_models_have_no_learned_positions():
    m = tiny(pos_embed="sincos2d", class_token=False, global_pool="avg")
    assert m.pos_embed is None and "pos_embed" not in m.state_dict()


def test_dropout_and_droppath_only_in_training():
    m = tiny(drop_rate=0.3, attn_drop_rate=0.3, drop_path_rate=0.3)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(m(x), m(x))
    m.train()
    assert not torch.allclose(m(x), m(x))
    assert [round(b.drop_path1.p, 3) for b in m.blocks] == [0.0, 0.3]


# ---------------------------------------------------------------------------------- gradient checkpointing
def step_with_checkpointing(m, x, enable: bool):
    """One forward + backward of ``m`` from the same RNG state, checkpointing on or off: the output, the
    gradients, and how many tensors the autograd graph saved outside the checkpointed blocks."""
    m.set_grad_checkpointing(enable)
    m.zero_grad(set_to_none=True)
    saved = []
    torch.manual_seed(1)  # the same dropout and drop-path draws in both
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = m(x)
    if out.requires_grad:
        out.square().sum().backward()
    grads = {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}
    return out.detach(), grads, len(saved)


def test_grad_checkpointing_keeps_outputs_and_gradients_with_dropout_and_drop_path():
    m = tiny(drop_rate=0.1, attn_drop_rate=0.1, drop_path_rate=0.5, attn_impl="manual").train()
    x = torch.randn(4, 3, 32, 32)
    out, grads, saved = step_with_checkpointing(m, x, False)
    out_ck, grads_ck, saved_ck = step_with_checkpointing(m, x, True)
    assert torch.equal(out, out_ck)  # the recomputation replays the RNG state: the same masks
    assert grads.keys() == grads_ck.keys() and len(grads) == len(list(m.parameters()))
    for k in grads:
        torch.testing.assert_close(grads_ck[k], grads[k], rtol=0, atol=1e-6, msg=k)
    assert saved_ck < saved  # the blocks kept only their inputs


@pytest.mark.parametrize("mode", ["eval", "no_grad"])
def test_grad_checkpointing_is_off_in_eval_and_without_gradients(mode):
    m = tiny(drop_path_rate=0.5)
    m.train(mode == "no_grad")
    x = torch.randn(2, 3, 32, 32)
    with torch.set_grad_enabled(mode == "eval"):
        off, on = step_with_checkpointing(m, x, False), step_with_checkpointing(m, x, True)
    assert torch.equal(off[0], on[0]) and off[2] == on[2]  # the same output from the same graph
    assert m.grad_checkpointing  # still on for the next training step



# ---------------------------------------------------------------------------------------- sizes at run time
def test_resample_to_and_dynamic_size_agree():
    m = tiny()
    dyn = tiny(dynamic_img_size=True)
    dyn.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, 48, 64)
    y_dyn = dyn(x)
    m.resample_to((48, 64))
    assert m.cfg.img_size == (48, 64) and m.pos_embed.shape == (1, 1 + 6 * 8, 32)
    torch.testing.assert_close(m(x), y_dyn, atol=ATOL, rtol=0)
    # at the built size the dynamic model is the plain model
    torch.testing.assert_close(dyn(torch.zeros(1, 3, 32, 32)), tiny()(torch.zeros(1, 3, 32, 32)), atol=ATOL, rtol=0)


def test_resample_round_trip_nearest_is_identity():
    m = tiny()
    before = m.pos_embed.detach().clone()
    m.resample_to(64, mode="nearest")
    m.resample_to(32, mode="nearest")
    torch.testing.assert_close(m.pos_embed.detach(), before)


def test_dynamic_size_sincos2d():
    m = tiny(pos_embed="sincos2d", class_token=False, global_pool="avg", dynamic_img_size=True)
    assert m(torch.randn(1, 3, 40, 24)).shape == (1, 5)


@pytest.mark.parametrize("patch", [16, 4])
def test_patch_size_resampled_model_runs_and_conv_equals_linear(patch):
    conv = tiny()
    linear = tiny(patch_embed="linear")
    linear.load_state_dict(conv.state_dict())
    for m in (conv, linear):
        m.resample_patch_size(patch)
        grid = 32 // patch
        assert m.cfg.patch_size == patch and m.cfg.img_size == (32, 32) and m.cfg.grid_size == (grid, grid)
        assert m.patch_embed.proj.weight.shape == (32, 3, patch, patch) and m.pos_embed.shape == (1, 1 + grid**2, 32)
    x = torch.randn(2, 3, 32, 32)
    assert conv(x).shape == (2, 5)
    torch.testing.assert_close(linear(x), conv(x), atol=ATOL, rtol=0)


def test_patch_size_resampling_end_to_end():
    """Patch 8 -> 16 on images whose 8x8 patches are each enlarged to 16x16 (bicubic with antialias, the
    resize the kernel assumes by default): the same logits. A fixed sin-cos table gives the same
    positions to the same grid."""
    m8 = tiny(pos_embed="sincos2d", dynamic_img_size=True)
    m16 = tiny(pos_embed="sincos2d", dynamic_img_size=True)
    m16.resample_patch_size(16)
    x = torch.randn(2, 3, 32, 32)
    patches = x.reshape(2, 3, 4, 8, 4, 8).permute(0, 2, 4, 1, 3, 5).reshape(32, 3, 8, 8)
    big = torch.nn.functional.interpolate(patches, size=(16, 16), mode="bicubic", antialias=True)  # as assumed
    big = big.reshape(2, 4, 4, 3, 16, 16).permute(0, 3, 1, 4, 2, 5).reshape(2, 3, 64, 64)
    torch.testing.assert_close(m16(big), m8(x), rtol=1e-4, atol=1e-4)


def test_patch_size_resampling_errors():
    with pytest.raises(ConfigError, match=r"^ViTConfig.img_size: 32x32 is not divisible by patch_size 12$"):
        tiny().resample_patch_size(12)
    with pytest.raises(ConfigError, match=r"^resample_patch_size: the conv stem \(stem='conv'\) has no patch kernel"):
        tiny(stem="conv").resample_patch_size(4)
    with pytest.raises(ConfigError, match=r"^resample_patch_size: mode 'area' is not one of bicubic, bilinear"):
        tiny().resample_patch_size(16, mode="area")
    m = tiny()
    with pytest.raises(ConfigError, match=r"^ViTConfig.patch_size: must be a positive integer, got 0$"):
        m.resample_patch_size(0)
    assert m.cfg.patch_size == 8 and m.patch_embed.proj.weight.shape[-1] == 8  # a refusal changes nothing


def test_224_model_runs_at_384():
    cfg = ViTConfig(img_size=224, patch_size=16, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    m = VisionTransformer(cfg).eval()
    m.resample_to(384)
    assert m(torch.randn(1, 3, 384, 384)).shape == (1, 3)
    assert m.pos_embed.shape[1] == 1 + 24 * 24


# ---------------------------------------------------------------------------------------- input checks
@pytest.mark.parametrize(
    "x,msg",
    [
        (torch.randn(3, 32, 32), r"input: expected a float tensor \(B, 3, 32, 32\), got shape \(3, 32, 32\) .*rank 3"),
        (torch.randn(2, 1, 32, 32), r"got shape \(2, 1, 32, 32\) dtype float32 \(1 channels, model takes 3\)"),
        (torch.zeros(2, 3, 32, 32, dtype=torch.uint8), r"dtype uint8; convert images with .float\(\) / 255"),
        (torch.randn(2, 3, 48, 32), r"got shape \(2, 3, 48, 32\).*dynamic_img_size=True or call resample_to"),
    ],
)
def test_input_errors(x, msg):
    with pytest.raises(ShapeError, match=msg):
        tiny()(x)


def test_dynamic_size_rejects_non_multiple():
    with pytest.raises(ShapeError, match="multiples of patch size 8"):
        tiny(dynamic_img_size=True)(torch.randn(1, 3, 36, 32))


# ---------------------------------------------------------------------------------------- init
def test_seeded_init_is_deterministic():
    a = vitkit.create_model("vit_test", seed=3)
    b = vitkit.create_model("vit_test", seed=3)
    c = vitkit.create_model("vit_test", seed=4)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k
    assert not torch.equal(a.pos_embed, c.pos_embed)


def test_jax_init_statistics():
    torch.manual_seed(0)
    m = VisionTransformer(ViTConfig(img_size=64, patch_size=16, embed_dim=256, depth=1, num_heads=4, num_classes=7))
    assert torch.count_nonzero(m.head.weight) == 0 and torch.count_nonzero(m.cls_token) == 0
    assert abs(m.pos_embed.std().item() - 0.02) < 0.003
    fan_in = 3 * 16 * 16
    assert abs(m.patch_embed.proj.weight.std().item() - math.sqrt(1 / fan_in)) < 0.1 * math.sqrt(1 / fan_in)
    bound = math.sqrt(6 / (256 + 768))  # xavier uniform of qkv (768 x 256)
    assert m.blocks[0].attn.qkv.weight.abs().max().item() <= bound
    assert m.blocks[0].mlp.fc1.bias.abs().max().item() < 1e-5


def test_timm_init_statistics():
    torch.manual_seed(0)
    m = VisionTransformer(ViTConfig(img_size=64, patch_size=16, embed_dim=256, depth=1, num_heads=4, init="timm"))
    assert abs(m.blocks[0].mlp.fc1.weight.std().item() - 0.02) < 0.002
    assert torch.count_nonzero(m.blocks[0].mlp.fc1.bias) == 0


# (sum, sum of absolute values) of every parameter right after VisionTransformer(cfg) at seed 0, recorded
# once: a change to the init functions, or to the order in which they draw, shows here.
PINNED_CONFIGS = {
    "jax": dict(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0, num_classes=3,
                representation_size=8, layer_scale=0.5),
    "timm_conv_stem": dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0,
                           num_classes=3, init="timm", stem="conv", stem_width=4, stem_convs=1, qkv_bias=False,
                           class_token=False, global_pool="avg"),
    "jax_registers_qk_norm_map": dict(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0,
                                      num_classes=3, reg_tokens=2, qk_norm=True, global_pool="map"),
    "timm_registers_no_embed_class": dict(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2,
                                          mlp_ratio=2.0, num_classes=3, init="timm", reg_tokens=3, class_token=False,
                                          global_pool="avg", no_embed_class=True),
}
PINNED_SUMS = {
    "jax": {
        "cls_token": (0, 0),
        "pos_embed": (0.232839325, 1.14547004),
        "patch_embed.proj.weight": (6.44598491, 184.215827),
        "patch_embed.proj.bias": (0, 0),
        "blocks.0.norm1.weight": (16, 16),
        "blocks.0.norm1.bias": (0, 0),
        "blocks.0.attn.qkv.weight": (-4.56393822, 116.693864),
        "blocks.0.attn.qkv.bias": (0, 0),
        "blocks.0.attn.proj.weight": (1.25003355, 56.0430114),
        "blocks.0.attn.proj.bias": (0, 0),
        "blocks.0.ls1.gamma": (8, 8),
        "blocks.0.norm2.weight": (16, 16),
        "blocks.0.norm2.bias": (0, 0),
        "blocks.0.mlp.fc1.weight": (4.68750639, 92.0363888),
        "blocks.0.mlp.fc1.bias": (8.86184619e-06, 2.72437389e-05),
        "blocks.0.mlp.fc2.weight": (5.12675871, 87.3573987),
        "blocks.0.mlp.fc2.bias": (-1.66958027e-06, 1.32473262e-05),
        "blocks.0.ls2.gamma": (8, 8),
        "norm.weight": (16, 16),
        "norm.bias": (0, 0),
        "pre_logits.fc.weight": (-1.15517993, 26.9092073),
        "pre_logits.fc.bias": (0, 0),
        "head.weight": (0, 0),
        "head.bias": (0, 0),
    },
    "timm_conv_stem": {
        "pos_embed": (-0.0258228248, 3.33865622),
        "patch_embed.stem.0.weight": (-3.15684369, 21.5547899),
        "patch_embed.stem.1.weight": (4, 4),
        "patch_embed.stem.1.bias": (0, 0),
        "patch_embed.stem.3.weight": (2.92781646, 37.8548262),
        "patch_embed.stem.4.weight": (8, 8),
        "patch_embed.stem.4.bias": (0, 0),
        "patch_embed.stem.6.weight": (-2.72099833, 75.3462492),
        "patch_embed.stem.7.weight": (8, 8),
        "patch_embed.stem.7.bias": (0, 0),
        "patch_embed.proj.weight": (-2.52465219, 34.6552869),
        "patch_embed.proj.bias": (0, 0),
        "blocks.0.norm1.weight": (16, 16),
        "blocks.0.norm1.bias": (0, 0),
        "blocks.0.attn.qkv.weight": (-1.25224551, 12.1649977),
        "blocks.0.attn.proj.weight": (-0.149568253, 3.84775074),
        "blocks.0.attn.proj.bias": (0, 0),
        "blocks.0.norm2.weight": (16, 16),
        "blocks.0.norm2.bias": (0, 0),
        "blocks.0.mlp.fc1.weight": (-0.204380947, 8.38382339),
        "blocks.0.mlp.fc1.bias": (0, 0),
        "blocks.0.mlp.fc2.weight": (-0.200844121, 8.25090961),
        "blocks.0.mlp.fc2.bias": (0, 0),
        "fc_norm.weight": (16, 16),
        "fc_norm.bias": (0, 0),
        "head.weight": (0.0800482024, 0.858889567),
        "head.bias": (0, 0),
    },
    "jax_registers_qk_norm_map": {
        "cls_token": (0, 0),
        "reg_token": (1.9759568e-06, 2.2578756e-05),
        "pos_embed": (-0.149179913, 1.65049805),
        "patch_embed.proj.weight": (-2.544865, 182.414113),
        "patch_embed.proj.bias": (0, 0),
        "blocks.0.norm1.weight": (16, 16),
        "blocks.0.norm1.bias": (0, 0),
        "blocks.0.attn.qkv.weight": (1.49898482, 118.98262),
        "blocks.0.attn.qkv.bias": (0, 0),
        "blocks.0.attn.q_norm.weight": (8, 8),
        "blocks.0.attn.q_norm.bias": (0, 0),
        "blocks.0.attn.k_norm.weight": (8, 8),
        "blocks.0.attn.k_norm.bias": (0, 0),
        "blocks.0.attn.proj.weight": (1.96412281, 55.0071093),
        "blocks.0.attn.proj.bias": (0, 0),
        "blocks.0.norm2.weight": (16, 16),
        "blocks.0.norm2.bias": (0, 0),
        "blocks.0.mlp.fc1.weight": (-1.18107484, 91.579503),
        "blocks.0.mlp.fc1.bias": (2.24302942e-06, 2.39310882e-05),
        "blocks.0.mlp.fc2.weight": (-1.78255115, 93.1221478),
        "blocks.0.mlp.fc2.bias": (8.00736899e-08, 1.45158715e-05),
        "norm.weight": (16, 16),
        "norm.bias": (0, 0),
        "attn_pool.latent": (0.535442926, 3.59655703),
        "attn_pool.q.weight": (1.46784043, 55.5924036),
        "attn_pool.q.bias": (0, 0),
        "attn_pool.kv.weight": (-0.23222429, 90.1441031),
        "attn_pool.kv.bias": (0, 0),
        "attn_pool.proj.weight": (2.34642437, 55.5854651),
        "attn_pool.proj.bias": (0, 0),
        "attn_pool.norm.weight": (16, 16),
        "attn_pool.norm.bias": (0, 0),
        "attn_pool.mlp.fc1.weight": (2.97999689, 89.2890687),
        "attn_pool.mlp.fc1.bias": (-5.42243432e-07, 2.20983692e-05),
        "attn_pool.mlp.fc2.weight": (0.533034058, 90.1559103),
        "attn_pool.mlp.fc2.bias": (-2.54002767e-06, 1.40149382e-05),
        "head.weight": (0, 0),
        "head.bias": (0, 0),
    },
    "timm_registers_no_embed_class": {
        "reg_token": (1.22837506e-05, 3.7102437e-05),
        "pos_embed": (0.0110600376, 0.929877392),
        "patch_embed.proj.weight": (7.59624569, 184.646921),
        "patch_embed.proj.bias": (0, 0),
        "blocks.0.norm1.weight": (16, 16),
        "blocks.0.norm1.bias": (0, 0),
        "blocks.0.attn.qkv.weight": (-1.03453296, 12.1622534),
        "blocks.0.attn.qkv.bias": (0, 0),
        "blocks.0.attn.proj.weight": (0.41935841, 4.17304626),
        "blocks.0.attn.proj.bias": (0, 0),
        "blocks.0.norm2.weight": (16, 16),
        "blocks.0.norm2.bias": (0, 0),
        "blocks.0.mlp.fc1.weight": (-0.0500536894, 8.11369942),
        "blocks.0.mlp.fc1.bias": (0, 0),
        "blocks.0.mlp.fc2.weight": (0.321001887, 8.51788464),
        "blocks.0.mlp.fc2.bias": (0, 0),
        "fc_norm.weight": (16, 16),
        "fc_norm.bias": (0, 0),
        "head.weight": (0.279124713, 0.77283711),
        "head.bias": (0, 0),
    },
}


@pytest.mark.parametrize("name", sorted(PINNED_CONFIGS))
def test_initial_weights_are_pinned(name):
    torch.manual_seed(0)
    m = VisionTransformer(ViTConfig(**PINNED_CONFIGS[name]))
    got = {k: p.detach().double() for k, p in m.named_parameters()}
    assert list(got) == list(PINNED_SUMS[name])
    for k, (total, magnitude) in PINNED_SUMS[name].items():
        tol = 1e-6 * magnitude  # relative to the tensor's size: sums of zero-mean draws can be near 0
        assert abs(got[k].sum().item() - total) <= tol, k
        assert abs(got[k].abs().sum().item() - magnitude) <= tol, k


def test_reset_head():
    m = tiny()
    m.reset_head(3, labels=["a", "b", "c"])
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 3) and m.cfg.num_classes == 3 and m.labels == ["a", "b", "c"]
