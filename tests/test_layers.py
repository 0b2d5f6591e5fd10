"""The alternative designs of the tutorials compute the same thing (float32, stated tolerances)."""

import pytest
import torch

from vitkit.model.layers import (
    Attention,
    AttentionPool,
    Block,
    PatchEmbed,
    PatchWhitening,
    PerHeadAttention,
    patch_whitening,
    resample_pos_embed,
    sincos_1d,
    sincos_2d,
)

ATOL = 1e-5


@pytest.mark.parametrize("patch,chans,hw", [(4, 1, (28, 28)), (8, 3, (32, 48)), (16, 3, (32, 32))])
def test_patch_embed_conv_equals_linear(patch, chans, hw):
    torch.manual_seed(0)
    conv = PatchEmbed(patch, chans, 24, mode="conv")
    lin = PatchEmbed(patch, chans, 24, mode="linear")
    lin.load_state_dict(conv.state_dict())  # one parameter layout: loads unchanged
    x = torch.randn(2, chans, *hw)
    a, b = conv(x), lin(x)
    assert a.shape == (2, (hw[0] // patch) * (hw[1] // patch), 24)
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_patch_embed_linear_is_a_linear_layer_on_flattened_patches():
    """Space-to-depth in (C, P, P) order, then an nn.Linear holding the conv weight as (D, C*P*P)."""
    torch.manual_seed(0)
    pe = PatchEmbed(4, 3, 16, mode="linear")
    x = torch.randn(1, 3, 8, 8)
    lin = torch.nn.Linear(48, 16)
    lin.weight.data = pe.proj.weight.data.reshape(16, 48)
    lin.bias.data = pe.proj.bias.data
    patches = [x[0, :, r * 4 : r * 4 + 4, c * 4 : c * 4 + 4].reshape(-1) for r in range(2) for c in range(2)]
    ref = lin(torch.stack(patches))[None]
    torch.testing.assert_close(pe(x), ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("bias, qk_norm", [(True, False), (False, False), (True, True)])
def test_attention_fused_manual_per_head_agree(bias, qk_norm):
    torch.manual_seed(0)
    D, H = 48, 4
    fused = Attention(D, H, qkv_bias=bias, fused=True, qk_norm=qk_norm).eval()
    if qk_norm:  # norms that are not the identity, so that a norm skipped or applied per head shows
        for p in [*fused.q_norm.parameters(), *fused.k_norm.parameters()]:
            p.data.normal_()
    manual = Attention(D, H, qkv_bias=bias, fused=False, qk_norm=qk_norm).eval()
    manual.load_state_dict(fused.state_dict())
    per_head = PerHeadAttention(D, H, qkv_bias=bias, qk_norm=qk_norm).load_fused(fused).eval()
    x = torch.randn(3, 17, D)
    a = fused(x)
    b, attn = manual.forward_with_attention(x)
    c = per_head(x)
    assert isinstance(a, torch.Tensor) and attn.shape == (3, H, 17, 17)  # attention only when asked for
    assert torch.equal(manual(x), b)
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, H, 17), atol=ATOL, rtol=0)
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    torch.testing.assert_close(a, c, atol=ATOL, rtol=0)
    # and the other direction: per-head weights into the fused module
    back = Attention(D, H, qkv_bias=bias, qk_norm=qk_norm)
    back.load_state_dict(per_head.fused_state_dict())
    torch.testing.assert_close(back.eval()(x), c, atol=ATOL, rtol=0)


def _sdpa_calls(monkeypatch) -> list:
    import vitkit.model.layers.attention as mod

    calls, sdpa = [], mod.F.scaled_dot_product_attention
    monkeypatch.setattr(mod.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    return calls


def test_a_bf16_cpu_training_step_takes_the_written_out_attention_with_the_same_numbers(monkeypatch):
    """Where autograd records a bf16 call on a CPU, at any length, the written-out attention runs (its
    backward measured faster there); the outputs and gradients agree with the fused kernel's in float32
    to bf16's precision. Float32 and inference keep the fused kernel."""
    calls = _sdpa_calls(monkeypatch)
    torch.manual_seed(0)
    attn = Attention(32, 4, fused=True)
    x = torch.randn(2, 200, 32, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16):
        out = attn(x).float()
        assert not calls
        grads = torch.autograd.grad(out.square().sum(), [x, *attn.parameters()])
        with torch.no_grad():
            attn(x)
    assert len(calls) == 1  # inference in bf16: the fused kernel
    ref = attn(x)  # float32 training: the fused kernel
    assert len(calls) == 2
    ref_grads = torch.autograd.grad(ref.square().sum(), [x, *attn.parameters()])
    # bf16 operands (8 bits of mantissa) against float32: relative differences of about 2**-8 per product
    torch.testing.assert_close(out, ref, atol=0.03, rtol=0.03)
    for g, r in zip(grads, ref_grads):
        assert (g.float() - r).norm() <= 0.03 * r.norm()


def test_qk_norm_normalises_each_head_with_one_shared_norm():
    """One LayerNorm over the head dimension, the same for every head: a head's normalised query does not
    depend on the other heads, and equals F.layer_norm of its slice."""
    torch.manual_seed(0)
    attn = Attention(32, 4, qk_norm=True)
    assert attn.q_norm.weight.shape == (8,)
    for p in attn.q_norm.parameters():
        p.data.normal_()
    x = torch.randn(2, 5, 32)
    q, _, _ = attn.split_heads(x)
    raw = attn.qkv(x)[..., :32].reshape(2, 5, 4, 8).transpose(1, 2)  # (B, H, T, hd) before the norm
    ref = torch.nn.functional.layer_norm(raw, (8,), attn.q_norm.weight, attn.q_norm.bias, attn.q_norm.eps)
    torch.testing.assert_close(q, ref, atol=ATOL, rtol=0)


def test_attention_pool_fused_and_manual_agree():
    torch.manual_seed(0)
    fused = AttentionPool(32, 4, 64, fused=True).eval()
    fused.init_weights()
    manual = AttentionPool(32, 4, 64, fused=False).eval()
    manual.load_state_dict(fused.state_dict())
    x = torch.randn(3, 11, 32)
    out, probs = fused.forward_with_attention(x)
    assert out.shape == (3, 32) and probs.shape == (3, 4, 1, 11)
    torch.testing.assert_close(fused(x), out, atol=ATOL, rtol=0)
    assert torch.equal(manual(x), out)  # the manual path is the one forward_with_attention takes


def test_fused_returns_attention_on_request():
    torch.manual_seed(0)
    attn = Attention(32, 2, fused=True).eval()
    x = torch.randn(2, 5, 32)
    out, maps = attn.forward_with_attention(x)
    torch.testing.assert_close(out, attn(x), atol=ATOL, rtol=0)
    assert maps.shape == (2, 2, 5, 5)


def test_sliced_per_head_equals_block_diagonal_fused():
    """The 'from scratch' tutorial's heads each see only their slice of the token."""
    torch.manual_seed(0)
    D, H = 8, 2
    ref = PerHeadAttention(D, H, sliced=True).eval()
    fused = Attention(D, H).eval()
    fused.load_state_dict(ref.fused_state_dict())
    w = fused.qkv.weight.reshape(3, H, D // H, D)
    assert torch.count_nonzero(w[:, 0, :, D // H :]) == 0  # block-diagonal
    x = torch.randn(2, 50, D)
    torch.testing.assert_close(fused(x), ref(x), atol=ATOL, rtol=0)


def test_sincos_1d_matches_tutorial_formula():
    n, d = 50, 8
    got = sincos_1d(n, d)
    ref = torch.empty(n, d)
    for i in range(n):
        for j in range(d):
            ref[i, j] = (
                torch.sin(torch.tensor(i / 10000 ** (j / d)))
                if j % 2 == 0
                else torch.cos(torch.tensor(i / 10000 ** ((j - 1) / d)))
            )
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)


def test_sincos_2d_layout():
    t = sincos_2d((3, 5), 16)
    assert t.shape == (15, 16)
    # first quarter: sin(x * omega); omega_0 = 1 -> sin(column index)
    cols = torch.arange(5).repeat(3).float()
    rows = torch.arange(3).repeat_interleave(5).float()
    torch.testing.assert_close(t[:, 0], cols.sin(), atol=1e-6, rtol=0)
    torch.testing.assert_close(t[:, 4], cols.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(t[:, 8], rows.sin(), atol=1e-6, rtol=0)
    torch.testing.assert_close(t[:, 12], rows.cos(), atol=1e-6, rtol=0)


def test_resample_identity_and_prefix_kept():
    torch.manual_seed(0)
    pe = torch.randn(1, 1 + 16, 8)
    assert resample_pos_embed(pe, (4, 4)) is pe
    out = resample_pos_embed(pe, (6, 10))
    assert out.shape == (1, 1 + 60, 8)
    torch.testing.assert_close(out[:, :1], pe[:, :1])


def test_resample_constant_and_linear_fields_are_preserved():
    """Interpolation reproduces a constant table exactly, and bilinear up-then-down is the identity
    for an integer factor 2 of a table with smooth content only within tolerance."""
    const = torch.full((1, 1 + 9, 4), 0.7)
    torch.testing.assert_close(resample_pos_embed(const, (7, 5)), torch.full((1, 1 + 35, 4), 0.7), atol=1e-6, rtol=0)
    torch.manual_seed(0)
    pe = torch.randn(1, 16, 8)
    up = resample_pos_embed(pe, (8, 8), num_prefix_tokens=0, mode="nearest")
    down = resample_pos_embed(up, (4, 4), num_prefix_tokens=0, mode="nearest")
    torch.testing.assert_close(down, pe)


def test_resample_float32_compute_for_bf16_input():
    pe = torch.randn(1, 1 + 4, 8).to(torch.bfloat16)
    out = resample_pos_embed(pe, (3, 3))
    assert out.dtype == torch.bfloat16
    ref = resample_pos_embed(pe.float(), (3, 3))
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=0)


def test_resample_errors():
    with pytest.raises(ValueError, match="not a square grid"):
        resample_pos_embed(torch.zeros(1, 1 + 6, 4), (3, 3))
    with pytest.raises(ValueError, match="does not hold"):
        resample_pos_embed(torch.zeros(1, 1 + 6, 4), (3, 3), old_grid=(2, 2))


# ------------------------------------------------------------------------ patch-size resampling
def _resize(patches: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """(n, C, p, p) patches, each resized on its own to (size, size) as the kernel resize assumes."""
    kw = {} if mode == "nearest" else {"align_corners": False, "antialias": True}
    return torch.nn.functional.interpolate(patches, size=(size, size), mode=mode, **kw)


def _cut(x: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, H, W) -> (B*N, C, p, p): the patches, in raster order."""
    B, C, H, W = x.shape
    return x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(-1, C, p, p)


def _embed_each(pe: PatchEmbed, patches: torch.Tensor) -> torch.Tensor:
    """Patch embedding of single patches: (n, C, p, p) -> (n, D)."""
    return pe(patches)[:, 0]


def _resampled(pe: PatchEmbed, patch_size: int, mode: str = "bicubic") -> PatchEmbed:
    """A copy of ``pe`` resampled to ``patch_size``."""
    out = PatchEmbed(pe.patch_size, pe.proj.in_channels, pe.proj.out_channels, pe.mode)
    out.load_state_dict(pe.state_dict())
    out.resample_patch_size(patch_size, mode)
    return out


def _relative_close(got: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-4) -> None:
    torch.testing.assert_close(got, ref, rtol=rtol, atol=rtol * ref.abs().max().item())


@pytest.mark.parametrize("mode", ["bicubic", "bilinear", "nearest"])
@pytest.mark.parametrize("new", [16, 12])
@pytest.mark.parametrize("linear", [False, True])
def test_resampled_kernel_embeds_enlarged_patches_as_the_original(mode, new, linear):
    """FlexiViT's pseudo-inverse resize: an 8x8 patch enlarged to new x new (the same interpolation)
    gives through the resized kernel the embedding the original kernel gives the 8x8 patch."""
    torch.manual_seed(0)
    pe8 = PatchEmbed(8, 3, 24, mode="linear" if linear else "conv")
    pe_new = _resampled(pe8, new, mode)
    assert pe_new.proj.weight.shape == (24, 3, new, new) and pe_new.patch_size == new
    patches = _cut(torch.randn(2, 3, 32, 32), 8)  # 32 patches 8x8
    _relative_close(_embed_each(pe_new, _resize(patches, new, mode)), _embed_each(pe8, patches))


def test_shrunk_kernel_is_the_least_squares_fit():
    """Shrinking 16 -> 8 cannot keep every patch's embedding (64 numbers for 256 pixels): the kernel is the
    least-squares fit, i.e. exact on the patches B^T y that the resize B sees fully (the normal equations)."""
    torch.manual_seed(0)
    pe16 = PatchEmbed(16, 3, 24)
    pe8 = _resampled(pe16, 8)
    y = torch.randn(10, 3, 8, 8)
    z = torch.zeros(10, 3, 16, 16, requires_grad=True)
    (bt_y,) = torch.autograd.grad((_resize(z, 8, "bicubic") * y).sum(), z)  # B^T y: the adjoint of the resize
    _relative_close(_embed_each(pe8, _resize(bt_y, 8, "bicubic")), _embed_each(pe16, bt_y))
    # an arbitrary patch is only approximated
    x = torch.randn(10, 3, 16, 16)
    err = (_embed_each(pe8, _resize(x, 8, "bicubic")) - _embed_each(pe16, x)).abs().max()
    assert err > 1e-2


# ------------------------------------------------------------------------------ patch whitening
def _correlated_images(n=64, seed=0):
    """Images whose neighbouring pixels and channels are correlated, as natural images are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 12, 12, generator=g)
    x = x + 0.9 * x.roll(1, -1) + 0.5 * x.roll(1, -2)
    return x + 0.7 * x[:, :1]


def test_whitening_filters_come_from_the_patch_covariance():
    """W x of the data's 2x2 patches has the identity covariance (up to eps), largest eigenvalue first."""
    x = _correlated_images()
    w = patch_whitening(x, k=2, eps=1e-8)
    assert w.shape == (12, 3, 2, 2)
    patches = x.unfold(2, 2, 1).unfold(3, 2, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, 12)  # (C, k, k) order
    assert torch.linalg.eigvalsh(torch.cov(patches.T)).max() > 3  # far from white before
    white = patches.double() @ w.reshape(12, 12).double().T
    torch.testing.assert_close(torch.cov(white.T), torch.eye(12, dtype=torch.float64), atol=1e-4, rtol=0)
    # the filters are the covariance's eigenvectors (unit norm once the 1/sqrt(eigenvalue) is taken out)
    rows = w.reshape(12, 12).double()
    scales = rows.norm(dim=1)
    assert torch.all(scales[:-1] <= scales[1:] + 1e-9)  # largest eigenvalue (smallest scale) first


def test_the_whitening_layer_is_frozen_and_keeps_every_direction():
    layer = PatchWhitening(3, 2)
    assert layer.out_channels == 24 and not list(layer.parameters())  # a buffer: saved, never trained
    x = _correlated_images(4)
    torch.testing.assert_close(layer(x)[:, :12], -layer(x)[:, 12:])  # the pixel basis and its negatives
    layer.set_filters(x)
    y = layer(x)
    torch.testing.assert_close(y[:, :12], -y[:, 12:])  # the filters and their negatives
    assert y.shape == (4, 24, 6, 6)
    assert "weight" in layer.state_dict()


def test_the_whitening_conv_runs_in_float32_under_bf16_autocast():
    """Its output is float32 and equals the float32 one: bf16 would round away the whitened small directions."""
    layer = PatchWhitening(3, 2)
    x = _correlated_images(4)
    layer.set_filters(x)
    ref = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, atol=0, rtol=0)
    half = layer(x.bfloat16())  # bf16 in, bf16 out (computed in float32, rounded once)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), layer(x.bfloat16().float()), atol=0.02, rtol=0.01)


def test_a_whitening_conv_stem_builds_from_the_config_and_is_set_from_data():
    import vitkit
    from vitkit.core.errors import ConfigError

    m = vitkit.create_model("vit_test", stem="conv", patch_size=4, stem_width=8, stem_whiten=True,
                            stem_bn_momentum=0.5)
    stem = m.patch_embed
    assert isinstance(stem.whitening, PatchWhitening)
    assert all(b.momentum == 0.5 for b in stem.modules() if isinstance(b, torch.nn.BatchNorm2d))
    stem.set_whitening(torch.randn(8, 3, 32, 32))
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    plain = vitkit.create_model("vit_test", stem="conv", patch_size=4, stem_width=8)
    assert plain.patch_embed.whitening is None
    with pytest.raises(ConfigError, match="no whitening layer"):
        plain.patch_embed.set_whitening(torch.randn(2, 3, 32, 32))
    with pytest.raises(ConfigError, match="ViTConfig.stem_whiten: .* needs stem='conv'"):
        vitkit.create_model("vit_test", stem_whiten=True)
    with pytest.raises(ConfigError, match=r"ViTConfig.stem_bn_momentum: expected a finite number in \(0, 1\], got 0.0"):
        vitkit.create_model("vit_test", stem="conv", patch_size=4, stem_bn_momentum=0)


def test_a_whitening_stem_whose_batchnorm_learns_nothing_spares_its_first_conv_the_input_gradient(tmp_path):
    """stem_whiten_affine=False: the BatchNorm after the frozen whitening filters has no scale or shift, so
    nothing before the first learned conv trains and autograd computes no gradient for that conv's input;
    the model still trains end to end, and saves and loads as it is."""
    import vitkit
    from vitkit.core.errors import ConfigError

    seen = {}

    def conv_input(m):
        conv = next(c for c in m.patch_embed.stem if isinstance(c, torch.nn.Conv2d))
        conv.register_forward_hook(lambda mod, args, out: seen.update(x=args[0]))
        return conv

    def build(affine):
        m = vitkit.create_model("vit_test", stem="conv", patch_size=4, stem_width=8, stem_whiten=True,
                                stem_early_convs=1, stem_whiten_affine=affine)
        m.patch_embed.set_whitening(torch.randn(8, 3, 32, 32))
        return m

    lean, full = build(False), build(True)
    bn = lean.patch_embed.stem[1]
    assert isinstance(bn, torch.nn.BatchNorm2d) and not bn.affine and not list(bn.parameters())
    assert sum(p.numel() for p in full.parameters()) - sum(p.numel() for p in lean.parameters()) == 2 * 24
    conv_input(full)
    full(torch.randn(2, 3, 32, 32)).sum().backward()
    assert seen["x"].requires_grad  # the BatchNorm's scale and shift before it train
    conv_input(lean)
    lean(torch.randn(2, 3, 32, 32)).sum().backward()
    assert not seen["x"].requires_grad  # nothing before it trains: no gradient for its input
    assert all(p.grad is not None for n, p in lean.named_parameters() if n.startswith("patch_embed"))
    lean.eval()
    x = torch.randn(2, 3, 32, 32)
    vitkit.save(lean, tmp_path / "lean")
    again = vitkit.load(tmp_path / "lean")
    assert not again.patch_embed.stem[1].affine
    torch.testing.assert_close(again(x), lean(x), atol=0, rtol=0)
    with pytest.raises(ConfigError, match="ViTConfig.stem_whiten_affine: .* needs stem_whiten=True"):
        vitkit.create_model("vit_test", stem="conv", patch_size=4, stem_whiten_affine=False)


def test_stem_dirac_starts_the_stems_3x3_convs_as_identities():
    import vitkit
    from vitkit.core.errors import ConfigError

    m = vitkit.create_model("vit_test", stem="conv", patch_size=4, stem_width=8, stem_convs=1, stem_dirac=True)
    convs = [c for c in m.patch_embed.stem if isinstance(c, torch.nn.Conv2d)]
    first, extra = convs[0], convs[-1]  # 3 -> 8 channels at stride 2; 16 -> 16 at the grid
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(first(x)[:, :3], x[..., ::2, ::2], atol=0, rtol=0)  # the subsampled input
    assert first.weight[3:].abs().sum() > 0  # the other filters drawn as before
    y = torch.randn(2, 16, 4, 4)
    torch.testing.assert_close(extra(y), y, atol=0, rtol=0)  # a square conv: the identity
    plain = vitkit.create_model("vit_test", stem="conv", patch_size=4, stem_width=8, stem_convs=1)
    assert not torch.equal([c for c in plain.patch_embed.stem if isinstance(c, torch.nn.Conv2d)][-1](y), y)
    with pytest.raises(ConfigError, match="ViTConfig.stem_dirac: .* needs stem='conv'"):
        vitkit.create_model("vit_test", stem_dirac=True)


@pytest.mark.parametrize("whiten", [False, True])
def test_stem_early_convs_work_at_the_first_strides_resolution(whiten):
    """stem_early_convs=2: two 3x3 stride-1 convs of stem_width channels right after the first stride-2 conv
    (16x16 of a 32-px image at patch 4), before the second; the parameter estimate counts them."""
    import vitkit
    from vitkit.core.errors import ConfigError

    kw = dict(img_size=32, stem="conv", patch_size=4, stem_width=8, stem_whiten=whiten)
    m = vitkit.create_model("vit_test", stem_early_convs=2, **kw)
    base = vitkit.create_model("vit_test", **kw)
    shapes = []
    x = torch.randn(2, 3, 32, 32)
    for layer in m.patch_embed.stem:
        x = layer(x)
        if isinstance(layer, torch.nn.Conv2d) or type(layer).__name__ == "PatchWhitening":
            shapes.append((tuple(x.shape[1:]), layer.stride if isinstance(layer, torch.nn.Conv2d) else None))
    first = 24 if whiten else 8
    assert [s for s, _ in shapes] == [(first, 16, 16), (8, 16, 16), (8, 16, 16), (16, 8, 8)]
    assert [st for _, st in shapes][1:] == [(1, 1), (1, 1), (2, 2)]
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, m.cfg.num_classes)
    added = sum(p.numel() for p in m.parameters()) - sum(p.numel() for p in base.parameters())
    # (first -> 8) + (8 -> 8) 3x3 convs with BatchNorm, and the second stride-2 conv now takes 8 channels
    expect = 9 * first * 8 + 16 + 9 * 8 * 8 + 16 + 9 * 16 * (8 - first)
    assert added == expect
    if not whiten:  # the estimate counts a learned first conv, as the model has it
        est = sum(m.cfg.param_estimate().values()) - sum(base.cfg.param_estimate().values())
        assert est == expect
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match=r"\.stem_early_convs: (must be an integer >= 0|expected an integer)"):
            vitkit.create_model("vit_test", stem="conv", patch_size=4, stem_early_convs=bad)
    with pytest.raises(ConfigError, match="ViTConfig.stem_early_convs: .* need stem='conv'"):
        vitkit.create_model("vit_test", stem_early_convs=1)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_a_block_frees_each_intermediate_before_the_next_stage(norm):
    """In inference a block holds no buffer past its use: the qkv projection's is gone before the output
    projection runs, and the attention's output before the MLP (held longer, they changed the
    allocator's pattern and cost batched inference 7-10%: benchmarks/forward_liveness.py). Buffers are
    watched through weak references to their storage, which views such as q, k and v share."""
    blk = Block(32, 4, 64, norm=norm).eval()
    refs, alive = {}, []

    def remember(name):
        return lambda module, args, out: refs.__setitem__(name, out.untyped_storage()._weak_ref())

    def check(name):
        return lambda module, args: alive.append((name, not torch.UntypedStorage._expired(refs[name])))

    blk.attn.qkv.register_forward_hook(remember("qkv"))
    blk.attn.register_forward_hook(remember("attention"))
    blk.attn.proj.register_forward_pre_hook(check("qkv"))
    blk.mlp.register_forward_pre_hook(check("attention"))
    with torch.inference_mode():
        blk(torch.randn(2, 5, 32))
    for ref in refs.values():
        torch.UntypedStorage._free_weak_ref(ref)
    assert alive == [("qkv", False), ("attention", False)]
