"""int8 dynamic quantization (vitkit.infer.quantize): each kernel's numbers against the float product of the same
int8 weights, the MLP's activation inside fc1, inputs the activations' scale cannot cover, and the rule that
picks the kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import random_images, tiny_model

from vitkit.core.errors import ConfigError
from vitkit.infer import paths
from vitkit.infer.fastpath import INT8_ONEDNN_MEASURED, FastPath, Hardware, Work, choose_path, int8_kernel
from vitkit.infer.quantize import Int8Linear, fbgemm_available, onednn_int8_available, quantize_int8

pytestmark = pytest.mark.usefixtures("one_thread")

KERNELS = [pytest.param("onednn", marks=pytest.mark.skipif(not onednn_int8_available(), reason="no oneDNN int8")),
           pytest.param("fbgemm", marks=pytest.mark.skipif(not fbgemm_available(), reason="no fbgemm / qnnpack"))]
AMX = Hardware("cpu", cpu_bf16_kind="amx", onednn_int8=True, threads=2)
TI16, S16, B16 = 2_507_366_400, 9_197_764_608, 35_127_656_448


# -------------------------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", [(5, 24), (2, 7, 24), (1, 24)])
def test_an_int8_linear_is_the_float_product_of_its_int8_weights_up_to_the_activations_step(kernel, shape):
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(24, 40)
    x = torch.randn(*shape, generator=g) * 3 + 1  # not centred: the zero point matters
    q = Int8Linear(lin, kernel)
    got = q(x)
    assert got.dtype == torch.float32 and got.shape == (*shape[:-1], 40)
    # per-channel symmetric weights: within half a step of the float weights
    assert (q.dequantized_weight() - lin.weight).abs().max() <= 0.5 * q.w_scale.max() + 1e-7
    want = F.linear(x, q.dequantized_weight(), lin.bias)
    # the activations' one step: (max - min) / 254 for oneDNN's 8 bits, twice that for fbgemm's 7; each
    # product's rounding error is at most half a step times sum |w|
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    step = (hi - lo) / (254 if kernel == "onednn" else 127)
    bound = 0.5 * step * q.dequantized_weight().abs().sum(1).max().item()
    assert (got - want).abs().max() <= bound * 1.01 + 1e-5


@pytest.mark.skipif(not (onednn_int8_available() and fbgemm_available()), reason="needs both int8 kernels")
def test_onednn_is_twice_as_fine_as_fbgemm_on_the_same_weights():
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(64, 64)
    x = torch.randn(256, 64, generator=g)
    one, two = Int8Linear(lin, "onednn"), Int8Linear(lin, "fbgemm")
    assert torch.equal(one.w_int8, two.w_int8) and torch.equal(one.w_scale, two.w_scale)
    want = F.linear(x, one.dequantized_weight(), lin.bias)
    assert (one(x) - want).abs().mean() < 0.7 * (two(x) - want).abs().mean()  # 8-bit against 7-bit activations


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
def test_the_activation_inside_the_kernel_is_the_activation_after_it(kernel, act):
    lin = torch.nn.Linear(16, 32)
    x = torch.randn(9, 16, generator=torch.Generator().manual_seed(2))
    fn = {"gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu}[act]
    torch.testing.assert_close(Int8Linear(lin, kernel, act=act)(x), fn(Int8Linear(lin, kernel)(x)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_inputs_the_scale_cannot_cover_and_empty_batches(kernel):
    lin = torch.nn.Linear(8, 4)
    q = Int8Linear(lin, kernel)
    assert q(torch.zeros(0, 8)).shape == (0, 4)
    zeros = q(torch.zeros(3, 8))  # a zero range: any scale
    torch.testing.assert_close(zeros, lin.bias.detach().expand(3, 4), rtol=0, atol=1e-6)
    if kernel == "onednn":  # a non-finite input goes through as float32 would, row by row
        x = torch.randn(3, 8)
        x[1, 2] = float("nan")
        y = q(x)
        assert y[1].isnan().all() and y[[0, 2]].isfinite().all()
        torch.testing.assert_close(y[[0, 2]], F.linear(x[[0, 2]], q.dequantized_weight(), lin.bias))


def test_an_int8_linear_names_bad_arguments():
    lin = torch.nn.Linear(24, 4)
    with pytest.raises(ConfigError, match=r"^int8 kernel: 'avx' is not one of onednn, fbgemm$"):
        Int8Linear(lin, "avx")
    with pytest.raises(ConfigError, match=r"^int8 activation: 'silu' is not one of gelu, gelu_tanh, relu$"):
        Int8Linear(lin, "fbgemm", act="silu")
    if fbgemm_available():
        with pytest.raises(ValueError, match=r"^Int8Linear: input has 5 features .* expected 24 \(shape \(3, 5\)\)$"):
            Int8Linear(lin, "fbgemm")(torch.randn(3, 5))
    with pytest.raises(ConfigError, match=r"^int8 kernel: 'avx' is not one of onednn, fbgemm$"):
        quantize_int8(tiny_model(), kernel="avx")


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_quantized_model_joins_each_mlp_activation_to_its_first_linear(kernel):
    model = tiny_model(head_std=0.5, embed_dim=64, num_heads=4, depth=3)
    q = quantize_int8(model, kernel=kernel)
    assert type(q.blocks[0].mlp.act) is torch.nn.GELU and type(q.blocks[0].mlp.fc1) is torch.nn.Linear  # kept float
    for blk in q.blocks[1:]:
        assert isinstance(blk.mlp.act, torch.nn.Identity)
        assert (blk.mlp.fc1.act, blk.mlp.fc1.kernel, blk.mlp.fc2.act) == ("gelu", kernel, None)
    x = random_images(model.cfg, n=200, seed=3)
    with torch.no_grad():
        ref, got = model(x), q(x)
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() >= 0.97
    assert (ref - got).abs().max() < 0.1 * ref.abs().max()


# -------------------------------------------------------------------------------------------- the rule
def test_the_kernel_follows_its_measurements_by_size_and_batch(monkeypatch):
    import vitkit.infer.fastpath as fp

    monkeypatch.setattr(fp, "INT8_ONEDNN_MEASURED", {"amx": {"small": (1e9, 0.9, 1.2), "big": (1e10, 1.1, 1.3)}})
    assert int8_kernel(AMX, Work("infer", 1e9, batch=16)) == (
        "onednn", "onednn: oneDNN's int8 kernels measured 1.20x fbgemm's (small, amx)")
    assert int8_kernel(AMX, Work("infer", 1.2e9, batch=1))[0] == "fbgemm"  # batch 1 of the small size: 0.9
    assert int8_kernel(AMX, Work("infer", 1.2e9))[0] == "fbgemm"  # batch unknown: the lesser of the two
    assert int8_kernel(AMX, Work("infer", 2e10, batch=1))[0] == "onednn"
    assert int8_kernel(Hardware("cpu", cpu_bf16_kind="amx", threads=2), Work("infer", 1e10, batch=16)) == (
        "fbgemm", "fbgemm: this torch build cannot run oneDNN's int8 Linear here")
    assert int8_kernel(Hardware("cpu", cpu_bf16_kind="avx512bf16", onednn_int8=True), Work("infer", 1e10)) == (
        "fbgemm", "fbgemm: oneDNN's int8 kernels not measured on a CPU with avx512bf16")


def test_the_int8_path_names_its_kernel():
    path = choose_path(AMX, Work("infer", S16, batch=16), "int8")
    assert (path.precision, path.int8_kernel) == ("int8", "onednn")
    assert path.describe().startswith("int8, eager, onednn int8 kernels (int8 weights, dynamically quantized "
                                      "activations: asked for; onednn: oneDNN's int8 kernels measured")
    assert choose_path(Hardware("cpu", threads=2), Work("infer", S16, batch=16), "int8").int8_kernel == "fbgemm"


def test_the_measured_table_covers_the_demo_and_the_vit_sizes():
    assert set(INT8_ONEDNN_MEASURED) == {"amx"}
    table = INT8_ONEDNN_MEASURED["amx"]
    assert {name: flops for name, (flops, _, _) in table.items()} == {
        "vit_hybrid_mini_patch4_28": 7_753_472, "vit_tiny_patch16_224": TI16, "vit_small_patch16_224": S16,
        "vit_base_patch16_224": B16}
    assert all(at16 > 1 for name, (_, _, at16) in table.items() if name.startswith("vit_") and "mini" not in name)
    demo = Work("infer", 7_753_472, batch=256)
    assert int8_kernel(AMX, demo)[0] == "fbgemm"  # the demo model: oneDNN measured slower at both batches


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_tools_run_the_kernel_the_path_names(kernel):
    model = tiny_model(head_std=0.5)
    net = paths.apply_path(model, FastPath("int8", int8_kernel=kernel))
    assert {m.kernel for m in net.modules() if isinstance(m, Int8Linear)} == {kernel}


# ----------------------------------------------------------------------------- right or refused
def _saturating_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x86's u8 x s8 multiply-add without VNNI: each pair of products summed in 16 bits, saturating."""
    pairs = (x.long()[:, None, :] * w.long()[None, :, :]).reshape(x.shape[0], w.shape[0], -1, 2).sum(-1)
    return pairs.clamp(-(2 ** 15), 2 ** 15 - 1).sum(-1).float()


def test_the_check_product_tells_a_saturating_kernel_from_an_exact_one():
    from vitkit.infer.quantize import CHECK_TOLERANCE, check_product_error

    exact = check_product_error(lambda x, w: (x.long() @ w.long().T).float())
    assert exact == 0.0
    assert check_product_error(_saturating_product) > 0.4  # most of the first row's sum is lost
    assert CHECK_TOLERANCE < 1e-3


def test_onednn_is_refused_in_one_line_where_its_check_product_is_wrong(monkeypatch):
    import vitkit.infer.quantize as quantize

    why = "oneDNN's int8 Linear is wrong by 0.494 on a check product on this CPU (8-bit products saturate without VNNI or AMX)"
    monkeypatch.setattr(quantize, "onednn_int8_problem", lambda: why)
    monkeypatch.setattr(paths, "onednn_int8_problem", lambda: why)
    with pytest.raises(ConfigError, match=r"^int8 kernel 'onednn': oneDNN's int8 Linear is wrong by 0\.494 .*; use "
                                          r"kernel 'fbgemm' \(7-bit activations, which do not saturate\)$"):
        Int8Linear(torch.nn.Linear(8, 4), "onednn")
    with pytest.raises(ConfigError, match=r"^int8 kernel 'onednn': oneDNN's int8 Linear is wrong"):
        quantize_int8(tiny_model(), kernel="onednn")
    hw = paths.detect_hardware(torch.device("cpu"))
    assert (hw.onednn_int8, hw.onednn_int8_why) == (False, why)
    assert int8_kernel(Hardware("cpu", cpu_bf16_kind="amx", onednn_int8_why=why), Work("infer", S16, batch=16)) == (
        "fbgemm", f"fbgemm: {why}")  # falls back, saying why, even where oneDNN was measured faster
    if fbgemm_available():
        assert {m.kernel for m in quantize_int8(tiny_model()).modules() if isinstance(m, Int8Linear)} == {"fbgemm"}


EMULATED_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
RIGHT_OR_REFUSED = r"""
import json, torch, torch.nn.functional as F
from vitkit.core.errors import ConfigError
from vitkit.infer.quantize import Int8Linear, onednn_int8_problem
torch.manual_seed(0)
lin = torch.nn.Linear(256, 64)
with torch.no_grad():
    lin.weight.copy_(torch.sign(torch.randn(64, 256)) * 0.1)  # every weight at its scale: int8 +-127
x = torch.rand(8, 256) * 10  # activations spanning the 8 bits: 255 x 127 pairs where the data is extreme
try:
    q = Int8Linear(lin, "onednn")
except ConfigError as e:
    print(json.dumps({"refused": str(e), "problem": onednn_int8_problem()}))
else:
    step = x.max().item() / 254
    bound = 0.5 * step * q.dequantized_weight().abs().sum(1).max().item()
    err = (q(x) - F.linear(x, q.dequantized_weight(), lin.bias)).abs().max().item()
    print(json.dumps({"error": err, "bound": bound, "problem": onednn_int8_problem()}))
"""


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_the_onednn_kernel_is_right_or_refused_on_this_cpu_and_on_avx2(isa):
    """On this CPU and with oneDNN and ATen held to AVX2 (as on a CPU without VNNI or AMX): either the kernel
    computes a product of extreme 8-bit values within its rounding bound, or it is refused in one line."""
    import json
    import os
    import subprocess
    import sys

    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")):
        pytest.skip("no oneDNN int8 ops in this torch build")
    env = dict(os.environ, **(EMULATED_AVX2 if isa == "avx2" else {}))
    out = subprocess.run([sys.executable, "-c", RIGHT_OR_REFUSED], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if "refused" in got:
        assert got["problem"] and "\n" not in got["refused"]
        assert got["refused"].startswith("int8 kernel 'onednn': ") and got["refused"].endswith("do not saturate)")
    else:
        assert got["problem"] == "" and got["error"] <= got["bound"] * 1.01 + 1e-5, got
