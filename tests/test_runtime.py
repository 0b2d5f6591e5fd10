"""Runtime choices: the device, the precision, the CPUs, parameter counts, the model a tool runs, and
the one image-size parser (strict.to_hw) with its command-line wrapper.

CUDA and MPS are faked by patching torch's availability probes, so every branch runs on a CPU-only
machine (and the same answers hold on a machine that has a GPU)."""

import argparse

import numpy as np
import pytest
import torch
from torch import nn

import vitkit
from vitkit.cli.commands import image_size
from vitkit.core import hardware
from vitkit.core.errors import ConfigError, DataError
from vitkit.core.hardware import cpu_bf16_kind, cpu_has_fast_bf16, resolve_device, usable_cpus
from vitkit.core.strict import to_hw
from vitkit.infer import paths
from vitkit.infer.paths import autocast, detect_hardware, pick_precision
from vitkit.model.config import ViTConfig
from vitkit.model.vit import count_params
from vitkit.tools.loading import label_names, load_model


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


@pytest.fixture()
def no_gpu(monkeypatch):
    """A machine with neither CUDA nor MPS."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture()
def two_gpus(monkeypatch):
    """A machine with two CUDA GPUs (only their count is asked)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


# ------------------------------------------------------------------------------------------ devices
def test_auto_is_the_cpu_without_a_gpu(no_gpu):
    assert resolve_device() == torch.device("cpu")
    assert resolve_device("auto", local_rank=3) == torch.device("cpu")


def test_auto_on_this_machine_is_an_available_device():
    dev = resolve_device("auto")
    assert dev.type in ("cpu", "cuda", "mps")
    if not torch.cuda.is_available():
        assert dev.type != "cuda"


def test_cpu_by_name_and_as_a_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu0", "bogus", "cuda:x", "", "tpu"])
def test_a_malformed_name_is_one_line_naming_the_argument(name):
    with pytest.raises(ConfigError) as e:
        resolve_device(name, what="--device")
    assert _one_line(e) == f"--device: {name!r} is not a device (auto, cpu, cuda, cuda:N or mps)"
    with pytest.raises(ConfigError, match=rf"^device: {name!r} is not a device"):
        resolve_device(name)


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_a_gpu_is_refused(no_gpu, name):
    with pytest.raises(ConfigError) as e:
        resolve_device(name, what="--device")
    assert _one_line(e) == f"--device: {name!r} was asked for but no CUDA GPU is available"


def test_mps_without_mps_is_refused(no_gpu):
    with pytest.raises(ConfigError) as e:
        resolve_device("mps")
    assert _one_line(e) == "device: 'mps' was asked for but MPS is not available"


def test_a_bare_cuda_is_this_processs_local_gpu(two_gpus):
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda", local_rank=3) == torch.device("cuda", 1)  # wraps round the GPUs
    assert resolve_device("auto", local_rank=2) == torch.device("cuda", 0)
    assert resolve_device(torch.device("cuda"), local_rank=1) == torch.device("cuda", 1)


def test_a_cuda_index_is_kept_and_checked(two_gpus):
    assert resolve_device("cuda:1", local_rank=0) == torch.device("cuda", 1)
    with pytest.raises(ConfigError) as e:
        resolve_device("cuda:2", what="--device")
    assert _one_line(e) == "--device: 'cuda:2': this machine has 2 CUDA GPU(s)"


# ---------------------------------------------------------------------------------------- precision
def test_auto_precision_on_the_cpu_follows_its_bf16_support(monkeypatch):
    cpu = torch.device("cpu")
    for kind in ("amx", "avx512bf16"):
        monkeypatch.setattr(paths, "cpu_bf16_kind", lambda: kind)
        assert pick_precision("auto", cpu) == "bf16"
    monkeypatch.setattr(paths, "cpu_bf16_kind", lambda: "none")
    assert pick_precision("auto", cpu) == "fp32"


def test_auto_precision_on_cuda_and_mps(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert pick_precision("auto", cuda) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert pick_precision("auto", cuda) == "fp16"
    assert pick_precision("auto", torch.device("mps")) == "fp32"


def test_named_precisions_are_kept_and_fp16_needs_cuda():
    cpu = torch.device("cpu")
    assert [pick_precision(p, cpu) for p in ("fp32", "bf16")] == ["fp32", "bf16"]
    assert pick_precision("fp16", torch.device("cuda", 0)) == "fp16"
    for dev in (cpu, torch.device("mps")):
        with pytest.raises(ConfigError) as e:
            pick_precision("fp16", dev)
        assert _one_line(e) == (f"precision: 'fp16' needs a CUDA device (with a gradient scaler); on {dev.type} "
                                "use bf16 or fp32")


@pytest.mark.parametrize("amx, avx512", [(True, False), (False, True), (False, False)])
def test_cpu_bf16_is_detected_from_either_probe(monkeypatch, amx, avx512):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512, raising=False)
    assert cpu_has_fast_bf16() is (amx or avx512)
    assert cpu_bf16_kind() == ("amx" if amx else "avx512bf16" if avx512 else "none")
    hw = detect_hardware(torch.device("cpu"))
    assert (hw.cpu_bf16, hw.cpu_bf16_kind) == (amx or avx512, cpu_bf16_kind())
    assert not hw.onednn_bf16 or (amx or avx512)  # packing is asked of oneDNN on a bf16 CPU only


@pytest.mark.parametrize("capability", ["AVX2", "DEFAULT"])
def test_kernels_held_below_avx512_mean_no_bf16_whatever_the_cpu_has(monkeypatch, capability):
    """An AVX2-only CPU, or ATEN_CPU_CAPABILITY=avx2 emulating one on a CPU with AMX: torch's kernels (and
    oneDNN's, held to AVX2 alongside) have no bf16 matrix instructions, so neither do the rules."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert cpu_bf16_kind() == "none" and not detect_hardware(torch.device("cpu")).cpu_bf16


def test_a_probe_that_fails_means_no_bf16(monkeypatch):
    def broken():
        raise RuntimeError("no cpuinfo")

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", broken, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", broken, raising=False)
    assert cpu_has_fast_bf16() is False


def test_autocast_is_none_for_fp32_and_bf16_otherwise():
    cpu = torch.device("cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast(cpu, "fp32"):
        assert (a @ b).dtype == torch.float32
    with autocast(cpu, "bf16"):
        assert (a @ b).dtype == torch.bfloat16


# ------------------------------------------------------------------------------- CPUs, parameters
def test_usable_cpus_is_a_positive_count():
    n = usable_cpus()
    assert isinstance(n, int) and n >= 1


def test_count_params_all_and_trainable():
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))  # 12 + 4 and 8 + 2 parameters
    net[0].requires_grad_(False)
    assert count_params(net) == 26
    assert count_params(net, trainable=True) == 10
    assert vitkit.count_params is count_params


# ------------------------------------------------------------------------------ the model a tool runs
def test_load_model_takes_a_module_or_a_checkpoint(tmp_path):
    model = vitkit.create_model("vit_test", seed=0).train()
    same = load_model(model)
    assert same is model and not same.training
    model.labels = [f"c{i}" for i in range(model.cfg.num_classes)]
    loaded = load_model(vitkit.save(model, tmp_path / "ckpt"), "cpu")
    assert not loaded.training and next(loaded.parameters()).device.type == "cpu"
    assert torch.equal(loaded.head.weight, model.head.weight)
    assert label_names(loaded) == model.labels


def test_label_names_without_labels_are_the_class_indices():
    model = vitkit.create_model("vit_test", seed=0, num_classes=3)
    assert model.labels is None
    assert label_names(model) == ["0", "1", "2"]


def test_load_model_checks_the_device_first(tmp_path):
    with pytest.raises(ConfigError, match=r"^--device: 'gpu0' is not a device"):
        load_model(tmp_path / "no-such-checkpoint", "gpu0")


# -------------------------------------------------------------------------------------- image sizes
@pytest.mark.parametrize("value, hw", [
    (32, (32, 32)),
    ((24, 40), (24, 40)),
    ([24, 40], (24, 40)),
    (torch.Size([24, 40]), (24, 40)),
    (np.int64(16), (16, 16)),
    ((np.int32(8), np.int64(12)), (8, 12)),
    ("32", (32, 32)),
    ("24x40", (24, 40)),
    ("24X40", (24, 40)),
    ("24,40", (24, 40)),
    (" 24 x 40 ", (24, 40)),
])
def test_to_hw_accepts_every_form(value, hw):
    got = to_hw(value)
    assert got == hw and type(got) is tuple and all(type(v) is int for v in got)


@pytest.mark.parametrize("value, why", [
    (True, "expected N or (H, W), got True"),
    (2.5, "expected N or (H, W), got 2.5"),
    (None, "expected N or (H, W), got None"),
    ((32,), "expected N or (H, W), got (32,)"),
    ((1, 2, 3), "expected N or (H, W), got (1, 2, 3)"),
    ((32, 32.0), "expected N or (H, W), got (32, 32.0)"),
    ((True, 4), "expected N or (H, W), got (True, 4)"),
    ("big", "expected N or HxW, got 'big'"),
    ("", "expected N or HxW, got ''"),
    ("1x2x3", "expected N or HxW, got '1x2x3'"),
    ("32x", "expected N or HxW, got '32x'"),
    (0, "sizes must be positive, got 0"),
    ((0, 4), "sizes must be positive, got (0, 4)"),
    ([4, -1], "sizes must be positive, got [4, -1]"),
    ("0", "sizes must be positive, got '0'"),
])
def test_to_hw_refuses_in_one_line_naming_the_argument(value, why):
    with pytest.raises(ConfigError) as e:
        to_hw(value, "data.img_size")
    assert _one_line(e) == f"data.img_size: {why}"


def test_to_hw_raises_the_callers_error_type():
    with pytest.raises(DataError, match=r"^img_size: expected N or HxW, got 'big'$"):
        to_hw("big", error=DataError)
    with pytest.raises(DataError, match=r"^img_size: sizes must be positive, got 0$"):
        to_hw(0, error=DataError)


def test_the_size_parser_behind_the_config_and_the_command_line():
    assert ViTConfig(img_size=[24, 40], patch_size=8).img_size == (24, 40)
    with pytest.raises(ConfigError, match=r"^ViTConfig\.img_size: expected N or \(H, W\), got True$"):
        ViTConfig(img_size=True)
    assert image_size("24x40") == (24, 40) and image_size("32") == (32, 32)
    with pytest.raises(argparse.ArgumentTypeError) as e:  # argparse adds "argument --img-size: " itself
        image_size("big")
    assert str(e.value) == "expected N or HxW, got 'big'"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^sizes must be positive, got '0x8'$"):
        image_size("0x8")



def test_each_command_keeps_freed_memory_for_reuse(monkeypatch, capsys):
    """keep_freed_memory acts on the whole process, so the command line sets it, once per command."""
    from vitkit.cli.main import main

    calls = []
    monkeypatch.setattr(hardware, "keep_freed_memory", lambda: calls.append(1) or True)
    assert main(["list"]) == 0 and calls == [1]
    assert main(["--version"]) == 0 and calls == [1]  # no command ran
    capsys.readouterr()


def test_keep_freed_memory_applies_on_glibc_only():
    import platform
    import subprocess
    import sys

    probe = "import vitkit.core.hardware as r; print(r.keep_freed_memory())"  # a fresh process: this one stays as it is
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert done.stdout.split() == [str(glibc)]
