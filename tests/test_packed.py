"""bf16 inference on a packed bf16 copy (vitkit.infer.packed): the same numbers as bf16, the model left alone,
and the rule that picks it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import random_images, tiny_model

from vitkit.infer import paths
from vitkit.infer.fastpath import FastPath, Hardware, Work, choose_path, packed_pays
from vitkit.infer.packed import Bf16Inference, PackedLinear, onednn_bf16_available, pack_linears

pytestmark = pytest.mark.usefixtures("one_thread")
needs_onednn = pytest.mark.skipif(not onednn_bf16_available(), reason="no oneDNN bf16 on this CPU or build")

AMX = Hardware("cpu", cpu_bf16_kind="amx", onednn_bf16=True, threads=2)
AVX512 = Hardware("cpu", cpu_bf16_kind="avx512bf16", onednn_bf16=True, threads=2)  # no AMX
TI16_FLOPS = 2_507_366_400


# -------------------------------------------------------------------------------------------- rule
def test_packed_is_for_bf16_inference_on_a_cpu_where_it_was_measured(monkeypatch):
    import vitkit.infer.fastpath as fp

    monkeypatch.setattr(fp, "PACKED_MEASURED", {"amx": {"a": 1.3, "b": 1.5}, "avx512bf16": {"a": 1.1}})
    path = choose_path(AMX, Work("infer", TI16_FLOPS, images=100, batch=16))
    assert (path.precision, path.packed) == ("bf16", True)
    assert "packed bf16 weights" in path.describe() and "1.30-1.50x autocast on amx" in path.describe()
    assert not choose_path(AMX, Work("train", TI16_FLOPS)).packed  # training keeps fp32 master weights
    assert not choose_path(AMX, Work("infer", TI16_FLOPS), "fp32").packed
    assert not choose_path(AMX, Work("infer", TI16_FLOPS), "int8").packed
    assert not choose_path(AMX, Work("infer", TI16_FLOPS), compile=True).packed
    assert "1.10-1.10x autocast on avx512bf16" in choose_path(AVX512, Work("infer", TI16_FLOPS)).describe()
    assert not choose_path(Hardware("cuda", cuda_bf16=True), Work("infer", TI16_FLOPS)).packed


def test_packed_follows_its_measurements(monkeypatch):
    import vitkit.infer.fastpath as fp

    monkeypatch.setattr(fp, "PACKED_MEASURED", {"amx": {"a": 0.98, "b": 1.5}})  # slower at one size: never
    assert packed_pays(AMX, Work("infer", TI16_FLOPS), "bf16", False) == (
        False, "autocast: packed bf16 weights measured 0.98x autocast on amx")
    assert packed_pays(AVX512, Work("infer", TI16_FLOPS), "bf16", False) == (  # a kind not measured: never
        False, "autocast: packed bf16 weights not measured on a CPU with avx512bf16")
    no_onednn = Hardware("cpu", cpu_bf16_kind="amx", threads=2)
    assert packed_pays(no_onednn, Work("infer", TI16_FLOPS), "bf16", False) == (
        False, "autocast: this torch build cannot pack bf16 Linear weights for oneDNN here")


def test_the_measured_table_has_a_gain_at_every_size():
    from vitkit.infer.fastpath import PACKED_MEASURED

    assert set(PACKED_MEASURED) == {"amx", "avx512bf16"}
    for table in PACKED_MEASURED.values():
        assert set(table) == {"vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224"}
        assert min(table.values()) > 1.0


# -------------------------------------------------------------------------------------------- numbers
@needs_onednn
@pytest.mark.parametrize("shape", [(5, 24), (2, 7, 24), (1, 24)])
def test_a_packed_linear_computes_the_bf16_linear(shape):
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(24, 40)
    x = torch.randn(*shape, generator=g)
    got = PackedLinear(lin)(x)
    want = F.linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16())
    assert got.dtype == torch.bfloat16 and got.shape == (*shape[:-1], 40)
    # both are bf16 products of the same bf16 operands, accumulated in fp32: they differ by the last rounding
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    assert (got.float() - F.linear(x, lin.weight, lin.bias)).abs().max() < 0.05  # and near fp32
    nobias = torch.nn.Linear(24, 8, bias=False)
    torch.testing.assert_close(PackedLinear(nobias)(x).float(), F.linear(x, nobias.weight), rtol=2e-2, atol=2e-2)


@needs_onednn
def test_a_packed_linear_names_a_wrong_input_width():
    with pytest.raises(ValueError, match=r"^PackedLinear: input has 5 features .* expected 24 \(shape \(3, 5\)\)$"):
        PackedLinear(torch.nn.Linear(24, 4))(torch.randn(3, 5))


@needs_onednn
def test_packed_bf16_agrees_with_fp32_and_leaves_the_model_alone():
    model = tiny_model(head_std=0.5, embed_dim=64, num_heads=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = random_images(model.cfg, n=200, seed=3)
    net = Bf16Inference(model)
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert net.linears == linears > 0 and not any(type(m) is torch.nn.Linear for m in net.modules())
    assert net.cfg is model.cfg
    with torch.inference_mode():
        ref = model(x)
        got = net(x)
        with paths.autocast(torch.device("cpu"), "bf16"):
            amp = model(x).float()
            under_amp = net(x)  # as the tools call it: inside autocast
    assert got.dtype == torch.float32 and got.shape == ref.shape
    torch.testing.assert_close(under_amp, got, rtol=0, atol=0)
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() >= 0.97
    # autocast's numbers: the same bf16 products of the same bf16 operands (bitwise equal on this project's
    # CPUs; another oneDNN kernel may round the last bit otherwise), a tenth of autocast's distance from fp32
    assert (got - amp).abs().max() <= 0.1 * (amp - ref).abs().max()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert next(model.parameters()).dtype == torch.float32 and next(model.parameters()).requires_grad


@needs_onednn
def test_pack_linears_replaces_plain_linears_only():
    class Sub(torch.nn.Linear):
        pass

    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4), Sub(4, 4)))
    assert pack_linears(m) == 2
    assert isinstance(m[0], PackedLinear) and isinstance(m[1][0], PackedLinear) and type(m[1][1]) is Sub


@needs_onednn
def test_packed_bf16_of_a_whitened_conv_stem_is_autocasts():
    model = tiny_model("vit_hybrid_whiten_patch4_32", head_std=0.5)
    x = random_images(model.cfg, n=16, seed=3)
    with torch.inference_mode(), paths.autocast(torch.device("cpu"), "bf16"):
        amp = model(x).float()
        got = Bf16Inference(model)(x)
    assert (got - amp).abs().max() <= 1e-3 * amp.abs().max()


@needs_onednn
def test_apply_path_runs_the_packed_copy():
    model = tiny_model(head_std=0.5)
    net = paths.apply_path(model, FastPath("bf16", packed=True))
    assert isinstance(net, Bf16Inference)
    assert paths.apply_path(model, FastPath("bf16")) is model


# -------------------------------------------------------------------------------------------- bf16 stream
@needs_onednn
def test_a_packed_linear_adds_its_output_to_a_residual_in_one_kernel():
    lin = torch.nn.Linear(24, 16)
    packed = PackedLinear(lin)
    x = torch.randn(2, 5, 24)
    residual = torch.randn(2, 5, 16).bfloat16()
    got = packed.add_to(x, residual)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 5, 16)
    torch.testing.assert_close(got.float(), residual.float() + packed(x).float(), rtol=1e-2, atol=2e-2)
    with pytest.raises(ValueError, match=r"^PackedLinear: input has 5 features"):
        packed.add_to(torch.randn(3, 5), residual)


@needs_onednn
@pytest.mark.parametrize("over", [{}, {"layer_scale": 0.1}, {"qk_norm": True}, {"reg_tokens": 2, "global_pool": "map"},
                                  {"global_pool": "avg", "class_token": False}])
def test_the_bf16_stream_agrees_with_fp32_and_leaves_the_model_alone(over):
    model = tiny_model(head_std=0.5, embed_dim=64, num_heads=4, **over)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = random_images(model.cfg, n=200, seed=3)
    net = Bf16Inference(model, "bfloat16")
    assert len(net.blocks()) == model.cfg.depth and all(isinstance(b.ls1, torch.nn.Identity) for b in net.blocks())
    with torch.inference_mode():
        ref = model(x)
        got = net(x)
        with paths.autocast(torch.device("cpu"), "bf16"):
            amp = model(x).float()
            under_amp = net(x)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    torch.testing.assert_close(under_amp, got, rtol=0, atol=0)
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() >= 0.97
    # a bf16 computation throughout the blocks: as far from fp32 as autocast's, within a small factor
    assert (got - ref).abs().max() <= 3 * (amp - ref).abs().max()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@needs_onednn
def test_blocks_of_another_kind_keep_the_float32_stream():
    model = tiny_model(head_std=0.5, norm="post")
    x = random_images(model.cfg, n=8, seed=3)
    net = Bf16Inference(model, "bfloat16")
    assert net.blocks() == [] and net.stream == "float32"
    with torch.inference_mode():
        torch.testing.assert_close(net(x), Bf16Inference(model)(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^Bf16Inference: stream 'fp16' is not one of float32, bfloat16$"):
        Bf16Inference(model, "fp16")


def test_the_bf16_stream_follows_its_measurements(monkeypatch):
    import vitkit.infer.fastpath as fp

    work = Work("infer", TI16_FLOPS, batch=16)
    monkeypatch.setattr(fp, "STREAM_MEASURED", {"amx": {"a": 1.05, "b": 1.2}})
    path = choose_path(AMX, work)
    assert (path.packed, path.stream) == (True, "bfloat16")
    assert "packed bf16 weights, bf16 residual stream" in path.describe()
    assert "bf16 residual stream: measured 1.05-1.20x the float32 stream on amx" in path.describe()
    assert choose_path(AVX512, work).stream == "float32"  # not measured there
    monkeypatch.setattr(fp, "STREAM_MEASURED", {"amx": {"a": 0.97, "b": 1.2}})
    assert fp.bf16_stream_pays(AMX) == (
        False, "float32 residual stream: a bf16 stream measured 0.97x the float32 stream on amx")
    assert not choose_path(AMX, work, "fp32").packed and choose_path(AMX, work, "fp32").stream == "float32"


@needs_onednn
def test_apply_path_runs_the_stream_the_path_names():
    model = tiny_model(head_std=0.5)
    assert paths.apply_path(model, FastPath("bf16", packed=True, stream="bfloat16")).stream == "bfloat16"
    assert paths.apply_path(model, FastPath("bf16", packed=True)).stream == "float32"


@needs_onednn
def test_the_path_says_when_blocks_of_another_kind_keep_the_float32_stream():
    post = tiny_model(head_std=0.5, norm="post")
    path = FastPath("bf16", packed=True, stream="bfloat16", why=("asked",))
    net = paths.apply_path(post, path)
    assert paths.path_taken(path, net) == ("bf16, eager, packed bf16 weights (asked; float32 residual stream: the "
                                             "model has blocks of another kind than the plain pre-LN one)")
    pre = tiny_model(head_std=0.5)
    assert paths.path_taken(path, paths.apply_path(pre, path)) == path.describe()
