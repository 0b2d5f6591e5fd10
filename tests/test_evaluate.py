"""evaluate: metrics against an independent computation, class matching, outputs, error paths."""

import json

import numpy as np
import pytest
import torch
from helpers import idx_bytes, image_folder, tiny_model
from PIL import Image

import vitkit
from vitkit.cli.main import main
from vitkit.data import decode_image, eval_batch
from vitkit.tools.evaluate import evaluate

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["cat", "dog", "fox"]


def _model(seed=0):
    return tiny_model(seed=seed, num_classes=3, head_std=3.0, labels=CLASSES)


@pytest.fixture()
def data(tmp_path):
    """split-folder data: train/ and test/, 3 classes, 32x32 RGB images."""
    return image_folder(tmp_path / "data", CLASSES, n=4, test=6)


def mnist_folder(root):
    """MNIST IDX files of random 28x28 digits: 30 training images and 12 test images (t10k)."""
    rng = np.random.default_rng(0)
    root.mkdir()
    for part, n in (("train", 30), ("t10k", 12)):
        (root / f"{part}-images-idx3-ubyte").write_bytes(idx_bytes(rng.integers(0, 255, (n, 28, 28))))
        (root / f"{part}-labels-idx1-ubyte").write_bytes(idx_bytes(np.arange(n) % 10))
    return root


def _reference(model, root):
    """top-1, loss and confusion computed image by image, independently of evaluate()."""
    conf = np.zeros((3, 3), int)
    losses = []
    for t, c in enumerate(CLASSES):
        for f in sorted((root / "test" / c).iterdir()):
            x = eval_batch(decode_image(f, 3)[None], (32, 32), model.preprocess)
            with torch.no_grad():
                logits = model(x)[0]
            conf[t, int(logits.argmax())] += 1
            losses.append(float(torch.nn.functional.cross_entropy(logits[None], torch.tensor([t]))))
    return conf, float(np.mean(losses))


def test_metrics_match_an_independent_computation(tmp_path, data):
    model = _model()
    ckpt = vitkit.save(model, tmp_path / "ckpt")
    res = evaluate(ckpt, data, batch_size=4)
    assert res["split"] == "test" and res["num_images"] == 18 and res["format"] == "split-folder"
    conf, loss = _reference(vitkit.load(ckpt), data)
    assert res["confusion"] == conf.tolist()
    assert res["top1"] == pytest.approx(np.trace(conf) / 18)
    assert res["loss"] == pytest.approx(loss, abs=2e-3)
    assert res["top5_k"] == 3 and res["top5"] == 1.0
    for j, c in enumerate(res["per_class"]):
        tp = conf[j, j]
        p = tp / conf[:, j].sum() if conf[:, j].sum() else 0.0
        r = tp / conf[j].sum()
        assert c["name"] == CLASSES[j] and c["support"] == 6
        assert c["precision"] == pytest.approx(p) and c["recall"] == pytest.approx(r)
        assert c["f1"] == pytest.approx(2 * p * r / (p + r) if p + r else 0.0)
    wrong = 18 - np.trace(conf)
    assert len(res["worst"]) == min(16, wrong)
    assert all(w["true"] != w["pred"] and w["path"].endswith(".png") for w in res["worst"])
    assert [w["prob"] for w in res["worst"]] == sorted((w["prob"] for w in res["worst"]), reverse=True)


def _mirror_symmetric_model():
    """A model whose logits cannot tell an image from its mirror: no positions, average pooling, and
    left-right symmetric patch filters (a mirror image permutes the tokens, which attention ignores)."""
    m = tiny_model(seed=1, num_classes=3, head_std=3.0, labels=CLASSES, pos_embed="none", class_token=False,
                   global_pool="avg")
    with torch.no_grad():
        w = m.patch_embed.proj.weight
        w.copy_((w + w.flip(-1)) / 2)
    return m


def test_flip_tta_averages_the_logits_of_the_image_and_its_mirror(tmp_path, data):
    from vitkit.infer.paths import model_logits

    model = _model()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model_logits(model, x, tta=True), (model(x) + model(x.flip(-1))) / 2)
        assert torch.equal(model_logits(model, x), model(x))
    sym = _mirror_symmetric_model()
    with torch.no_grad():
        torch.testing.assert_close(model_logits(sym, x, tta=True), sym(x), atol=1e-5, rtol=0)
    plain, tta = evaluate(sym, data), evaluate(sym, data, tta=True)  # a symmetric model: the same result
    assert tta["tta"] and not plain["tta"]
    assert tta["top1"] == plain["top1"] and tta["confusion"] == plain["confusion"]
    assert tta["loss"] == pytest.approx(plain["loss"], abs=1e-5)
    ckpt = vitkit.save(model, tmp_path / "ckpt")  # an asymmetric one: its own result, the mean of both views
    res = evaluate(ckpt, data, tta=True)
    mirrored = evaluate(ckpt, data)
    assert res["num_images"] == mirrored["num_images"] == 18


def _moved(x: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """``x`` moved (dy, dx) px, each pixel read from its source by index, out-of-range sources mirrored
    about the edge pixel (reflection): the reference for ``shifted_views``."""
    def source(n: int, d: int) -> torch.Tensor:
        i = torch.arange(n) - d
        return torch.where(i < 0, -i, torch.where(i >= n, 2 * (n - 1) - i, i))

    return x[..., source(x.shape[-2], dy), :][..., source(x.shape[-1], dx)]


def test_shift_tta_adds_two_diagonally_moved_flip_averages_at_a_quarter_each(data):
    from vitkit.core.errors import ConfigError
    from vitkit.infer.paths import model_logits, shifted_views

    model = _model()
    x = torch.randn(4, 3, 32, 32)
    down, up = shifted_views(x, 2)
    assert torch.equal(down, _moved(x, 2, 2)) and torch.equal(up, _moved(x, -2, -2))
    assert torch.equal(down[..., 2:, 2:], x[..., :-2, :-2]) and torch.equal(down[..., 0, 0], x[..., 2, 2])
    with torch.no_grad():
        flips = [model_logits(model, v, tta=True) for v in (x, _moved(x, 1, 1), _moved(x, -1, -1))]
        torch.testing.assert_close(model_logits(model, x, tta=True, shift=1),
                                   flips[0] / 2 + (flips[1] + flips[2]) / 4, atol=1e-6, rtol=1e-6)
        assert torch.equal(model_logits(model, x, tta=False, shift=1), model(x))  # the shift rides on the flips
    with pytest.raises(ConfigError, match=r"tta_shift: must be between 1 and 31 px for 32x32 inputs, got 32"):
        shifted_views(x, 32)
    res = evaluate(_model(), data, tta=True, tta_shift=1)
    assert res["tta"] and res["tta_shift"] == 1 and res["num_images"] == 18
    with pytest.raises(ConfigError, match=r"^--tta-shift: 1 px adds translated views to test-time flips; it needs --tta$"):
        evaluate(_model(), data, tta_shift=1)


def test_labels_in_another_order_are_matched_by_name(tmp_path, data):
    a = _model()
    b = _model()
    with torch.no_grad():  # same classifier, classes listed in reverse
        b.head.weight.copy_(a.head.weight.flip(0))
        b.head.bias.copy_(a.head.bias.flip(0))
    b.labels = CLASSES[::-1]
    ra = evaluate(a, data, batch_size=64)
    rb = evaluate(b, data, batch_size=64)
    assert ra["top1"] == rb["top1"] and ra["loss"] == pytest.approx(rb["loss"], abs=1e-5)
    assert np.array(ra["confusion"]).tolist() == np.array(rb["confusion"])[::-1, ::-1].tolist()


def test_class_mismatch_names_both(tmp_path, data):
    m = _model()
    m.labels = ["ant", "bee", "cow"]
    with pytest.raises(vitkit.DataError, match=r"data: the dataset's 3 classes \(cat, dog, fox\) do not match the "
                                               r"model's 3 labels \(ant, bee, cow\)"):
        evaluate(m, data)
    m = vitkit.create_model("vit_test", seed=0)  # 10 outputs, no labels
    with pytest.raises(vitkit.DataError, match=r"the dataset has 3 classes \(cat, dog, fox\) but the model's head "
                                               r"has 10 outputs \(no labels saved\)"):
        evaluate(m, data)


# -------------------------------------------------------------------------------- which images are scored
def test_a_plain_folder_is_scored_whole(tmp_path, data):
    import shutil

    shutil.rmtree(data / "test")
    (data / "train").rename(tmp_path / "flat")
    res = evaluate(_model(), tmp_path / "flat")
    assert res["split"] == "all" and res["format"] == "folder" and res["num_images"] == 12
    assert res["scored"] == "whole: all 12 images"
    # --split val asks for a carve of it: seeded, as a run would hold it out
    res = evaluate(_model(), tmp_path / "flat", split="val", val_fraction=0.25)
    assert res["num_images"] == 3 and res["scored"] == "validation carve (seed 0, 25% of the training images): all 3 images"
    assert evaluate(_model(), tmp_path / "flat", split="train")["num_images"] == 12
    with pytest.raises(vitkit.DataError, match=r"flat: has no 'test' split \(it has: train\)"):
        evaluate(_model(), tmp_path / "flat", split="test")


def test_data_with_a_test_part_gives_it_and_split_chooses_another(data):
    assert evaluate(_model(), data)["scored"] == "test part: all 18 images"
    res = evaluate(_model(), data, split="all")
    assert res["num_images"] == 30 and res["scored"] == "all parts (train, test): all 30 images"
    assert sum(c["support"] for c in res["per_class"]) == 30
    assert evaluate(_model(), data, split="train")["scored"] == "train part: all 12 images"
    (data / "test").rename(data / "val")  # train/ + val/: the val part
    assert evaluate(_model(), data)["scored"] == "val part: all 18 images"


def test_mnist_and_cifar_give_their_test_part(tmp_path):
    import pickle

    rng = np.random.default_rng(0)
    res = evaluate(tiny_model(in_chans=1), mnist_folder(tmp_path / "mnist"))
    assert (res["format"], res["scored"]) == ("mnist", "test part: all 12 images")
    cifar = tmp_path / "cifar-10-batches-py"
    cifar.mkdir()
    for name, n in (("data_batch_1", 20), ("test_batch", 10)):
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": [i % 10 for i in range(n)]}
        (cifar / name).write_bytes(pickle.dumps(batch, protocol=2))
    res = evaluate(tiny_model(), cifar)
    assert (res["format"], res["scored"]) == ("cifar10", "test part: all 10 images")
    assert evaluate(tiny_model(), cifar, split="all")["num_images"] == 30


def test_a_run_without_data_is_scored_on_its_validation_carve(tmp_path, capsys):
    """A run on a plain folder held out a seeded 10% to validate on: eval of the run directory without
    --data scores exactly those images (best/ is the model that scored best on them)."""
    from helpers import FAST_TRAIN_ARGS

    folder = image_folder(tmp_path / "data", CLASSES, n=10, test=0) / "train"
    run = tmp_path / "run"
    assert main(["train", "--data", str(folder), "--epochs", "2", "--seed", "3", "--out", str(run), "--json",
                 *FAST_TRAIN_ARGS]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    res = evaluate(run)
    assert res["data"] == str(folder) and res["split"] == "val" and res["num_images"] == 3
    assert res["scored"] == "the run's validation carve (seed 3, 10% of the training images): all 3 images"
    assert res["top1"] == pytest.approx(summary["best_val_acc"], abs=1e-5)
    assert evaluate(run, split="train")["scored"] == "train part less the run's validation carve (seed 3): all 27 images"
    # given --data, the same folder is data like any other: scored whole
    assert evaluate(run, folder)["scored"] == "whole: all 30 images"
    assert main(["eval", str(run)]) == 0
    assert capsys.readouterr().out.startswith(f"{folder} (folder), the run's validation carve (seed 3, 10% of the "
                                              "training images): all 3 images")


def test_out_folder_and_cli(tmp_path, data, capsys):
    ckpt = vitkit.save(_model(), tmp_path / "ckpt")
    out = tmp_path / "eval"
    assert main(["eval", str(ckpt), "--data", str(data), "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["top1"] == res["top1"] and on_disk["confusion"] == res["confusion"]
    assert json.loads((out / "confusion.json").read_text())["matrix"] == res["confusion"]
    if res["worst"]:
        with Image.open(out / "worst.png") as im:
            assert im.format == "PNG"
    pytest.importorskip("matplotlib")
    with Image.open(out / "confusion.png") as im:
        assert im.format == "PNG" and im.width > 200

    assert main(["eval", str(ckpt), "--data", str(data)]) == 0
    text = capsys.readouterr().out
    assert "split-folder), test part: all 18 images" in text and "cat " in text

    # images of other sizes are brought to the model's size
    Image.fromarray(np.zeros((40, 56, 3), np.uint8)).save(data / "test" / "dog" / "wide.png")
    assert evaluate(ckpt, data)["num_images"] == 19

    assert main(["eval", str(tmp_path / "missing"), "--data", str(data)]) == 1
    assert "missing: no such file or directory" in capsys.readouterr().err
    assert main(["eval", str(ckpt), "--data", str(tmp_path / "nodata")]) == 1
    assert "nodata" in capsys.readouterr().err


def test_array_dataset_lists_mistakes_by_index_and_grey_model(tmp_path):
    """MNIST IDX files (grey 28x28) on a grey model of another size: resized by eval_batch."""
    root = mnist_folder(tmp_path / "mnist")
    m = tiny_model(in_chans=1, head_std=3.0)
    res = evaluate(m, root, out=tmp_path / "ev")
    assert res["format"] == "mnist" and res["split"] == "test" and res["num_images"] == 12
    assert sum(map(sum, res["confusion"])) == 12 and [c["support"] for c in res["per_class"]] == [2, 2] + [1] * 8
    assert res["worst"] and all("path" not in w and 0 <= w["index"] < 12 for w in res["worst"])
    assert (tmp_path / "ev" / "worst.png").is_file()


def test_unreadable_files_are_skipped_and_counted(tmp_path, data, capsys):
    (data / "test" / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    res = evaluate(_model(), data)
    assert res["num_images"] == 18 and res["skipped_files"] == 1
    assert main(["eval", str(vitkit.save(_model(), tmp_path / "ck")), "--data", str(data)]) == 0
    assert "test part: all 18 images (1 unreadable file(s) skipped)" in capsys.readouterr().out


def test_a_run_is_scored_with_its_own_tta_unless_told(tmp_path, data, capsys):
    from helpers import FAST_TRAIN_ARGS

    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", "--out", str(run), "--set", "tta=true",
                 "--tta-shift", "1", *FAST_TRAIN_ARGS]) == 0
    assert json.loads((run / "config.json").read_text())["tta_shift"] == 1
    views = lambda res: (res["tta"], res["tta_shift"])  # noqa: E731
    assert views(evaluate(run)) == (True, 1) and views(evaluate(run, tta=False)) == (False, 0)
    assert views(evaluate(run, tta_shift=0)) == (True, 0) and views(evaluate(run, tta_shift=2)) == (True, 2)
    assert views(evaluate(run / "last", data)) == (True, 1)  # a checkpoint of the run: the run's own
    assert views(evaluate(vitkit.save(vitkit.load(run), tmp_path / "elsewhere"), data)) == (False, 0)
    assert main(["eval", str(run), "--no-tta"]) == 0
    assert ", flip TTA" not in capsys.readouterr().out.splitlines()[0]
    assert main(["eval", str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(", flip TTA with 1-px shifts")
    assert main(["eval", str(run), "--tta-shift", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(", flip TTA")
    assert main(["eval", str(run), "--no-tta", "--tta-shift", "1"]) == 1
    assert capsys.readouterr().err.strip().endswith("--tta-shift: 1 px adds translated views to test-time flips; "
                                                    "it needs --tta")
    # a shift the model's inputs cannot take is refused before training, not at the run's evaluation
    assert main(["train", "--data", str(data), "--epochs", "1", "--out", str(tmp_path / "wide"), "--set", "tta=true",
                 "--tta-shift", "32", *FAST_TRAIN_ARGS]) == 1
    assert capsys.readouterr().err.strip().endswith("tta_shift: must be between 1 and 31 px for 32x32 inputs, got 32")
    assert not any((tmp_path / "wide").glob("*"))  # nothing trained, nothing written


def test_the_path_taken_is_in_the_result_and_int8_scores_like_fp32(data):
    fp32, int8 = (evaluate(_model(), data, precision=p) for p in ("auto", "int8"))
    assert fp32["fast_path"].startswith("fp32, eager") and int8["fast_path"].startswith("int8, eager")
    assert int8["num_images"] == fp32["num_images"] and abs(int8["top1"] - fp32["top1"]) <= 1 / fp32["num_images"]


@pytest.mark.parametrize("tta", [False, True])
def test_onnxruntime_scores_like_torch_flipped_pass_included(data, tta, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    torch_res, ort_res = (evaluate(_model(), data, batch_size=4, tta=tta, engine=e) for e in ("torch", "onnxruntime"))
    assert ort_res["fast_path"] == "fp32, onnxruntime (fp32: onnxruntime runs fp32; onnxruntime: asked for)"
    assert ort_res["top1"] == torch_res["top1"] and ort_res["confusion"] == torch_res["confusion"]
    assert ort_res["loss"] == pytest.approx(torch_res["loss"], abs=1e-4)
    if not tta:  # the command line says it too
        ckpt = vitkit.save(_model(), data.parent / "ckpt")
        assert main(["eval", str(ckpt), "--data", str(data), "--engine", "onnxruntime"]) == 0
        assert capsys.readouterr().out.splitlines()[1] == f"ran {ort_res['fast_path']}"
