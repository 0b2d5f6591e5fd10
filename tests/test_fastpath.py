"""The fast-path rules (given the hardware and the work, which path) and the numbers of each path."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same_logits, random_images, tiny_model

from vitkit import runtime
from vitkit.errors import ConfigError
from vitkit.fastpath import (
    BF16_MIN_FLOPS,
    CHANNELS_LAST_MEASURED,
    FastPath,
    Hardware,
    Work,
    auto_precision,
    channels_last_pays,
    choose_path,
    compile_pays,
    vit_flops,
)
from vitkit.quantize import Int8Linear, int8_available, quantize_int8

pytestmark = pytest.mark.usefixtures("one_thread")

AVX512 = Hardware("cpu", cpu_bf16=True, threads=2)  # AVX512-BF16 without AMX
PLAIN_CPU = Hardware("cpu", threads=2)
GPU = Hardware("cuda", cuda_bf16=True)
DEMO_FLOPS, TI16_FLOPS = 13_586_432, 2_507_366_400  # the demo model, ViT-Ti/16 (bench_*_precision.json)


# -------------------------------------------------------------------------------------------- rules
def test_bf16_on_an_avx512_cpu_weighs_the_model_size():
    assert auto_precision(AVX512, DEMO_FLOPS)[0] == "fp32"  # measured 0.59x fp32 training
    assert auto_precision(AVX512, TI16_FLOPS)[0] == "bf16"  # measured 1.41x
    assert auto_precision(AVX512, BF16_MIN_FLOPS)[0] == "bf16"
    assert auto_precision(AVX512, None)[0] == "bf16"  # size unknown: the hardware decides


def test_never_bf16_without_bf16_hardware():
    for hw in (PLAIN_CPU, Hardware("mps")):
        assert auto_precision(hw, TI16_FLOPS)[0] == "fp32"


def test_cuda_weighs_the_size_and_falls_back_to_fp16():
    assert auto_precision(GPU, TI16_FLOPS)[0] == "bf16"
    assert auto_precision(GPU, DEMO_FLOPS)[0] == "fp32"  # the demo: 70.6 s in bf16 against 15.2 s in fp32
    assert auto_precision(Hardware("cuda"), TI16_FLOPS)[0] == "fp16"


def test_compile_never_pays_where_measured_no_faster_and_is_off_where_unmeasured():
    huge = Work("train", TI16_FLOPS, images=10**9)
    assert compile_pays(AVX512, huge)[0] is False  # CPU training: 0.99x eager
    assert compile_pays(GPU, huge)[0] is False  # not measured: only when asked for
    assert choose_path(AVX512, huge, compile=True).compile is True


def test_compile_pays_only_for_long_work(monkeypatch):
    import vitkit.fastpath as fp

    monkeypatch.setitem(fp.COMPILE_MEASURED, ("cpu", "train"), (100.0, 1.25, 1e10))
    short, long = Work("train", 1e9, images=1_000), Work("train", 1e9, images=1_000_000)
    assert compile_pays(AVX512, short)[0] is False  # 150 s of work saves 30 s < 100 s
    assert compile_pays(AVX512, long)[0] is True


def test_channels_last_is_for_conv_stems_on_the_cpu():
    assert choose_path(AVX512, Work("infer", DEMO_FLOPS, conv_stem=True)).channels_last is True
    assert choose_path(AVX512, Work("infer", DEMO_FLOPS)).channels_last is False
    assert choose_path(GPU, Work("infer", DEMO_FLOPS, conv_stem=True)).channels_last is False


def test_a_training_run_says_why_it_trains_channels_last_or_not():
    conv = Work("train", DEMO_FLOPS, conv_stem=True)
    path = choose_path(AVX512, conv, "fp32", compile=False)
    assert path.channels_last is True
    assert path.describe() == ("fp32, eager, channels_last (channels_last: a conv stem measured "
                               f"{CHANNELS_LAST_MEASURED[('cpu', 'train')]:.2f}x for train on cpu)")
    sharded = choose_path(AVX512, Work("train", DEMO_FLOPS, conv_stem=True, sharded=True), "fp32", False)
    assert sharded.channels_last is False and "FSDP shards contiguous parameters only" in sharded.describe()
    gpu = choose_path(GPU, conv, "fp32", False)
    assert gpu.channels_last is False and "not measured for train on cuda" in gpu.describe()
    assert choose_path(AVX512, Work("train", DEMO_FLOPS), "fp32", False).describe() == "fp32, eager"  # patch stem
    assert choose_path(AVX512, conv, "fp32", False, channels_last=False).describe() == "fp32, eager"  # as asked
    assert choose_path(GPU, conv, "fp32", False, channels_last=True).channels_last is True


def test_the_channels_last_rule_follows_its_measurements(monkeypatch):
    import vitkit.fastpath as fp

    conv = Work("train", DEMO_FLOPS, conv_stem=True)
    monkeypatch.setitem(fp.CHANNELS_LAST_MEASURED, ("cpu", "train"), 0.9)
    assert channels_last_pays(AVX512, conv) == (False, "contiguous: a conv stem measured 0.90x for train on cpu")
    assert channels_last_pays(AVX512, Work("infer", DEMO_FLOPS, conv_stem=True))[0] is True  # by mode


def test_the_training_path_of_a_model():
    cpu = torch.device("cpu")
    demo = tiny_model("vit_hybrid_mini_patch4_28").cfg
    path = runtime.training_path(demo, cpu, "fp32")
    assert (path.precision, path.compile, path.channels_last) == ("fp32", False, True)
    assert runtime.training_path(demo, cpu, "fp32", sharded=True).channels_last is False
    assert runtime.training_path(demo, cpu, "fp32", channels_last=False).channels_last is False
    assert runtime.training_path(tiny_model().cfg, cpu, "fp32").channels_last is False  # a patch stem
    assert runtime.training_path(demo, cpu, "fp32", compile=True).compile is True
    assert runtime.training_path(demo, cpu).precision == "fp32"  # auto: too small for bf16 on every CPU
    with pytest.raises(ConfigError, match="^precision: 'fp16' needs a CUDA device"):
        runtime.training_path(demo, cpu, "fp16")


def test_int8_is_opt_in_and_for_cpu_inference_only():
    assert choose_path(AVX512, Work("infer", TI16_FLOPS)).precision == "bf16"
    assert choose_path(AVX512, Work("infer", TI16_FLOPS), "int8").precision == "int8"
    with pytest.raises(ConfigError, match="^precision: int8 .* not training$"):
        choose_path(AVX512, Work("train", TI16_FLOPS), "int8")
    with pytest.raises(ConfigError, match="^precision: int8 .* not on cuda$"):
        choose_path(GPU, Work("infer", TI16_FLOPS), "int8")


def test_the_path_says_what_it_took_and_why():
    path = choose_path(AVX512, Work("infer", DEMO_FLOPS, images=10))
    text = path.describe()
    assert text.startswith("fp32, eager (fp32: bf16 does not pay at 0.0136 GFLOPs/image") and "\n" not in text
    assert FastPath("bf16").describe() == "bf16, eager"


def test_named_precisions_are_kept():
    assert choose_path(PLAIN_CPU, Work("train", TI16_FLOPS), "bf16").precision == "bf16"


def test_auto_precision_of_the_trainer_weighs_the_model(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_fast_bf16", lambda: True)
    cpu = torch.device("cpu")
    assert runtime.pick_precision("auto", cpu, DEMO_FLOPS) == "fp32"
    assert runtime.pick_precision("auto", cpu, TI16_FLOPS) == "bf16"


def test_vit_flops_of_vit_ti16():
    assert vit_flops(tiny_model("vit_tiny_patch16_224").cfg) == TI16_FLOPS


# ---------------------------------------------------------------------------------------- numerics
def test_channels_last_fp32_matches_eager():
    model = tiny_model("vit_test", stem="conv", stem_width=8, head_std=0.5)
    x = random_images(model.cfg, n=4)
    want = model(x)
    path = FastPath("fp32", channels_last=True)
    assert_same_logits(runtime.apply_path(model, path)(x), want, tol=1e-4)


def test_the_tools_path_is_fp32_eager_for_a_tiny_model():  # on every CPU, bf16 or not
    model = tiny_model(head_std=0.5)
    path = runtime.inference_path(model, torch.device("cpu"), images=8)
    assert (path.precision, path.compile, path.channels_last) == ("fp32", False, False)
    with pytest.raises(ConfigError, match="^--precision: 'fp16' is not one of auto, fp32, bf16, int8$"):
        runtime.inference_path(model, torch.device("cpu"), "fp16")


@pytest.mark.skipif(not int8_available(), reason="no int8 kernels in this torch build")
def test_int8_agrees_with_fp32_on_top1_and_leaves_the_model_alone():
    model = tiny_model(head_std=0.5, embed_dim=64, num_heads=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = random_images(model.cfg, n=200, seed=3)
    q = quantize_int8(model)
    assert isinstance(q.blocks[0].attn.qkv, Int8Linear) and isinstance(q.head, Int8Linear)
    with torch.no_grad():
        ref, got = model(x), q(x)
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() >= 0.97
    assert (ref - got).abs().max() < 0.1 * ref.abs().max()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bf16_agrees_with_fp32_on_top1():
    model = tiny_model(head_std=0.5, embed_dim=64, num_heads=4)
    x = random_images(model.cfg, n=200, seed=3)
    with torch.no_grad():
        ref = model(x)
        with runtime.autocast(torch.device("cpu"), "bf16"):
            got = model(x).float()
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() >= 0.97
