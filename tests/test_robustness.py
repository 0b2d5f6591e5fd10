"""Bad input end to end: a corpus of broken and unusual images, datasets and checkpoints, generated in a
temporary folder, run through `vitkit predict`, `vitkit eval`, `vitkit train --data`, `vitkit convert`,
`vitkit finetune`, `vitkit train --resume` (in-process, through ``vitkit.cli.main``) and the Python API.

For every input: the exit code, exactly one ``vitkit: error: ...`` (or ``vitkit: warning: skipped ...``)
line naming the file, field or argument at fault, no traceback, and the good files beside the bad ones
still processed. Every case is a test id of its own, so ``pytest -v`` shows the count of inputs tried.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import pickle
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import Payload, idx_bytes, image_folder, noise_image, png_header_only, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import vitkit
from vitkit.cli.main import main
from vitkit.core.errors import CheckpointError, ConfigError, DataError

pytestmark = pytest.mark.usefixtures("one_thread")


# =============================================================================================== helpers
def cli(capsys, *argv):
    """Run ``vitkit ARGV`` in-process: (exit code, stdout, stderr lines). A usage error's SystemExit too."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err.splitlines()


def assert_clean(err_lines, *, prefix="vitkit: error: ", names=None):
    """Exactly one line, starting with ``prefix``, naming ``names`` (a regex), no traceback."""
    text = "\n".join(err_lines)
    assert "Traceback" not in text and 'File "' not in text, text
    assert len(err_lines) == 1, text
    assert err_lines[0].startswith(prefix), text
    if names is not None:
        assert re.search(names, err_lines[0]), (names, text)
    return err_lines[0]


def _encoded(im, fmt, **kw):
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


# ======================================================================================= the image corpus
# name -> (writer, expected): expected None = decodes (to C x H x W where given), else a regex of the error
# that follows "<path>: ". Names are file names under the corpus folder (bytes for undecodable names).
def _w_bytes(data):
    return lambda p: p.write_bytes(data)


def _w_img(im, **kw):
    return lambda p: im.save(p, **kw)


def _w_exif_rotated(p):
    a = np.zeros((8, 16), np.uint8)
    a[:, :8] = 255  # left half white; orientation 6 puts it on top
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(a, "L").convert("RGB").save(p, exif=exif.tobytes(), quality=95)


def _w_palette_transparent(p):
    im = Image.new("P", (6, 4), 0)
    im.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    im.putpixel((0, 0), 1)
    im.save(p, transparency=0)


def _w_anim(p):
    frames = [Image.new("RGB", (6, 6), (255, 0, 0)), Image.new("RGB", (6, 6), (0, 0, 255))]
    frames[0].save(p, save_all=True, append_images=frames[1:], duration=40)


def _w_dir(p):
    p.mkdir()


def _w_dangling(p):
    os.symlink(p.parent / "nowhere.png", p)


GOOD_IMAGES = {
    "deep16.png": (_w_img(Image.fromarray(np.arange(0, 65536, 257, dtype=np.uint16).reshape(16, 16))), (3, 16, 16)),
    "cmyk.jpg": (_w_img(Image.new("CMYK", (10, 7), (0, 255, 255, 0)), quality=95), (3, 7, 10)),
    "rgba.png": (_w_img(Image.fromarray(np.dstack([np.asarray(noise_image(9, 11)), np.full((9, 11), 100, np.uint8)]))),
                 (3, 9, 11)),
    "palette_transparent.png": (_w_palette_transparent, (3, 4, 6)),
    "exif_rotated.jpg": (_w_exif_rotated, (3, 16, 8)),
    "one_pixel.png": (_w_img(Image.new("RGB", (1, 1), (9, 9, 9))), (3, 1, 1)),
    "animated.gif": (_w_anim, (3, 6, 6)),
    b"caf\xe9.png": (_w_img(noise_image(12, 12, 3)), (3, 12, 12)),
    "plain.png": (_w_img(noise_image(40, 30, 4)), (3, 40, 30)),
}
BAD_IMAGES = {
    "zero.jpg": (_w_bytes(b""), r"empty file \(0 bytes\)"),
    "truncated.jpg": (_w_bytes(_encoded(noise_image(64, 64, 5), "JPEG")[:600]), r"truncated or corrupt image data"),
    "truncated.png": (_w_bytes(_encoded(noise_image(64, 64, 6), "PNG")[:900]), r"truncated or corrupt image data"),
    "page.jpg": (_w_bytes(b"<!DOCTYPE html><html><body>404</body></html>"), r"an HTML page, not an image"),
    "notes.jpg": (_w_bytes(b"just some text\n"), r"a text file, not an image"),
    "folder.png": (_w_dir, r"is a directory, not an image file"),
    "dangling.png": (_w_dangling, r"broken symbolic link"),
    "bomb.png": (lambda p: png_header_only(p, 20000, 20000),
                 r"400000000 pixels exceeds max_pixels=89478485 \(possible decompression bomb"),
    b"bad\xff.jpg": (_w_bytes(b"not an image either"), r"a text file, not an image"),
}
CORPUS = {**GOOD_IMAGES, **BAD_IMAGES}


def _ids(d):
    return [os.fsdecode(k).encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace") for k in d]


def corpus_path(root: Path, name) -> str:
    """The path of corpus entry ``name`` under ``root`` as a str (undecodable bytes: surrogate escapes)."""
    return os.fsdecode(os.fsencode(str(root)) + b"/" + (name if isinstance(name, bytes) else name.encode()))


def shown(path: str) -> str:
    """A path as vitkit shows it in messages (\\xNN for undecodable bytes)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def write_corpus(root: Path, entries=CORPUS) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, (writer, _) in entries.items():
        p = corpus_path(root, name)
        writer(Path(p))
        out[name] = p
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return write_corpus(root)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny two-class RGB checkpoint (32 x 32), labels 'a' and 'b'."""
    return str(vitkit.save(tiny_model(num_classes=2, labels=["a", "b"]), tmp_path_factory.mktemp("ckpt") / "ckpt"))


# ------------------------------------------------------------------------------------ images: Python API
@pytest.mark.parametrize("name", list(CORPUS), ids=_ids(CORPUS))
def test_api_decode_image(corpus, name):
    from vitkit.data import decode_image

    path = corpus[name]
    _, expected = CORPUS[name]
    if isinstance(expected, tuple):
        x = decode_image(path, 3)
        assert x.dtype == torch.uint8 and tuple(x.shape) == expected
        if name == "exif_rotated.jpg":  # the rotation is used: the white half is on top
            assert x[:, :8].float().mean() > 200 and x[:, 8:].float().mean() < 50
        if name == "animated.gif":
            assert x[:, 0, 0].tolist() == [255, 0, 0]  # the first frame
        if name == "palette_transparent.png":
            assert x[:, 1, 1].tolist() == [255, 255, 255] and x[:, 0, 0].tolist() == [0, 0, 255]
    else:
        with pytest.raises(DataError) as e:
            decode_image(path, 3)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(shown(path) + ": "), msg
        assert re.search(expected, msg), msg
        msg.encode("utf-8")  # printable


def test_api_bomb_passes_when_the_user_raises_the_limit(corpus):
    from vitkit.data import decode_image

    with pytest.raises(DataError) as e:  # the header is let through; the (missing) pixel data then fails
        decode_image(corpus["bomb.png"], 1, max_pixels=None)
    assert "decompression bomb" not in str(e.value) and "bomb.png: " in str(e.value)


# ------------------------------------------------------------------------------------------ images: predict
@pytest.mark.parametrize("name", list(CORPUS), ids=_ids(CORPUS))
def test_predict_each_file(corpus, ckpt, capsys, name):
    path = corpus[name]
    _, expected = CORPUS[name]
    rc, out, err = cli(capsys, "predict", ckpt, path, "--json", "--top-k", "2")
    if isinstance(expected, tuple):
        assert rc == 0 and err == [], err
        res = json.loads(out.splitlines()[-1])
        assert res["num_images"] == 1 and res["errors"] == [] and len(res["predictions"][0]["top"]) == 2
        return
    if name == "folder.png":  # a folder given on the command line is searched: it holds no images
        expected = r"folder has no image files"
    line = assert_clean(err, names=re.escape(shown(path)) + ": " + expected)
    assert rc == 1 and json.loads(out.splitlines()[-1])["num_images"] == 0, line
    rc, out, err = cli(capsys, "predict", ckpt, path, "--strict")
    assert rc == 1 and out == ""
    assert_clean(err, names=re.escape(shown(path)) + ": " + expected)


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_predict_whole_corpus_folder_skips_bad_keeps_good(corpus, ckpt, capsys, fmt):
    root = str(Path(corpus["plain.png"]).parent)
    rc, out, err = cli(capsys, "predict", ckpt, root, *({"table": [], "json": ["--json"], "csv": ["--csv"]}[fmt]))
    assert rc == 0, err
    assert "Traceback" not in "\n".join(err)
    # every bad file (the folder named .png excepted: it is a folder, searched and empty) is one warning line
    bad = [n for n in BAD_IMAGES if n != "folder.png"]
    assert len(err) == len(bad), err
    for n in bad:
        assert sum(line.startswith("vitkit: warning: skipped " + shown(corpus[n]) + ": ") for line in err) == 1, n
    if fmt == "json":
        res = json.loads(out.splitlines()[-1])  # strict JSON: undecodable bytes in names shown as \xNN
        assert sorted(p["path"] for p in res["predictions"]) == sorted(shown(corpus[n]) for n in GOOD_IMAGES)
    else:
        for n in GOOD_IMAGES:
            assert shown(corpus[n]) in out or corpus[n] in out, n
        if fmt == "table":
            assert out.splitlines()[-1] == f"{len(GOOD_IMAGES)} image(s) classified, {len(bad)} skipped (see above)"
    rc, out, err = cli(capsys, "predict", ckpt, root, "--strict")
    assert rc == 1
    assert_clean(err)


def test_predict_api_collects_errors_and_predictions(corpus, ckpt):
    from vitkit.tools.predict import predict

    res = predict(ckpt, list(corpus.values()), top_k=1, num_workers=2)
    assert sorted(p["path"] for p in res["predictions"]) == sorted(corpus[n] for n in GOOD_IMAGES)
    assert len(res["errors"]) == len(BAD_IMAGES)
    for e in res["errors"]:
        assert "\n" not in e["error"] and e["error"].startswith(shown(e["path"]) + ": ")
    with pytest.raises(DataError, match=re.escape(shown(corpus["zero.jpg"])) + r": empty file"):
        predict(ckpt, [corpus["plain.png"], corpus["zero.jpg"]], strict=True)


# ------------------------------------------------------------------------ images in datasets: eval, train
def make_dataset(root: Path, corpus_entries=CORPUS, n_good=4, size=32) -> dict:
    """train/{a,b} and test/{a,b} with ``n_good`` plain images each, the corpus added to train/a and test/b."""
    for part in ("train", "test"):
        for c, cls in enumerate("ab"):
            d = root / part / cls
            d.mkdir(parents=True)
            for i in range(n_good):
                noise_image(size, size, seed=100 * c + 10 * (part == "test") + i).save(d / f"g{i}.png")
    return {"train": write_corpus(root / "train" / "a", corpus_entries),
            "test": write_corpus(root / "test" / "b", corpus_entries)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    return root, make_dataset(root)


N_BAD_IN_SCAN = len(BAD_IMAGES) - 1  # the folder named .png is a folder: searched, holds nothing


def test_api_open_dataset_skips_and_lists_every_bad_file(dataset):
    from vitkit.data import open_dataset

    root, files = dataset
    for in_memory in (True, False):
        sp = open_dataset(str(root), channels=3, img_size=(32, 32), in_memory=in_memory)
        assert len(sp.test) == 4 * 2 + len(GOOD_IMAGES), in_memory
        skipped = {p for p, _ in sp.skipped}
        bad_test = {shown(files["test"][n]) for n in BAD_IMAGES if n != "folder.png"}
        bad_train = {shown(files["train"][n]) for n in BAD_IMAGES if n != "folder.png"}
        # everything unreadable at scan time is listed; with in_memory=False only headers are read, so
        # the files whose header is fine (truncated data) must still be caught before they are used
        assert {shown(p) for p in skipped} >= (bad_test | bad_train) - _truncated(files), in_memory
        for _, why in sp.skipped:
            assert "\n" not in why
        if not in_memory:
            for i in range(len(sp.test)):  # every listed image decodes
                sp.test.get(i)
    with pytest.raises(DataError) as e:
        open_dataset(str(root), channels=3, img_size=(32, 32), strict=True)
    assert "\n" not in str(e.value) and any(str(e.value).startswith(shown(p) + ": ")
                                            for f in files.values() for p in f.values())


def _truncated(files):
    return {shown(f[n]) for f in files.values() for n in ("truncated.jpg", "truncated.png")}


def test_eval_skips_bad_files_and_reports_them(dataset, ckpt, capsys):
    root, _ = dataset
    rc, out, err = cli(capsys, "eval", ckpt, "--data", root, "--json")
    assert rc == 0, err
    res = json.loads(out.splitlines()[-1])
    assert res["split"] == "test" and res["num_images"] == 4 * 2 + len(GOOD_IMAGES)
    assert res["skipped_files"] == 2 * N_BAD_IN_SCAN  # the train part is scanned too


def test_eval_names_each_skipped_file(dataset, ckpt, capsys):
    root, files = dataset
    rc, out, err = cli(capsys, "eval", ckpt, "--data", root)
    assert rc == 0
    for n in BAD_IMAGES:
        if n != "folder.png":
            assert any(shown(files["test"][n]) in line for line in err), n
    rc, out, err = cli(capsys, "eval", ckpt, "--data", root, "--strict")
    assert rc == 1
    assert_clean(err)


def test_train_data_skips_bad_files_or_strict_stops(dataset, tmp_path, capsys):
    root, files = dataset
    fast = ["--model", "vit_test", "--batch-size", "4", "--epochs", "1", "--threads", "1", "--device", "cpu",
            "--precision", "fp32", "--set", "plots=false", "--set", "data.img_size=32"]
    rc, out, err = cli(capsys, "train", "--data", root, "--out", tmp_path / "r1", "--json", *fast)
    assert rc == 0, err
    assert "Traceback" not in "\n".join(err)
    s = json.loads(out.splitlines()[-1])
    assert s["status"] == "completed"
    note = [line for line in out.splitlines() if line.startswith("skipped ")]
    assert len(note) == 1 and note[0].startswith(f"skipped {2 * N_BAD_IN_SCAN} unreadable file(s), e.g. "), out
    rc, out, err = cli(capsys, "train", "--data", root, "--out", tmp_path / "r2", *fast, "--set", "data.strict=true")
    assert rc == 1
    line = assert_clean(err)
    assert any(shown(p) + ": " in line for f in files.values() for p in f.values()), line


def test_symlink_cycles_are_searched_once(ckpt, tmp_path, capsys):
    """Two links back up the tree: each file is listed once, and the scan ends (it used to grow as 2^depth)."""
    from vitkit.data import list_images

    d = tmp_path / "cyclic"
    for c in ("a", "b"):
        (d / c).mkdir(parents=True)
        for i in range(2):
            noise_image(8, 8, i).save(d / c / f"{i}.png")
        os.symlink("..", d / c / "up")
    assert sorted(p.relative_to(d).as_posix() for p in list_images([str(d)])) == ["a/0.png", "a/1.png", "b/0.png",
                                                                                  "b/1.png"]
    rc, out, err = cli(capsys, "predict", ckpt, d, "--json")
    assert rc == 0 and err == [] and json.loads(out.splitlines()[-1])["num_images"] == 4


def test_recursive_glob_through_a_symlink_cycle_lists_each_file_once(tmp_path):
    from vitkit.data import list_images

    d = tmp_path / "cyclic"
    (d / "a").mkdir(parents=True)
    noise_image(8, 8).save(d / "a" / "0.png")
    os.symlink("..", d / "a" / "up")
    (d / "a" / "b").mkdir()
    os.symlink("../..", d / "a" / "b" / "up2")  # two cycles: a plain glob.glob expansion never ends
    assert [p.name for p in list_images([str(d / "**" / "*.png")])] == ["0.png"]


# ================================================================================ the dataset corpus
def _mnist(root: Path, imgs=None, labels=None, img_bytes=None, lab_bytes=None):
    root.mkdir(parents=True)
    imgs = np.zeros((20, 28, 28), np.uint8) if imgs is None else imgs
    labels = (np.arange(20) % 10).astype(np.uint8) if labels is None else labels
    (root / "train-images-idx3-ubyte").write_bytes(img_bytes if img_bytes is not None else idx_bytes(imgs))
    (root / "train-labels-idx1-ubyte").write_bytes(lab_bytes if lab_bytes is not None else idx_bytes(labels))


def _cifar(root: Path, data=None, labels=None):
    root.mkdir(parents=True)
    data = np.zeros((10, 3072), np.uint8) if data is None else data
    labels = list(range(10)) if labels is None else labels
    for i in range(1, 6):
        with open(root / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"data": data, b"labels": labels}, f)
    with open(root / "test_batch", "wb") as f:
        pickle.dump({b"data": data, b"labels": labels}, f)


def _ds_missing(root):
    return root / "nothere", r"no such folder"


def _ds_empty(root):
    (root / "empty").mkdir()
    return root / "empty", r"empty folder"


def _ds_class_no_images(root):
    d = root / "noimg"
    for c in ("a", "b"):
        (d / c).mkdir(parents=True)
    noise_image(8, 8).save(d / "a" / "x.png")
    (d / "b" / "readme.txt").write_text("nothing here")
    return d, re.escape(str(d / "b")) + r": class folder has no images"


def _ds_top_level_files(root):
    d = root / "flat"
    d.mkdir()
    for i in range(3):
        noise_image(8, 8, i).save(d / f"{i}.png")
    return d, r"image\(s\) at the top level but no class folders"


def _ds_mnist_magic(root):
    d = root / "mnist_magic"
    _mnist(d, img_bytes=idx_bytes(np.zeros((20, 28, 28)), magic=0x0801))
    return d, re.escape(str(d / "train-images-idx3-ubyte")) + r": bad magic number"


def _ds_mnist_size(root):
    d = root / "mnist_size"
    _mnist(d, img_bytes=idx_bytes(np.zeros((20, 28, 28)))[:-100])
    return d, re.escape(str(d / "train-images-idx3-ubyte")) + r": wrong size"


def _ds_mnist_gz_cut(root):
    d = root / "mnist_gz"
    d.mkdir()
    (d / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros((20, 28, 28))))[:-30])
    (d / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes((np.arange(20) % 10).astype(np.uint8))))
    return d, re.escape(str(d / "train-images-idx3-ubyte.gz")) + r": "


def _ds_mnist_label_range(root):
    d = root / "mnist_labels"
    _mnist(d, labels=np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 42] * 2, np.uint8))
    return d, re.escape(str(d / "train-labels-idx1-ubyte")) + r": label 42 at index 9 is out of range"


def _ds_cifar_size(root):
    d = root / "cifar_size"
    _cifar(d, data=np.zeros((10, 3000), np.uint8))
    return d, re.escape(str(d / "data_batch_1")) + r": wrong size"


def _ds_cifar_label_range(root):
    d = root / "cifar_labels"
    _cifar(d, labels=[0, 1, 2, 3, 4, 5, 6, 7, 8, 10])
    return d, re.escape(str(d / "data_batch_1")) + r": label 10 at index 9 is out of range"


def _ds_cifar_not_pickle(root):
    d = root / "cifar_garbage"
    _cifar(d)
    (d / "data_batch_1").write_bytes(b"\x80\x04garbage" * 10)
    return d, re.escape(str(d / "data_batch_1")) + r": "


DATASETS = {f.__name__[4:]: f for f in (_ds_missing, _ds_empty, _ds_class_no_images, _ds_top_level_files,
                                          _ds_mnist_magic, _ds_mnist_size, _ds_mnist_gz_cut, _ds_mnist_label_range,
                                          _ds_cifar_size, _ds_cifar_label_range, _ds_cifar_not_pickle)}


@pytest.mark.parametrize("case", list(DATASETS))
@pytest.mark.parametrize("via", ["api", "eval", "train"])
def test_bad_dataset(case, via, tmp_path, ckpt, capsys):
    path, expected = DATASETS[case](tmp_path)
    if via == "api":
        from vitkit.data import open_dataset

        with pytest.raises(DataError) as e:
            open_dataset(str(path))
        msg = str(e.value)
        assert "\n" not in msg and re.search(expected, msg), msg
        assert str(path) in msg, msg
        return
    if via == "eval":
        rc, out, err = cli(capsys, "eval", ckpt, "--data", path)
    else:
        rc, out, err = cli(capsys, "train", "--data", path, "--out", tmp_path / "run", "--model", "vit_test",
                           "--threads", "1", "--epochs", "1", "--batch-size", "4", "--quiet", "--device", "cpu")
    assert rc == 1
    line = assert_clean(err, names=expected)
    assert str(path) in line
    assert not (tmp_path / "run" / "last").exists()


@pytest.mark.parametrize("via", ["api", "eval", "train"])
def test_files_at_the_top_of_a_class_tree_are_listed_and_ignored(via, tmp_path, ckpt, capsys):
    d = tmp_path / "tree"
    for c in ("a", "b"):
        (d / c).mkdir(parents=True)
        for i in range(4):
            noise_image(32, 32, seed=10 * (c == "b") + i).save(d / c / f"{i}.png")
    noise_image(32, 32).save(d / "stray.png")
    (d / "notes.txt").write_text("x")
    why = "file at the top level of a class-folder tree, not in a class folder; ignored"
    if via == "api":
        from vitkit.data import open_dataset

        sp = open_dataset(str(d), val_fraction=0.25)
        assert sp.classes == ["a", "b"] and len(sp.train) + len(sp.val) == 8
        assert sorted(sp.skipped) == [(str(d / "notes.txt"), why), (str(d / "stray.png"), why)]
        return
    if via == "eval":
        rc, out, err = cli(capsys, "eval", ckpt, "--data", d, "--json")
        assert rc == 0 and err == [f"vitkit: warning: skipped {d / n}: {why}" for n in ("notes.txt", "stray.png")], err
        assert json.loads(out.splitlines()[-1])["skipped_files"] == 2
    else:
        rc, out, err = cli(capsys, "train", "--data", d, "--out", tmp_path / "run", "--model", "vit_test", "--epochs",
                           "1", *[a for a in FAST_TRAIN if a != "--quiet"])
        assert rc == 0 and "Traceback" not in "\n".join(err), err
        assert f"skipped 2 unreadable file(s), e.g. {d / 'notes.txt'}: {why}" in out, out


# ============================================================================= the checkpoint corpus
def _edit_config(d: Path, fn, name: str = "vitkit.json"):
    """Edit a checkpoint's vitkit.json (or, with ``name="config.json"``, a run's config)."""
    cfg = json.loads((d / name).read_text())
    fn(cfg)
    (d / name).write_text(json.dumps(cfg))


def _ck_missing_config(d):
    (d / "vitkit.json").unlink()
    return r"vitkit\.json: missing"


def _ck_unknown_field(d):
    _edit_config(d, lambda c: c["model"].update(bogus_field=1))
    return r"vitkit\.json: .*unknown field\(s\) 'bogus_field'"


def _ck_ill_typed_field(d):
    _edit_config(d, lambda c: c["model"].update(depth="two"))
    return r"vitkit\.json: .*depth.*'two'"


def _ck_ill_typed_preprocess(d):
    _edit_config(d, lambda c: c["preprocess"].update(mean="grey"))
    return r"vitkit\.json: .*mean"


def _ck_not_json(d):
    (d / "vitkit.json").write_text('{"model": {')
    return r"vitkit\.json: not valid JSON"


def _ck_truncated_weights(d):
    w = d / "vitkit.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    return r"vitkit\.safetensors: not a readable safetensors file"


def _ck_corrupt_weights(d):
    w = d / "vitkit.safetensors"
    raw = bytearray(w.read_bytes())
    raw[8:40] = b"\xff" * 32  # garbage in the JSON header
    w.write_bytes(bytes(raw))
    return r"vitkit\.safetensors: not a readable safetensors file"


def _ck_empty_weights(d):
    (d / "vitkit.safetensors").write_bytes(b"")
    return r"vitkit\.safetensors: not a readable safetensors file"


def _ck_weights_do_not_fit(d):
    from safetensors.torch import load_file, save_file

    state = load_file(d / "vitkit.safetensors")
    state["head.weight"] = torch.zeros(5, state["head.weight"].shape[1])  # mis-shaped
    state["extra.weight"] = torch.zeros(1)  # unexpected
    del state["norm.bias"]  # missing
    save_file(state, d / "vitkit.safetensors")
    return (r"vitkit\.safetensors: weights do not fit the config; missing: norm\.bias; unexpected: extra\.weight; "
            r"mis-shaped: head\.weight \(5, 32\) != \(2, 32\)")


CHECKPOINTS = {f.__name__[4:]: f for f in (_ck_missing_config, _ck_unknown_field, _ck_ill_typed_field,
                                            _ck_ill_typed_preprocess, _ck_not_json, _ck_truncated_weights,
                                            _ck_corrupt_weights, _ck_empty_weights, _ck_weights_do_not_fit)}


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("small"), ("a", "b"), n=4, test=4)


FAST_TRAIN = ["--threads", "1", "--quiet", "--device", "cpu", "--precision", "fp32", "--batch-size", "4",
              "--set", "plots=false"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, small_data):
    """A finished one-epoch run (its last/ is a resumable checkpoint)."""
    out = tmp_path_factory.mktemp("run") / "run"
    import contextlib

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--data", str(small_data), "--out", str(out), "--model", "vit_test", "--epochs", "1",
                     *FAST_TRAIN]) == 0
    return out


@pytest.mark.parametrize("case", list(CHECKPOINTS))
@pytest.mark.parametrize("via", ["load", "predict", "eval", "convert", "finetune", "resume"])
def test_bad_checkpoint(case, via, ckpt, run_dir, small_data, tmp_path, capsys):
    if via == "resume":
        run = tmp_path / "run"
        shutil.copytree(run_dir, run)
        d = run / "last"
    else:
        d = tmp_path / "ckpt"
        shutil.copytree(ckpt, d)
    expected = CHECKPOINTS[case](d)
    if via == "load":
        with pytest.raises(CheckpointError) as e:
            vitkit.load(d)
        msg = str(e.value)
        assert "\n" not in msg and re.search(expected, msg) and str(d) in msg, msg
        return
    argv = {
        "predict": ["predict", d, small_data / "test" / "a" / "0.png"],
        "eval": ["eval", d, "--data", small_data],
        "convert": ["convert", d, tmp_path / "out.safetensors", "--to", "timm"],
        "finetune": ["finetune", d, "--data", small_data, "--out", tmp_path / "ft", "--epochs", "1", *FAST_TRAIN],
        "resume": ["train", "--resume", d.parent, "--epochs", "2", *FAST_TRAIN],
    }[via]
    rc, out, err = cli(capsys, *argv)
    assert rc == 1, (out, err)
    if via == "resume" and case == "missing_config":
        # without vitkit.json last/ is not a checkpoint: nothing to resume, named by its run directory
        assert_clean(err, names=re.escape(str(d.parent)) + r": nothing to resume")
        return
    if via == "resume":  # the training loop names the checkpoint folder (last/) rather than the file in it
        expected = expected.replace(r"vitkit\.safetensors: ", r"(vitkit\.safetensors)?: ")
    assert_clean(err, names=expected)
    assert str(d) in err[0]
    assert not (tmp_path / "out.safetensors").exists() and not (tmp_path / "ft" / "last").exists()


# the parts of a run directory only --resume reads: the trainer state and the run's own config.json
def _rd_trainer_truncated(run):
    f = run / "last" / "trainer.pt"
    f.write_bytes(f.read_bytes()[:100])
    return re.escape(str(f)) + r": not a readable trainer state"


def _rd_trainer_garbage(run):
    (run / "last" / "trainer.pt").write_bytes(b"garbage")
    return re.escape(str(run / "last" / "trainer.pt")) + r": not a readable trainer state"


def _rd_trainer_missing(run):
    (run / "last" / "trainer.pt").unlink()
    return re.escape(str(run)) + r": nothing to resume"


def _rd_run_config_unknown(run):
    _edit_config(run, lambda c: c.update(bogus=1), "config.json")
    return re.escape(str(run / "config.json")) + r": config: unknown field\(s\) 'bogus'"


def _rd_run_config_ill_typed(run):
    _edit_config(run, lambda c: c["optim"].update(lr="fast"), "config.json")
    return re.escape(str(run / "config.json")) + r": .*optim\.lr.*'fast'"


def _rd_run_config_not_object(run):
    (run / "config.json").write_text("[1, 2]")
    return re.escape(str(run / "config.json")) + r": expected a JSON object"


def _rd_run_config_missing(run):
    (run / "config.json").unlink()
    return r"--resume .*: no config\.json there"


RUN_DIRS = {f.__name__[4:]: f for f in (_rd_trainer_truncated, _rd_trainer_garbage, _rd_trainer_missing,
                                         _rd_run_config_unknown, _rd_run_config_ill_typed, _rd_run_config_not_object,
                                         _rd_run_config_missing)}


@pytest.mark.parametrize("case", list(RUN_DIRS))
def test_bad_run_directory_resume(case, run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    expected = RUN_DIRS[case](run)
    before = (run / "last" / "vitkit.safetensors").read_bytes()
    rc, out, err = cli(capsys, "train", "--resume", run, "--epochs", "2", *FAST_TRAIN)
    assert rc == 1, (out, err)
    assert_clean(err, names=expected)
    assert (run / "last" / "vitkit.safetensors").read_bytes() == before  # the checkpoint is left as it was


# ----------------------------------------------------------------------------- pickles that would run code
def _evil_pickle(path: Path, marker: Path, style: str):
    obj = {"state_dict": {"head.weight": Payload(marker)}}
    if style == "torch-zip":
        torch.save(obj, path)
    else:
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)


@pytest.mark.parametrize("style", ["torch-zip", "plain-pickle"])
@pytest.mark.parametrize("via", ["load_state_dict_file", "load", "convert", "predict", "finetune", "resume"])
def test_code_in_a_pickle_never_runs(style, via, run_dir, small_data, tmp_path, capsys):
    marker = tmp_path / "PWNED"
    if via == "resume":
        run = tmp_path / "run"
        shutil.copytree(run_dir, run)
        evil = run / "last" / "trainer.pt"
    else:
        evil = tmp_path / "weights.pth"
    _evil_pickle(evil, marker, style)
    assert not marker.exists()
    if via in ("load_state_dict_file", "load"):
        from vitkit.io.checkpoint import load_state_dict_file

        with pytest.raises(CheckpointError) as e:
            (load_state_dict_file if via == "load_state_dict_file" else vitkit.load)(evil)
        assert str(evil) in str(e.value) and "\n" not in str(e.value)
    else:
        argv = {
            "convert": ["convert", evil, tmp_path / "out", "--from", "timm"],
            "predict": ["predict", evil, small_data / "test" / "a" / "0.png"],
            "finetune": ["finetune", evil, "--data", small_data, "--out", tmp_path / "ft", "--epochs", "1",
                         *FAST_TRAIN],
            "resume": ["train", "--resume", evil.parent.parent, "--epochs", "2", *FAST_TRAIN],
        }[via]
        rc, out, err = cli(capsys, *argv)
        assert rc == 1
        line = assert_clean(err)
        assert str(evil) in line, line
        if via in ("convert", "resume"):
            assert re.search(r"refused|not a readable", line), line
    assert not marker.exists(), "the pickle's code ran"


# ================================================================================== the command line
# (subcommand, an ill-typed argument, the message) for every subcommand with a typed option
ILL_TYPED = {
    "demo": (["-n", "many"], r"argument -n: invalid int value: 'many'"),
    "train": (["--epochs", "ten"], r"argument --epochs: invalid int value: 'ten'"),
    "finetune": (["ck", "--lr", "fast"], r"argument --lr: invalid float value: 'fast'"),
    "eval": (["ck", "--batch-size", "1.5"], r"argument --batch-size: invalid int value: '1.5'"),
    "predict": (["ck", "x.png", "--top-k", "all"], r"argument --top-k: invalid int value: 'all'"),
    "explain": (["ck", "x.png", "--out", "o.png", "--alpha", "half"], r"argument --alpha: invalid float value"),
    "export": (["ck", "--format", "onnx", "--out", "m.onnx", "--opset", "x"], r"argument --opset: invalid int"),
    "convert": (["a", "b", "--from", "timm", "--img-size", "big"], r"argument --img-size: expected N or HxW"),
    "bench": (["vit_test", "--repeats", "some"], r"argument --repeats: invalid int value: 'some'"),
    "list": (["a", "b"], r"unrecognized arguments: b"),
}
BAD_CHOICE = {
    "train": ["--device", "tpu"], "eval": ["ck", "--split", "dev"], "export": ["ck", "--format", "gif", "--out", "x"],
    "convert": ["a", "b", "--from", "keras"], "explain": ["ck", "x", "--out", "o", "--method", "magic"],
    "predict": ["ck", "x", "--json", "--csv"],
}
MISSING_VALUE = {"train": ["--epochs"], "finetune": ["ck", "--data"], "eval": ["ck", "--data"],
                 "predict": ["ck", "x", "--top-k"], "convert": ["a", "b", "--from"], "bench": ["m", "--dtype"],
                 "demo": ["--start"], "explain": ["ck", "x", "--out"], "export": ["ck", "--format"], "list": ["--json", "--nope"]}
MISSING_REQUIRED = {"finetune": [], "eval": [], "predict": ["ck"], "explain": ["ck", "x"], "export": ["ck", "--out", "x"],
                    "convert": ["a"], "bench": []}


def _usage_cases():
    from vitkit.cli.main import available_commands

    have = set(available_commands())
    cases = []
    for kind, table in (("ill-typed", ILL_TYPED), ("bad-choice", BAD_CHOICE), ("missing-value", MISSING_VALUE),
                        ("missing-required", MISSING_REQUIRED)):
        for cmd, argv in table.items():
            if cmd in have:
                cases.append(pytest.param(cmd, argv, id=f"{cmd}-{kind}"))
    for cmd in sorted(have):
        cases.append(pytest.param(cmd, ["--no-such-flag", "1"], id=f"{cmd}-unknown"))
    return cases


@pytest.mark.parametrize("cmd, argv", _usage_cases())
def test_usage_errors_exit_2_with_a_usage_line(cmd, argv, capsys):
    args = argv[0] if isinstance(argv, tuple) else argv
    rc, out, err = cli(capsys, cmd, *args)
    assert rc == 2, (rc, out, err)
    text = "\n".join(err)
    assert "Traceback" not in text
    assert err[0].startswith(f"usage: vitkit {cmd}"), text
    errors = [line for line in err if line.startswith(f"vitkit {cmd}: error: ")]
    assert len(errors) == 1 and err[-1] == errors[0], text
    if isinstance(argv, tuple):
        assert re.search(argv[1], errors[0]), errors[0]


def test_every_subcommand_has_usage_cases():
    from vitkit.cli.main import available_commands

    for cmd in available_commands():
        assert cmd in ILL_TYPED and cmd in MISSING_VALUE, cmd


# values that parse but are wrong: exit 1 and one line naming the argument or field (the TOML files are
# written by the test: {toml:NAME})
TOML_FILES = {
    "not_utf8": b"\xff\xfeepochs = 3\n",
    "bad_syntax": b"epochs = \n",
    "unknown_field": b"epochs = 2\n[optim]\nlrr = 0.1\n",
    "ill_typed": b"batch_size = \"many\"\n",
    "bad_value": b"[schedule]\nmin_lr_ratio = 2.0\n",
}
BAD_VALUES = {
    "train-threads": (["train", "--threads", "-1"], r"--threads: must be >= 1, got -1"),
    "train-epochs": (["train", "--epochs", "0"], r"epochs: must be a positive integer, got 0"),
    "train-lr": (["train", "--lr", "-1"], r"optim\.lr: must be > 0"),
    "train-max-minutes": (["train", "--max-minutes", "-1"], r"max_minutes: must be >= 0"),
    "train-ema": (["train", "--ema", "1.5"], r"ema: the decay must be in \(0, 1\)"),
    "train-set-unknown": (["train", "--set", "optim.momentun=0.5"], r"optim: unknown field\(s\) 'momentun'"),
    "train-set-not-key-value": (["train", "--set", "epochs"], r"epochs"),
    "train-resume-missing": (["train", "--resume", "{tmp}/nothere"], r"--resume .*nothere: no config\.json there"),
    "train-data-missing": (["train", "--data", "{tmp}/nodata"], r"nodata: no such folder"),
    "train-config-missing": (["train", "--config", "{tmp}/none.toml"], r"none\.toml: no such config file"),
    "train-config-directory": (["train", "--config", "{tmp}"], r": is a directory, expected a TOML file"),
    **{f"train-config-{k}": (["train", "--config", f"{{toml:{k}}}"], rf"{k}\.toml: ") for k in TOML_FILES},
    "finetune-img-size": (["finetune", "{ckpt}", "--data", "{data}", "--img-size", "0"], r"img_size: must be a positive"),
    "finetune-no-data": (["finetune", "{ckpt}"], r"--data: fine-tuning needs a dataset"),
    "predict-top-k": (["predict", "{ckpt}", "{data}", "--top-k", "0"], r"--top-k: must be >= 1, got 0"),
    "predict-batch-size": (["predict", "{ckpt}", "{data}", "--batch-size", "0"], r"--batch-size: must be >= 1"),
    "predict-device": (["predict", "{ckpt}", "{data}", "--device", "gpu0"], r"--device: 'gpu0' is not a device"),
    "predict-device-index": (["predict", "{ckpt}", "{data}", "--device", "cuda:99"], r"--device: 'cuda:99'"),
    "predict-no-match": (["predict", "{ckpt}", "{tmp}/*.jpeg"], r"\*\.jpeg: pattern matches no image files"),
    "eval-device": (["eval", "{ckpt}", "--data", "{data}", "--device", "bogus"], r"--device: 'bogus' is not a device"),
    "eval-batch-size": (["eval", "{ckpt}", "--data", "{data}", "--batch-size", "0"], r"--batch-size: must be >= 1"),
    "eval-missing-checkpoint": (["eval", "{tmp}/nockpt", "--data", "{data}"], r"nockpt: no such file or directory"),
    "convert-missing-source": (["convert", "{tmp}/none.pth", "{tmp}/out", "--from", "timm"], r"none\.pth: no such file"),
    "bench-device": (["bench", "vit_test", "--device", "bogus"], r"--device: 'bogus' is not a device"),
    "demo-start": (["demo", "--start", "5000"], r"--start 5000: the built-in test digits are numbered 0 to 1999"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_bad_values_are_one_line_errors(case, ckpt, small_data, tmp_path, capsys):
    argv, expected = BAD_VALUES[case]
    for k, data in TOML_FILES.items():
        (tmp_path / f"{k}.toml").write_bytes(data)
    subst = {"{tmp}": str(tmp_path), "{ckpt}": ckpt, "{data}": str(small_data)}
    subst.update({f"{{toml:{k}}}": str(tmp_path / f"{k}.toml") for k in TOML_FILES})
    argv = [subst.get(a, a.replace("{tmp}", str(tmp_path))) for a in argv]
    if argv[0] in ("train", "finetune"):
        argv += ["--out", str(tmp_path / "run")] + (["--threads", "1"] if "--threads" not in argv else [])
        if argv[0] == "train" and "--data" not in argv and "--resume" not in argv:  # backstop: never a demo run
            argv += ["--data", str(tmp_path / "no-such-data")]
    if case == "predict-device-index" and torch.cuda.is_available() and torch.cuda.device_count() > 99:
        pytest.skip("this machine has 100 GPUs")
    rc, out, err = cli(capsys, *argv)
    assert rc == 1, (rc, out, err)
    # predict: an input that gives no image, when nothing else is left to classify, is the error
    assert_clean(err, names=expected)
    assert not (tmp_path / "run" / "last").exists()


# outputs that cannot be written: a regular file where a folder must be created
OUTPUTS = {
    "train-out": ["train", "--data", "{data}", "--out", "{file}/run", "--model", "vit_test", "--epochs", "1", *FAST_TRAIN],
    "finetune-out": ["finetune", "{ckpt}", "--data", "{data}", "--out", "{file}/ft", *FAST_TRAIN],
    "eval-out": ["eval", "{ckpt}", "--data", "{data}", "--out", "{file}/eval"],
    "convert-vitkit": ["convert", "{timm}", "{file}/ckpt", "--from", "timm", "--set", "num_heads=2"],
    "convert-timm": ["convert", "{ckpt}", "{file}/w.safetensors", "--to", "timm"],
    "convert-hf": ["convert", "{ckpt}", "{file}/hf", "--to", "hf"],
    "explain-out": ["explain", "{ckpt}", "{image}", "--out", "{file}/x.png"],
    "export-out": ["export", "{ckpt}", "--format", "torchscript", "--out", "{file}/m.pt", "--no-check"],
}


@pytest.mark.parametrize("case", list(OUTPUTS))
def test_unwritable_output_is_one_line(case, ckpt, small_data, tmp_path, capsys):
    from safetensors.torch import save_file

    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    save_file(vitkit.load(ckpt).state_dict(), str(tmp_path / "timm.safetensors"))
    subst = {"{data}": str(small_data), "{ckpt}": ckpt, "{image}": str(small_data / "test" / "a" / "0.png"),
             "{timm}": str(tmp_path / "timm.safetensors")}
    argv = [subst.get(a, a.replace("{file}", str(blocker))) for a in OUTPUTS[case]]
    if case == "explain-out":
        pytest.importorskip("matplotlib")
    if case == "export-out":
        pytest.importorskip("torch.jit")
    rc, out, err = cli(capsys, *argv)
    assert rc == 1, (out, err)
    assert_clean(err, names=re.escape(str(blocker)) + r"(/\w+)?: cannot create the folder \(a file is in the way\)")
    assert blocker.read_text() == "in the way"


# -------------------------------------------------------------------------- fuzz: run config and TOML
def _runconfig_fields():
    from vitkit.train.config import RunConfig

    top = [f.name for f in dataclasses.fields(RunConfig)]
    nested = {}
    for f in dataclasses.fields(RunConfig):
        v = getattr(RunConfig(), f.name)
        if dataclasses.is_dataclass(v):
            nested[f.name] = [g.name for g in dataclasses.fields(v)] + ["bogus"]
    return top + ["bogus"], nested


_TOP, _NESTED = _runconfig_fields()
_scalar = (st.none() | st.booleans() | st.integers(-3, 10**20) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=6) | st.sampled_from(["cosine", "sgd", "adamw", "cpu", "auto", "fp32", "vit_test"]))
_value = st.recursive(_scalar, lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=4), ch, max_size=2),
                      max_leaves=5)


@st.composite
def _run_dicts(draw):
    d = {}
    for k in draw(st.lists(st.sampled_from(_TOP), max_size=5, unique=True)):
        if k in _NESTED and draw(st.booleans()):
            d[k] = draw(st.dictionaries(st.sampled_from(_NESTED[k]), _value, max_size=3))
        else:
            d[k] = draw(_value)
    return d


@settings(max_examples=120, deadline=None)
@given(_run_dicts())
def test_fuzz_run_config_loader(data):
    from vitkit.train.config import RunConfig

    try:
        cfg = RunConfig.from_dict(data)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e)
    else:
        assert RunConfig.from_dict(cfg.to_dict()) == cfg


_keys = st.sampled_from(_TOP + [f"{k}.{f}" for k, fs in _NESTED.items() for f in fs] + ["model_args.depth", "a..b", ""])
_override = st.one_of(st.builds(lambda k, v: f"{k}={v}", _keys, st.text(max_size=8) | st.sampled_from(
    ["1", "-1", "0", "nan", "inf", "true", "null", "[1,2]", "{", "1e999", "0.5", "[0.1, 2]"])), st.text(max_size=10))


@settings(max_examples=120, deadline=None)
@given(st.lists(_override, max_size=4))
def test_fuzz_run_config_overrides(overrides):
    from vitkit.train.config import resolve_config

    try:
        resolve_config(None, {}, overrides)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e)


def _toml_value(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v) if -(2**63) <= v < 2**63 else None
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        items = [_toml_value(x) for x in v]
        return "[" + ", ".join(i for i in items if i is not None) + "]"
    if isinstance(v, dict):
        items = [(json.dumps(k), _toml_value(x)) for k, x in v.items()]
        return "{" + ", ".join(f"{k} = {x}" for k, x in items if x is not None) + "}"
    return None


def _toml(d: dict) -> str:
    lines, tables = [], []
    for k, v in d.items():
        if isinstance(v, dict) and k in _NESTED:
            tables.append((k, v))
            continue
        t = _toml_value(v)
        if t is not None:
            lines.append(f"{json.dumps(k)} = {t}")
    for k, v in tables:
        lines.append(f"[{k}]")
        for kk, vv in v.items():
            t = _toml_value(vv)
            if t is not None:
                lines.append(f"{json.dumps(kk)} = {t}")
    return "\n".join(lines) + "\n"


_toml_text = st.one_of(_run_dicts().map(_toml), st.text(max_size=40), st.binary(max_size=40),
                       st.sampled_from(["[data\npath = 1", "epochs = ", "= 3", "[optim]\n[optim]\n", "\x00", "a.b.c = 1",
                                        b"\xff\xfeepochs = 1\n", b"epochs = 1 # caf\xe9\n"]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_toml_text)
def test_fuzz_train_config_file(text):
    """`vitkit train --config FILE` with random TOML: a one-line error naming the file, or a config that
    reaches the training loop (stubbed here)."""
    import contextlib

    import vitkit.train.launch as launch
    import vitkit.train.build as build
    import vitkit.train.loop as loop

    calls = []
    real = loop.train, build.preflight, launch.launch
    loop.train = lambda cfg, run_dir, **kw: calls.append(cfg) or {"status": "interrupted", "step": 0}
    build.preflight = lambda *a, **kw: None
    launch.launch = lambda argv, n, *rest: calls.append(n) or 130  # processes = N: the launch, stubbed as well
    err = io.StringIO()
    try:
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "run.toml"
            f.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape"))
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    rc = main(["train", "--config", str(f), "--threads", "1", "--out", str(Path(d) / "run"), "--quiet"])
                except SystemExit as e:
                    rc = e.code
    finally:
        loop.train, build.preflight, launch.launch = real
        torch.set_num_threads(1)
    lines = err.getvalue().splitlines()
    if calls:
        assert rc == 130 and all(line.startswith("vitkit: stopped at step 0; continue with") for line in lines), lines
    else:
        assert rc == 1, (rc, lines)
        assert len(lines) == 1 and lines[0].startswith("vitkit: error: ") and str(f) in lines[0], lines


@pytest.mark.parametrize("command", ["predict", "explain", "eval"])
def test_max_pixels_flag_raises_or_lifts_the_bomb_limit(command, tmp_path, ckpt, capsys):
    """The decompression-bomb limit is the user's to set: a low limit refuses, 0 lifts it."""
    d = tmp_path / "imgs"
    for c in ("a", "b"):
        (d / c).mkdir(parents=True)
        for i in range(2):
            noise_image(48, 48, seed=i).save(d / c / f"{i}.png")
    target = {"predict": [d / "a" / "0.png"], "explain": [d / "a" / "0.png", "--out", tmp_path / "x.png"],
              "eval": ["--data", d, "--split", "train"]}[command]
    rc, out, err = cli(capsys, command, ckpt, *target, "--max-pixels", "1000")
    if command == "eval":  # every image skipped, each named, then a one-line error
        assert_clean(err, names=r"none of the 4 image\(s\) could be .*decompression bomb")
    elif command == "predict":
        assert rc == 1
        assert_clean(err, names=r"0\.png: .*decompression bomb")
    else:
        assert_clean(err, names="decompression bomb")
    rc, out, err = cli(capsys, command, ckpt, *target, "--max-pixels", "0")
    assert rc == 0 and err == [], err
    rc, out, err = cli(capsys, command, ckpt, *target, "--max-pixels", "lots")
    assert rc == 2 and "argument --max-pixels: expected a whole number of pixels, got 'lots'" in err[-1]


@pytest.mark.parametrize("text, error", [
    ('"img_size" = 1\n', "ViTConfig.img_size: 1x1 is not divisible by patch_size 4"),
    ('[model_args]\n"depth" = 0\n', "ViTConfig.depth: must be a positive integer, got 0"),
    ('"model" = "vit_tiny_patch4_32"\n"img_size" = 30\n', "ViTConfig.img_size: 30x30 is not divisible by patch_size 4"),
])
def test_a_config_files_model_that_cannot_be_built_names_the_file(text, error, tmp_path, capsys):
    """A model the config file describes (its img_size, model_args or model) that cannot be built: one line
    naming the file, then what is wrong; the same given by a flag names the flag's value alone."""
    f = tmp_path / "run.toml"
    f.write_text(text)
    assert main(["train", "--config", str(f), "--threads", "1", "--out", str(tmp_path / "run"), "--quiet"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"vitkit: error: {f}: {error}"]
    assert not (tmp_path / "run").exists()
    f.write_text('"img_size" = 32\n')
    assert main(["train", "--config", str(f), "--img-size", "30", "--threads", "1", "--out", str(tmp_path / "run"),
                 "--quiet"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "vitkit: error: ViTConfig.img_size: 30x30 is not divisible by patch_size 4"]


def test_a_config_files_missing_weights_name_the_file_and_key(tmp_path, capsys):
    """init_from set by a TOML config to weights that are not there: one line naming the config file, the key
    and the path (a flag's weights name themselves)."""
    f = tmp_path / "run.toml"
    f.write_text('"init_from" = "0"\n')
    assert main(["train", "--config", str(f), "--threads", "1", "--out", str(tmp_path / "run"), "--quiet"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"vitkit: error: {f}: init_from: 0: no such file or directory"]
    assert not (tmp_path / "run").exists()


def test_a_whole_number_too_large_for_a_float_is_one_error_line():
    """10**400 in a number field (JSON and TOML carry such integers) is the field's one-line error, not an
    OverflowError from converting it."""
    from vitkit.core.strict import real_in

    with pytest.raises(ConfigError, match=r"^crop_pct: expected a finite number in \(0, 1\], got "):
        real_in(10**400, "crop_pct", 0, 1, open_lo=True)


@pytest.mark.parametrize("flag", ["--epochs", "--batch-size", "--eval-every"])
def test_a_whole_number_beyond_64_bits_on_the_command_line_is_one_error_line(flag, tmp_path, capsys):
    """``--epochs 10**400`` reached the schedule as a Python int and overflowed a float there (a traceback);
    ``--batch-size`` likewise reached torch. Whole-number fields hold 64 bits, as torch does; the line names
    the field and shortens the number."""
    rc, _, err = cli(capsys, "train", "--data", image_folder(tmp_path / "d", n=4), "--out", tmp_path / "r",
                     flag, 10**400, "--threads", "1", "--quiet")
    line = assert_clean(err, names=rf"config\.{flag[2:].replace('-', '_')}: expected an integer of 64 bits, got 1000")
    assert rc == 1 and len(line) < 200 and not (tmp_path / "r").exists()


def test_a_batch_larger_than_the_data_measures_no_speed_and_is_refused(tmp_path, capsys):
    """The recipe measures each candidate's speed on one batch held in memory: ``--batch-size 100000`` on a
    folder of 3000 photos was killed for memory there (24 GB). Such a batch measures nothing; the loader's one
    line refuses it."""
    data = image_folder(tmp_path / "d", n=4)
    rc, out, err = cli(capsys, "train", "--data", data, "--out", tmp_path / "r", "--batch-size", 4096,
                       "--max-minutes", 60, "--threads", "1", "--nproc", "1")
    assert rc == 1 and "measured on" not in out
    assert_clean(err, names=r"^vitkit: error: training set: \d images is fewer than one batch of 4096; "
                            r"lower --batch-size$")


def _number_fields(obj, prefix: str = ""):
    """The dotted keys of ``obj``'s (a config dataclass's) fields that hold numbers, sections walked."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _number_fields(value, f"{prefix}{f.name}.")
        elif (isinstance(value, (int, float)) and not isinstance(value, bool)) or {"int", "float"} & set(
                str(f.type).replace("|", " ").replace("[", " ").replace("]", " ").replace(",", " ").split()):
            yield prefix + f.name


def test_every_number_field_of_a_run_takes_a_number_beyond_any_float_with_one_short_line(tmp_path, capsys):
    """``--set KEY=±10**400`` on every number field of RunConfig and its sections: one error line, naming the
    field, of under 300 characters (the number shortened), never an OverflowError or a run."""
    from vitkit.train.config import RunConfig

    data = image_folder(tmp_path / "d", n=4)
    keys = list(_number_fields(RunConfig()))
    assert {"epochs", "batch_size", "optim.lr", "augment.rrc_scale", "data.workers"} <= set(keys), keys
    for key in keys:
        for value in (10**400, -10**400):
            rc, _, err = cli(capsys, "train", "--data", data, "--out", tmp_path / "r", "--set", f"{key}={value}",
                             "--threads", "1", "--quiet", "--max-minutes", "0.05")
            line = assert_clean(err, names=re.escape(key.split(".")[-1]))
            assert rc == 1 and len(line) < 300 and not (tmp_path / "r").exists(), (key, line)
