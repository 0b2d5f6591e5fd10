"""predict: top-k through the model's own preprocessing, unreadable files reported, CLI outputs."""

import csv
import io
import json
import re

import numpy as np
import pytest
import torch
from helpers import tiny_model
from PIL import Image

import vitkit
from vitkit.cli.main import main
from vitkit.data import decode_image, to_model_input
from vitkit.tools.predict import predict

pytestmark = pytest.mark.usefixtures("one_thread")

LABELS = [f"class_{i}" for i in range(10)]


@pytest.fixture()
def ckpt(tmp_path):
    return vitkit.save(tiny_model(head_std=1.0, head_seed=1, labels=LABELS), tmp_path / "ckpt")


@pytest.fixture()
def images(tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "imgs"
    (d / "sub").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 255, (50, 80, 3), dtype=np.uint8)).save(d / "wide.png")  # RGB, 5:8
    Image.fromarray(rng.integers(0, 255, (20, 20), dtype=np.uint8)).save(d / "sub" / "grey.jpg")  # L
    Image.fromarray(rng.integers(0, 255, (40, 30, 4), dtype=np.uint8)).save(d / "alpha.png")  # RGBA
    Image.fromarray(rng.integers(0, 255, (33, 47, 3), dtype=np.uint8)).convert("P").save(d / "pal.gif")
    (d / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    return d


def test_every_image_gets_top_k_matching_the_model(ckpt, images):
    res = predict(ckpt, [images], top_k=3, batch_size=2)
    names = sorted(p["path"].rsplit("/", 1)[-1] for p in res["predictions"])
    assert names == ["alpha.png", "grey.jpg", "pal.gif", "wide.png"]
    assert [e["path"] for e in res["errors"]] == [str(images / "broken.jpg")]
    assert res["errors"][0]["error"].startswith(str(images / "broken.jpg") + ": ")
    model = vitkit.load(ckpt)
    for p in res["predictions"]:
        x = to_model_input(decode_image(p["path"], 3), (32, 32), model.preprocess)
        with torch.no_grad():
            probs = model(x[None]).softmax(-1)[0]
        top = probs.topk(3)
        assert [t["index"] for t in p["top"]] == top.indices.tolist()
        assert [t["label"] for t in p["top"]] == [LABELS[i] for i in top.indices.tolist()]
        np.testing.assert_allclose([t["prob"] for t in p["top"]], top.values.numpy(), atol=1e-6)
        assert p["top"][0]["prob"] >= p["top"][1]["prob"] >= p["top"][2]["prob"]


def test_batch_size_does_not_change_results(ckpt, images):
    a = predict(ckpt, [images], top_k=10, batch_size=1)["predictions"]
    b = predict(ckpt, [images], top_k=10, batch_size=64)["predictions"]
    assert [p["path"] for p in a] == [p["path"] for p in b]
    for pa, pb in zip(a, b):
        np.testing.assert_allclose([t["prob"] for t in pa["top"]], [t["prob"] for t in pb["top"]], atol=1e-5)
        assert abs(sum(t["prob"] for t in pa["top"]) - 1.0) < 1e-5  # top-10 of 10 classes


def test_strict_stops_at_the_first_bad_file(ckpt, images):
    with pytest.raises(vitkit.DataError, match=r"broken\.jpg: "):
        predict(ckpt, [images], strict=True)
    with pytest.raises(vitkit.DataError, match=r"missing\.png: no such file or folder"):
        predict(ckpt, [str(images / "missing.png")], strict=True)


def test_cli_table_json_csv_and_errors(ckpt, images, capsys):
    assert main(["predict", str(ckpt), str(images / "wide.png"), str(images / "broken.jpg"), "--top-k", "2"]) == 0
    cap = capsys.readouterr()
    lines = cap.out.strip().splitlines()
    assert lines[0].split() == ["path", "top-1", "top-2"]
    assert lines[1].startswith(str(images / "wide.png")) and "class_" in lines[1]
    assert lines[-1] == "1 image(s) classified, 1 skipped (see above)"
    assert f"vitkit: warning: skipped {images / 'broken.jpg'}: " in cap.err

    assert main(["predict", str(ckpt), str(images / "*.png"), str(images / "nope.png"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [p["path"].rsplit("/", 1)[-1] for p in res["predictions"]] == ["alpha.png", "wide.png"]
    assert res["errors"] == [{"path": str(images / "nope.png"), "error": f"{images / 'nope.png'}: no such file or folder"}]

    assert main(["predict", str(ckpt), str(images / "sub"), "--csv", "--top-k", "3"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["path", "rank", "index", "label", "prob"]
    assert [r[1] for r in rows[1:]] == ["1", "2", "3"] and rows[1][0].endswith("grey.jpg")

    assert main(["predict", str(ckpt), str(images), "--strict"]) == 1
    assert "vitkit: error: " in capsys.readouterr().err

    assert main(["predict", str(images / "no_ckpt"), str(images)]) == 1
    assert "no_ckpt: no such file or directory" in capsys.readouterr().err

    with pytest.raises(SystemExit) as e:
        main(["predict", str(ckpt), str(images), "--json", "--csv"])
    assert e.value.code == 2


def test_the_path_taken_is_said_and_int8_is_opt_in(ckpt, images, capsys):
    assert main(["predict", str(ckpt), str(images / "wide.png")]) == 0
    assert capsys.readouterr().out.splitlines()[-2].startswith("ran fp32, eager (fp32: ")  # tiny: bf16 won't pay
    fp32 = predict(ckpt, [images], precision="fp32")
    int8 = predict(ckpt, [images], precision="int8")
    assert re.match(r"int8, eager, (onednn|fbgemm) int8 kernels \(int8 weights", int8["fast_path"])
    assert [p["top"][0]["index"] for p in int8["predictions"]] == [p["top"][0]["index"] for p in fp32["predictions"]]


def test_onnxruntime_gives_the_same_top1_and_says_so(ckpt, images, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    torch_res = predict(ckpt, [images], batch_size=2, engine="torch")
    ort_res = predict(ckpt, [images], batch_size=2, engine="onnxruntime")
    assert ort_res["fast_path"] == "fp32, onnxruntime (fp32: onnxruntime runs fp32; onnxruntime: asked for)"
    assert torch_res["fast_path"].startswith("fp32, eager (")
    top1 = [[(p["path"], p["top"][0]["index"]) for p in r["predictions"]] for r in (torch_res, ort_res)]
    assert top1[0] == top1[1] and len(top1[0]) == 4
    assert main(["predict", str(ckpt), str(images / "wide.png"), "--engine", "onnxruntime"]) == 0
    assert capsys.readouterr().out.splitlines()[-2] == ("ran fp32, onnxruntime (fp32: onnxruntime runs fp32; "
                                                        "onnxruntime: asked for)")


def test_engine_errors_are_one_line(ckpt, images, capsys, monkeypatch):
    from vitkit.infer import paths

    assert main(["predict", str(ckpt), str(images), "--engine", "onnxruntime", "--precision", "int8"]) == 1
    err = capsys.readouterr().err
    assert err == "vitkit: error: engine: onnxruntime runs fp32, not int8 (use precision auto or fp32 with it)\n"
    monkeypatch.setattr(paths, "onnxruntime_available", lambda: False)
    assert main(["predict", str(ckpt), str(images), "--engine", "onnxruntime"]) == 1
    want = "vitkit: error: engine: onnxruntime is not installed: pip install 'vitkit[onnx]'\n"
    assert capsys.readouterr().err == want
    with pytest.raises(SystemExit):
        main(["predict", str(ckpt), str(images), "--engine", "tvm"])
