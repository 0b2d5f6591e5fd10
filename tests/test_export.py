"""Export to ONNX / TorchScript / ExportedProgram: parity with eager on two batch sizes, error paths."""

import json

import pytest
import torch
from helpers import tiny_model

import vitkit
from vitkit.cli.main import main
from vitkit.tools.export import ExportError, export

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny(tmp_path, name="ckpt", **over):
    # the paper's zero head gives all-zero logits: a random head makes the outputs informative
    m = tiny_model(head_std=1.0, head_seed=1, labels=[f"c{i}" for i in range(10)], **over)
    return vitkit.save(m, tmp_path / name), m


@pytest.mark.parametrize("fmt,suffix", [("torchscript", ".pt"), ("exported-program", ".pt2")])
def test_torch_formats_match_eager_on_two_batch_sizes(tmp_path, fmt, suffix):
    ckpt, _ = _tiny(tmp_path)
    out = tmp_path / f"m{suffix}"
    res = export(ckpt, out, fmt)
    assert out.is_file() and res["bytes"] == out.stat().st_size
    shapes = [r["shape"] for r in res["check"]["checks"]]
    assert shapes == [[1, 3, 32, 32], [3, 3, 32, 32]]
    assert res["check"]["ok"] and res["check"]["max_abs_diff"] <= 1e-4


def test_onnx_matches_eager_with_onnxruntime(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    ckpt, model = _tiny(tmp_path)
    out = tmp_path / "m.onnx"
    res = export(ckpt, out, "onnx", opset=17)
    assert res["check"]["ok"] and res["check"]["max_abs_diff"] <= 1e-4
    # independent check: run the file with onnxruntime at a batch size the exporter never saw
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    got = torch.from_numpy(sess.run(None, {"images": x.numpy()})[0])
    with torch.no_grad():
        ref = model.eval()(x)
    assert ref.abs().max() > 0.1  # non-trivial logits
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_failed_check_reports_the_figure_and_leaves_no_file(tmp_path, monkeypatch):
    import vitkit.tools.export as ex

    ckpt, _ = _tiny(tmp_path)
    real = ex._runner

    def off_by(fmt, file):
        run = real(fmt, file)
        return lambda x: run(x) + 1e-3

    monkeypatch.setattr(ex, "_runner", off_by)
    out = tmp_path / "m.pt"
    with pytest.raises(ExportError, match=r"on input 1x3x32x32: max abs difference 0\.001 > 0\.0001"):
        export(ckpt, out, "torchscript")
    assert not out.exists() and list(tmp_path.glob(".m.pt*")) == []


def test_exported_program_needs_the_pt2_suffix(tmp_path):
    ckpt, _ = _tiny(tmp_path)
    with pytest.raises(ExportError, match=r"--out: .*m\.ep: an ExportedProgram file must end in \.pt2"):
        export(ckpt, tmp_path / "m.ep", "exported-program")


def test_dynamic_size_needs_a_dynamic_model(tmp_path):
    ckpt, _ = _tiny(tmp_path)
    with pytest.raises(ExportError, match=r"--dynamic-size: the model was built with dynamic_img_size=False"):
        export(ckpt, tmp_path / "m.pt2", "exported-program", dynamic_size=True)


@pytest.mark.parametrize("fmt,suffix", [("onnx", ".onnx"), ("exported-program", ".pt2")])
def test_dynamic_size_is_checked_at_a_second_image_size(tmp_path, fmt, suffix):
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    ckpt, _ = _tiny(tmp_path, dynamic_img_size=True)
    out = tmp_path / f"m{suffix}"
    res = export(ckpt, out, fmt, dynamic_size=True)
    assert {tuple(r["shape"][2:]) for r in res["check"]["checks"]} == {(32, 32), (40, 24)}
    assert res["check"]["max_abs_diff"] <= 1e-4 and out.exists()


def test_cli_json_and_errors(tmp_path, capsys):
    ckpt, _ = _tiny(tmp_path)
    out = tmp_path / "m.pt"
    assert main(["export", str(ckpt), "--format", "torchscript", "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["format"] == "torchscript" and res["check"]["ok"]

    assert main(["export", str(tmp_path / "nope"), "--format", "onnx", "--out", str(out)]) == 1
    assert "nope: no such file or directory" in capsys.readouterr().err

    with pytest.raises(SystemExit) as e:
        main(["export", str(ckpt), "--format", "tflite", "--out", str(out)])
    assert e.value.code == 2
    assert "argument --format: invalid choice: 'tflite'" in capsys.readouterr().err

    with pytest.raises(ExportError, match=r"--format: 'tflite' is not one of onnx, torchscript, exported-program"):
        export(ckpt, out, "tflite")
