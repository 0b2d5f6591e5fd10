"""bench: FLOPs against an analytic count, the shape of the result, error paths, CLI."""

import json

import pytest
import torch

import vitkit
from vitkit.cli.main import main
from vitkit.tools.bench import bench, count_flops, format_table, vit_flops

pytestmark = pytest.mark.usefixtures("one_thread")


def test_flops_of_a_tiny_vit_match_the_formula_written_out():
    m = vitkit.create_model("vit_test", seed=0)  # 32 px, P 8, C 3, D 32, depth 2, MLP 64, 10 classes
    N, T, D, C, P, hid = 16, 17, 32, 3, 8, 64
    stem = 2 * N * D * C * P * P  # patch embedding as a matmul per patch
    qkv = 2 * T * D * 3 * D
    attn = 2 * 2 * T * T * D  # QK^T and AV
    proj = 2 * T * D * D
    mlp = 2 * 2 * T * D * hid
    head = 2 * D * 10
    expect = stem + 2 * (qkv + attn + proj + mlp) + head
    assert expect == 828_288
    assert vit_flops(m.cfg) == expect
    assert count_flops(m) == expect


def test_flops_count_attention_under_fused_attention_too():
    # the model's default path is fused SDPA; the count must still include the attention matmuls
    m = vitkit.create_model("vit_test", seed=0, img_size=(48, 32), class_token=False, global_pool="avg")
    assert m.cfg.attn_impl == "fused"
    assert count_flops(m) == vit_flops(m.cfg)
    N = 6 * 4
    assert vit_flops(m.cfg) - vit_flops(m.cfg.replace(depth=1)) == (
        2 * N * 32 * 96 + 4 * N * N * 32 + 2 * N * 32 * 32 + 4 * N * 32 * 64)


def test_flops_count_a_map_head():
    m = vitkit.create_model("vit_test", seed=0, class_token=False, global_pool="map")
    N, D, hid = 16, 32, 64
    pool = 2 * D * D + 2 * N * D * 2 * D + 4 * N * D + 2 * D * D + 4 * D * hid  # q, kv, attention, proj, MLP
    assert vit_flops(m.cfg) - vit_flops(m.cfg.replace(global_pool="avg")) == pool
    assert count_flops(m) == vit_flops(m.cfg)


def test_bench_rows_for_each_mode_dtype_and_batch():
    res = bench("vit_test", batch_sizes=(1, 2), dtypes=("fp32", "int8"), modes=("infer", "train"),
                repeats=2, warmup=1, peak=False)
    assert res["flops_per_image"] == 828_288 and res["params"] == vitkit.count_params(vitkit.create_model("vit_test"))
    keys = [(r["mode"], r["dtype"], r["batch"]) for r in res["rows"]]
    assert keys == [("infer", "fp32", 1), ("infer", "fp32", 2), ("infer", "int8", 1), ("infer", "int8", 2),
                    ("train", "fp32", 1), ("train", "fp32", 2), ("train", "int8", 1), ("train", "int8", 2)]
    for r in res["rows"]:
        if r["mode"] == "train" and r["dtype"] == "int8":
            assert r["skipped"] == "int8 dynamic quantization is inference only"
            continue
        assert r["min_ms"] <= r["p50_ms"] <= r["p95_ms"] <= r["max_ms"]
        assert r["images_per_s"] == pytest.approx(r["batch"] / (r["p50_ms"] / 1e3))
        assert r["peak_mem_mib"] > 0
        flops = 828_288 * r["batch"] * (3 if r["mode"] == "train" else 1)
        assert r["tflops"] == pytest.approx(flops / (r["p50_ms"] / 1e3) / 1e12)
    assert "int8 = dynamic quantization" in format_table(res)


def test_auto_is_the_precision_the_tools_pick(monkeypatch):
    from vitkit.infer import paths
    from vitkit.infer.fastpath import Hardware

    monkeypatch.setattr(paths, "detect_hardware", lambda dev: Hardware("cpu", cpu_bf16_kind="avx512bf16"))  # AVX512-BF16
    res = bench("vit_test", batch_sizes=(1,), dtypes=("auto", "fp32"), repeats=1, warmup=0, peak=False)
    assert res["auto_dtype"] == "fp32"  # a tiny model: bf16 would not pay without AMX
    assert [r["dtype"] for r in res["rows"]] == ["fp32"]  # measured once


def test_bench_does_not_change_the_model_weights():
    m = vitkit.create_model("vit_test", seed=0)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    bench(m, batch_sizes=(2,), modes=("train",), repeats=1, warmup=0, peak=False)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_bench_errors():
    with pytest.raises(vitkit.ConfigError, match=r"--dtype: 'fp8' is not one of fp32, bf16, int8"):
        bench("vit_test", dtypes=("fp8",))
    with pytest.raises(vitkit.ConfigError, match=r"--mode: 'eval' is not one of infer, train"):
        bench("vit_test", modes=("eval",))
    with pytest.raises(vitkit.ConfigError, match=r"--batch-sizes: every batch size must be >= 1, got \[0\]"):
        bench("vit_test", batch_sizes=(0,))
    with pytest.raises(vitkit.CheckpointError, match=r"no_such_model: no such file or directory"):
        bench("no_such_model")


def test_cli_table_and_json(tmp_path, capsys):
    ckpt = vitkit.save(vitkit.create_model("vit_test", seed=0), tmp_path / "ck")
    threads = torch.get_num_threads()
    try:
        rc = main(["bench", str(ckpt), "--batch-sizes", "1,2", "--repeats", "2", "--warmup", "0", "--threads", "1",
                   "--device", "cpu", "--json"])
    finally:
        torch.set_num_threads(threads)  # --threads sets a process-wide value
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith(f"{ckpt}  32x32") and any(line.startswith("infer  fp32      2") for line in out)
    res = json.loads(out[-1])
    assert res["threads"] == 1 and [r["batch"] for r in res["rows"]] == [1, 2]
    assert set(res["peak_flops"]) == {"fp32"} and res["rows"][0]["mfu"] > 0


def test_each_row_runs_the_path_the_tools_take(monkeypatch):
    """bf16 inference on a CPU where packed weights pay runs the packed copy, as predict and eval do; a conv
    stem runs channels-last where that pays, on a copy; each row names its path, and the table lists them."""
    from vitkit.infer import packed, paths
    from vitkit.infer.fastpath import Hardware

    can_pack = packed.onednn_bf16_available()  # where oneDNN cannot, the rule keeps autocast
    amx = Hardware("cpu", cpu_bf16_kind="amx", onednn_bf16=can_pack)
    monkeypatch.setattr(paths, "detect_hardware", lambda dev: amx)
    built = []
    monkeypatch.setattr(paths, "Bf16Inference", lambda m, stream: built.append(m) or packed.Bf16Inference(m, stream))
    m = vitkit.create_model("vit_test", seed=0, stem="conv", stem_width=8)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    res = bench(m, batch_sizes=(2,), dtypes=("fp32", "bf16"), modes=("infer", "train"), repeats=1, warmup=0,
                peak=False)
    paths = {(r["mode"], r["dtype"]): r["path"] for r in res["rows"]}
    packed_words = ", packed bf16 weights, bf16 residual stream" if can_pack else ""  # both measured to pay on AMX
    assert paths[("infer", "bf16")].startswith(f"bf16, eager, channels_last{packed_words} (")
    assert paths[("infer", "fp32")].startswith("fp32, eager, channels_last (")
    assert paths[("train", "bf16")].startswith("bf16, eager, channels_last (")
    assert len(built) == can_pack  # the bf16 inference row only
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    assert all(p.is_contiguous() for p in m.parameters())  # channels-last went to the copies
    table = format_table(res)
    assert f"path infer bf16: {paths[('infer', 'bf16')]}" in table.splitlines()


def test_compile_is_forced_on_every_inference_path_and_replaces_the_packed_copy(monkeypatch):
    from vitkit.infer import paths
    from vitkit.infer.fastpath import Hardware
    from vitkit.tools.bench import bench_path

    monkeypatch.setattr(paths, "detect_hardware",
                        lambda dev: Hardware("cpu", cpu_bf16_kind="amx", onednn_bf16=True))
    m, cpu = vitkit.create_model("vit_tiny_patch16_224"), torch.device("cpu")
    assert bench_path(m, "infer", "bf16", 2, 3, False, cpu).packed
    for dtype in ("bf16", "fp32", "int8"):
        path = bench_path(m, "infer", dtype, 2, 3, True, cpu)
        assert (path.precision, path.compile, path.packed) == (dtype, True, False)
        assert path.describe().startswith(f"{dtype}, compiled")
    assert bench_path(m, "train", "bf16", 2, 3, True, cpu).compile
