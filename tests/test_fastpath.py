"""The fast-path rules (given the hardware and the work, which path) and the numbers of each path."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
from helpers import assert_same_logits, random_images, tiny_model

from vitkit.core.errors import ConfigError, ExportError, VitkitWarning
from vitkit.infer import paths
from vitkit.infer.fastpath import (
    BF16_MIN_FLOPS,
    CHANNELS_LAST_MEASURED,
    ORT_MEASURED,
    ORT_MIN_GAIN,
    FastPath,
    Hardware,
    Work,
    auto_precision,
    channels_last_pays,
    choose_path,
    compile_pays,
    ort_measurement,
    ort_pays,
    vit_flops,
)
from vitkit.infer.onnxrt import onnxruntime_available
from vitkit.infer.quantize import Int8Linear, int8_available, quantize_int8

pytestmark = pytest.mark.usefixtures("one_thread")

AVX512 = Hardware("cpu", cpu_bf16_kind="avx512bf16", threads=2)  # AVX512-BF16 without AMX
PLAIN_CPU = Hardware("cpu", threads=2)
GPU = Hardware("cuda", cuda_bf16=True)
ORT_CPU = Hardware("cpu", threads=2, onnxruntime=True)  # no fast bf16, onnxruntime installed
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
    import vitkit.infer.fastpath as fp

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
    import vitkit.infer.fastpath as fp

    conv = Work("train", DEMO_FLOPS, conv_stem=True)
    monkeypatch.setitem(fp.CHANNELS_LAST_MEASURED, ("cpu", "train"), 0.9)
    assert channels_last_pays(AVX512, conv) == (False, "contiguous: a conv stem measured 0.90x for train on cpu")
    assert channels_last_pays(AVX512, Work("infer", DEMO_FLOPS, conv_stem=True))[0] is True  # by mode


def test_the_training_path_of_a_model():
    cpu = torch.device("cpu")
    demo = tiny_model("vit_hybrid_mini_patch4_28").cfg
    path = paths.training_path(demo, cpu, "fp32")
    assert (path.precision, path.compile, path.channels_last) == ("fp32", False, True)
    assert paths.training_path(demo, cpu, "fp32", sharded=True).channels_last is False
    assert paths.training_path(demo, cpu, "fp32", channels_last=False).channels_last is False
    assert paths.training_path(tiny_model().cfg, cpu, "fp32").channels_last is False  # a patch stem
    assert paths.training_path(demo, cpu, "fp32", compile=True).compile is True
    assert paths.training_path(demo, cpu).precision == "fp32"  # auto: too small for bf16 on every CPU
    with pytest.raises(ConfigError, match="^precision: 'fp16' needs a CUDA device"):
        paths.training_path(demo, cpu, "fp16")


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


def _measured(monkeypatch, at1: float, at16: float, setup_s: float = 2.0):
    """One measured model of 1 GFLOP/image: onnxruntime's gain at batch 1 and 16, its setup seconds."""
    import vitkit.infer.fastpath as fp

    monkeypatch.setattr(fp, "ORT_MEASURED", {"m": (1e9, at1, at16, setup_s)})


def test_onnxruntime_runs_fp32_cpu_inference_long_enough_to_repay_its_setup(monkeypatch):
    _measured(monkeypatch, 1.5, 1.5)
    # 10,000 images of 1 GFLOP at 2e10 FLOP/s a thread on 2 threads: ~250 s eager, 1.5x saves ~83 s > 2 s
    long, short = Work("infer", 1e9, images=10_000, batch=16), Work("infer", 1e9, images=10, batch=16)
    path = choose_path(ORT_CPU, long)
    assert (path.engine, path.precision, path.compile, path.engine_asked) == ("onnxruntime", "fp32", False, False)
    assert path.describe().startswith("fp32, onnxruntime (fp32: no fast bf16 on this device; "
                                      "onnxruntime: measured 1.50x")
    assert choose_path(ORT_CPU, short).engine == "torch"  # ~0.25 s of work saves less than 2 s of setup
    assert "does not repay ~2.0 s of exporting" in choose_path(ORT_CPU, short).describe()


def test_onnxruntime_is_never_chosen_off_its_ground(monkeypatch):
    _measured(monkeypatch, 1.5, 1.5)
    huge = Work("infer", 1e9, images=10**7, batch=16)
    assert choose_path(PLAIN_CPU, huge).engine == "torch"  # not installed
    assert "onnxruntime is not installed" in choose_path(PLAIN_CPU, huge).describe()
    assert choose_path(replace(ORT_CPU, cpu_bf16_kind="avx512bf16"), huge).precision == "bf16"  # bf16 paths stay on torch
    assert choose_path(replace(ORT_CPU, cpu_bf16_kind="avx512bf16"), huge).engine == "torch"
    for forced in ("fp32", "int8"):
        assert choose_path(ORT_CPU, huge, forced).engine == ("torch" if forced == "int8" else "onnxruntime")
    assert choose_path(ORT_CPU, huge, compile=True).engine == "torch"  # compile asked for: torch's
    assert choose_path(ORT_CPU, huge, engine="torch").engine == "torch"
    assert ort_pays(replace(GPU, onnxruntime=True), huge)[0] is False
    assert ort_pays(ORT_CPU, replace(huge, mode="train"))[0] is False


def test_onnxruntime_needs_its_measured_gain_at_the_batch(monkeypatch):
    _measured(monkeypatch, 0.9, 1.5)  # slower than torch at batch 1, faster at 16
    huge = Work("infer", 1e9, images=10**7)
    assert ort_pays(ORT_CPU, replace(huge, batch=16))[0] is True
    assert ort_pays(ORT_CPU, replace(huge, batch=256))[0] is True
    for batch in (0, 1, 8):  # unknown or small: the lesser of the two
        ok, why = ort_pays(ORT_CPU, replace(huge, batch=batch))
        assert not ok and why == "torch: onnxruntime measured 0.90x torch at this size (m)"
    _measured(monkeypatch, 1.5, ORT_MIN_GAIN - 0.01)  # within the noise: never
    assert ort_pays(ORT_CPU, replace(huge, batch=16))[0] is False


def test_the_measured_table_picks_onnxruntime_only_where_it_won():
    for name, (flops, at1, at16, setup_s) in ORT_MEASURED.items():
        assert ort_measurement(flops)[0] == name
        for batch, gain in ((1, min(at1, at16)), (16, at16)):
            chosen = ort_pays(ORT_CPU, Work("infer", flops, images=10**8, batch=batch))[0]
            assert chosen == (gain >= ORT_MIN_GAIN), (name, batch)
    assert ort_measurement(1.0)[0] == min(ORT_MEASURED, key=lambda n: ORT_MEASURED[n][0])


def test_the_engine_forced_is_checked_in_one_line():
    work = Work("infer", TI16_FLOPS, images=1)
    path = choose_path(replace(ORT_CPU, cpu_bf16_kind="avx512bf16"), work, engine="onnxruntime")  # auto precision: fp32
    assert (path.engine, path.precision, path.engine_asked) == ("onnxruntime", "fp32", True)
    assert path.describe() == "fp32, onnxruntime (fp32: onnxruntime runs fp32; onnxruntime: asked for)"
    errors = [
        (dict(hw=PLAIN_CPU), "^engine: onnxruntime is not installed: pip install 'vitkit\\[onnx\\]'$"),
        (dict(precision="bf16"), "^engine: onnxruntime runs fp32, not bf16 \\(use precision auto or fp32 with it\\)$"),
        (dict(precision="int8"), "^engine: onnxruntime runs fp32, not int8 "),
        (dict(hw=replace(GPU, onnxruntime=True)), "^engine: onnxruntime runs inference on a CPU, not on cuda$"),
        (dict(work=Work("train", TI16_FLOPS)), "^engine: onnxruntime runs inference on a CPU, not training$"),
        (dict(compile=True), "^engine: onnxruntime runs its own graph; torch.compile does not apply to it$"),
        (dict(engine="tvm"), "^engine: 'tvm' is not one of auto, torch, onnxruntime$"),
    ]
    for kw, msg in errors:
        args = dict(hw=ORT_CPU, work=work, precision="auto", compile=None, engine="onnxruntime") | kw
        with pytest.raises(ConfigError, match=msg):
            choose_path(**args)


def test_named_precisions_are_kept():
    assert choose_path(PLAIN_CPU, Work("train", TI16_FLOPS), "bf16").precision == "bf16"


def test_auto_precision_of_the_trainer_weighs_the_model(monkeypatch):
    monkeypatch.setattr(paths, "cpu_bf16_kind", lambda: "avx512bf16")
    cpu = torch.device("cpu")
    assert paths.pick_precision("auto", cpu, DEMO_FLOPS) == "fp32"
    assert paths.pick_precision("auto", cpu, TI16_FLOPS) == "bf16"


def test_vit_flops_of_vit_ti16():
    assert vit_flops(tiny_model("vit_tiny_patch16_224").cfg) == TI16_FLOPS


# ---------------------------------------------------------------------------------------- numerics
def test_channels_last_fp32_matches_eager():
    model = tiny_model("vit_test", stem="conv", stem_width=8, head_std=0.5)
    x = random_images(model.cfg, n=4)
    want = model(x)
    path = FastPath("fp32", channels_last=True)
    assert_same_logits(paths.apply_path(model, path)(x), want, tol=1e-4)


def test_the_tools_path_is_fp32_eager_for_a_tiny_model():  # on every CPU, bf16 or not
    model = tiny_model(head_std=0.5)
    path = paths.inference_path(model, torch.device("cpu"), images=8)
    assert (path.precision, path.compile, path.channels_last) == ("fp32", False, False)
    with pytest.raises(ConfigError, match="^--precision: 'fp16' is not one of auto, fp32, bf16, int8$"):
        paths.inference_path(model, torch.device("cpu"), "fp16")
    with pytest.raises(ConfigError, match="^--engine: 'ort' is not one of auto, torch, onnxruntime$"):
        paths.inference_path(model, torch.device("cpu"), engine="ort")


# ------------------------------------------------------------------------------------ onnxruntime
needs_ort = pytest.mark.skipif(not onnxruntime_available(), reason="onnxruntime and onnx are not installed")


@needs_ort
@pytest.mark.parametrize("over", [{}, dict(stem="conv", stem_width=8)], ids=["patch stem", "conv stem"])
def test_onnxruntime_matches_eager(over, tmp_path, monkeypatch):
    from vitkit.infer.onnxrt import OrtModel

    monkeypatch.chdir(tmp_path)
    model = tiny_model(head_std=0.5, **over)
    net = paths.apply_path(model, FastPath("fp32", engine="onnxruntime", engine_asked=True))
    assert isinstance(net, OrtModel)
    for n in (1, 5):  # a dynamic batch
        x = random_images(model.cfg, n=n, seed=n)
        with torch.no_grad():
            assert_same_logits(net(x), model(x), tol=1e-4)
    assert net.fallback is None and list(tmp_path.iterdir()) == []  # exported in memory: no file left


@needs_ort
def test_onnxruntime_off_from_eager_falls_back_or_fails_when_forced():
    model = tiny_model(head_std=0.5)
    x = random_images(model.cfg, n=3)
    auto = FastPath("fp32", engine="onnxruntime", why=("onnxruntime: measured",))
    net = paths.apply_path(model, auto)
    real = net.run
    net.run = lambda images: real(images) + 1e-3
    with pytest.warns(VitkitWarning, match="^onnxruntime: logits differ from eager by 0.001 > 0.0001 on the first "
                                           "batch; ran torch instead$"):
        with torch.no_grad():
            got = net(x)
    with torch.no_grad():
        assert torch.equal(got, model(x)) and torch.equal(net(x), model(x))  # eager from then on
    assert paths.path_taken(auto, net) == ("fp32, eager (onnxruntime: measured; onnxruntime: logits differ from "
                                             "eager by 0.001 > 0.0001 on the first batch; ran torch instead)")
    forced = paths.apply_path(model, replace(auto, engine_asked=True))
    forced.run = net.run
    with pytest.raises(ExportError, match="^engine: onnxruntime: logits differ from eager by 0.001 > 0.0001 on"):
        with torch.no_grad():
            forced(x)


@needs_ort
def test_a_failed_export_falls_back_to_torch_in_one_line(monkeypatch):
    import vitkit.infer.onnxrt as onnxrt

    def broken(model, opset=18):
        raise RuntimeError("unsupported operator\nsecond line")

    monkeypatch.setattr(onnxrt, "onnx_bytes", broken)
    model = tiny_model(head_std=0.5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        net = paths.apply_path(model, FastPath("fp32", engine="onnxruntime"))
    assert [str(w.message) for w in seen] == [
        "onnxruntime: export or session failed: RuntimeError: unsupported operator; ran torch instead"]
    x = random_images(model.cfg, n=2)
    with torch.no_grad():
        assert torch.equal(net(x), model(x))
    with pytest.raises(ExportError, match="^engine: onnxruntime: export or session failed: RuntimeError: unsupported "
                                          "operator$"):
        paths.apply_path(model, FastPath("fp32", engine="onnxruntime", engine_asked=True))


@pytest.mark.skipif(not int8_available(), reason="no int8 kernels in this torch build")
def test_int8_agrees_with_fp32_on_top1_and_leaves_the_model_alone():
    model = tiny_model(head_std=0.5, embed_dim=64, num_heads=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = random_images(model.cfg, n=200, seed=3)
    q = quantize_int8(model)
    assert type(q.blocks[0].attn.qkv) is torch.nn.Linear and type(q.blocks[0].mlp.fc2) is torch.nn.Linear
    assert isinstance(q.blocks[1].attn.qkv, Int8Linear) and isinstance(q.head, Int8Linear)
    every = quantize_int8(model, float_blocks=0)
    assert isinstance(every.blocks[0].attn.qkv, Int8Linear)
    with pytest.raises(ConfigError, match="^float_blocks: must be >= 0, got -1$"):
        quantize_int8(model, float_blocks=-1)
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
        with paths.autocast(torch.device("cpu"), "bf16"):
            got = model(x).float()
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() >= 0.97
