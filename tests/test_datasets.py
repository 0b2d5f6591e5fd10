"""open_dataset on every layout (synthetic data in tmp_path; one test reads the shipped demo set)."""

import gzip
import os
import pickle
import struct

import numpy as np
import pytest
import torch
from helpers import idx_bytes
from PIL import Image

from vitkit.core.errors import DataError
from vitkit.data import open_dataset
from vitkit.data.cifar import safe_unpickle
from vitkit.data.datasets import DEMO_DIR, ImageSet


def _img(path, value, size=(8, 8), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    color = (value, 255 - value, 7) if mode == "RGB" else value
    Image.new(mode, (size[1], size[0]), color).save(path)
    return path


def _tree(root, counts, size=(8, 8), ext="png"):
    """Class folders with images whose red value encodes (class, index)."""
    for c, (name, n) in enumerate(counts.items()):
        for i in range(n):
            _img(root / name / f"{i:03d}.{ext}", 40 * c + i, size)
    return root


# ------------------------------------------------------------------------------------------------
# class folders
def test_class_folder_tree_stratified_split(tmp_path):
    root = _tree(tmp_path / "ds", {"zebra": 4, "ant": 8, "mole": 4})
    d = open_dataset(root, val_fraction=0.25, seed=3)
    assert d.format == "folder" and d.classes == ["ant", "mole", "zebra"]  # sorted folder names
    assert d.train.in_memory and d.train.images.shape == (12, 3, 8, 8) and d.train.images.dtype == torch.uint8
    assert d.val.class_counts() == [2, 1, 1] and d.train.class_counts() == [6, 3, 3]
    assert d.test is None and d.skipped == []
    # labels follow the folders: the red value of class c's images is 40*c' where c' is its position in `counts`
    red_to_class = {0: "zebra", 1: "ant", 2: "mole"}
    for part in (d.train, d.val):
        for i in range(len(part)):
            x, y = part.get(i)
            assert part.classes[y] == red_to_class[int(x[0, 0, 0]) // 40]
    # same seed -> same split, another seed -> another split; train and val never overlap
    again = open_dataset(root, val_fraction=0.25, seed=3)
    assert torch.equal(again.val.images, d.val.images)
    other = open_dataset(root, val_fraction=0.25, seed=4)
    assert not torch.equal(other.val.images, d.val.images)
    reds_t = {int(v) for v in d.train.images[:, 0, 0, 0]}
    reds_v = {int(v) for v in d.val.images[:, 0, 0, 0]}
    assert not reds_t & reds_v and len(reds_t | reds_v) == 16
    nov = open_dataset(root, val_fraction=0)
    assert nov.val is None and len(nov.train) == 16
    g1 = open_dataset(root, channels=1, val_fraction=0)
    assert g1.train.images.shape == (16, 1, 8, 8) and g1.channels == 1


def test_split_folder_train_val_test(tmp_path):
    _tree(tmp_path / "ds" / "train", {"a": 3, "b": 3})
    _tree(tmp_path / "ds" / "val", {"a": 1, "b": 2})
    _tree(tmp_path / "ds" / "test", {"b": 2})
    d = open_dataset(tmp_path / "ds")
    assert d.format == "split-folder" and d.classes == ["a", "b"]
    assert (len(d.train), len(d.val), len(d.test)) == (6, 3, 2)
    assert d.test.labels.tolist() == [1, 1]  # 'b' keeps the training label even without an 'a' folder
    # train + test only: val is split off train
    _tree(tmp_path / "ds2" / "train", {"a": 4, "b": 4})
    _tree(tmp_path / "ds2" / "test", {"a": 1, "b": 1})
    d2 = open_dataset(tmp_path / "ds2", val_fraction=0.25)
    assert (len(d2.train), len(d2.val), len(d2.test)) == (6, 2, 2)
    # a class that is called "train" is just a class
    vehicles = _tree(tmp_path / "vehicles", {"bus": 2, "train": 2})
    assert open_dataset(vehicles, val_fraction=0).format == "folder"
    _tree(tmp_path / "ds3" / "train", {"a": 2})
    _tree(tmp_path / "ds3" / "val", {"cat": 1})
    with pytest.raises(DataError, match=r"ds3/val/cat: class 'cat' is not among the training classes$"):
        open_dataset(tmp_path / "ds3")


def test_sizes_native_or_img_size_and_streaming(tmp_path):
    root = tmp_path / "ds"
    _img(root / "a" / "0.png", 10, (8, 8))
    _img(root / "a" / "1.png", 20, (6, 12))
    _img(root / "b" / "0.png", 30, (8, 8))
    with pytest.raises(DataError, match=r"ds: images have different sizes \(.*a/0\.png is 8x8, .*a/1\.png is 6x12\); "
                                         r"pass img_size to resize them$"):
        open_dataset(root, val_fraction=0)
    d = open_dataset(root, img_size=(4, 4), val_fraction=0)
    assert d.train.images.shape == (3, 3, 4, 4) and d.size == (4, 4)
    assert (d.train.images[1, 0].int() - 20).abs().max() <= 1  # a constant image stays constant
    # streamed: paths kept, decoded on demand at `size`, the same pixels as in memory
    s = open_dataset(root, img_size=(4, 4), val_fraction=0, in_memory=False)
    assert s.train.images is None and len(s.train.paths) == 3 and s.train.size == (4, 4)
    x, y = s.train.get(1)
    assert torch.equal(x, d.train.images[1]) and y == 0
    xb, yb = s.train.get_batch(torch.tensor([2, 0]))
    assert torch.equal(xb, d.train.images[[2, 0]]) and yb.tolist() == [1, 0]
    loader = torch.utils.data.DataLoader(s.train.as_dataset(), batch_size=2)
    xs, ys = next(iter(loader))
    assert xs.shape == (2, 3, 4, 4) and ys.tolist() == [0, 0]
    with pytest.raises(DataError, match=r"ds: images have different sizes"):
        open_dataset(root, val_fraction=0, in_memory=False)


def test_bad_files_skipped_or_strict(tmp_path):
    root = _tree(tmp_path / "ds", {"a": 3, "b": 3})
    (root / "a" / "broken.jpg").write_bytes(b"")
    (root / "b" / "page.png").write_text("<html>oops</html>")
    (root / "b" / "dir.png").mkdir()  # a folder named like an image: nothing to read inside, ignored
    (root / "notes.txt").write_text("hi")
    os.symlink(root / "missing.png", root / "a" / "dangling.png")
    d = open_dataset(root, val_fraction=0)
    assert len(d.train) == 6
    reasons = {os.path.basename(p): why for p, why in d.skipped}
    assert reasons == {
        "notes.txt": "file at the top level of a class-folder tree, not in a class folder; ignored",
        "broken.jpg": "empty file (0 bytes)",
        "dangling.png": f"broken symbolic link (points to {root / 'missing.png'})",
        "page.png": "an HTML page, not an image",
    }
    with pytest.raises(DataError, match=r"ds/a/broken\.jpg: empty file \(0 bytes\)$"):
        open_dataset(root, strict=True)


def test_non_utf8_names_in_a_class_folder(tmp_path):
    root = _tree(tmp_path / "ds", {"a": 2})
    cls = os.fsencode(str(root)) + b"/b\xff"
    os.mkdir(cls)
    Image.new("RGB", (8, 8), (1, 2, 3)).save(os.fsdecode(cls + b"/good\xe9.png"))
    Image.new("RGB", (8, 8), (1, 2, 3)).save(os.fsdecode(cls + b"/also.png"))
    with open(cls + b"/bad\xe9.png", "wb") as f:
        f.write(b"")
    d = open_dataset(root, val_fraction=0)
    assert d.classes == ["a", os.fsdecode(b"b\xff")] and d.train.class_counts() == [2, 2]
    assert [(os.path.basename(p), why) for p, why in d.skipped] == [("bad\\xe9.png", "empty file (0 bytes)")]
    with pytest.raises(DataError, match=r"ds/b\\xff/bad\\xe9\.png: empty file \(0 bytes\)$") as e:
        open_dataset(root, strict=True)
    str(e.value).encode("utf-8")


def test_many_files_decoded_by_worker_processes(tmp_path):
    root = tmp_path / "ds"
    a = np.arange(1040, dtype=np.int64)
    for i in a:
        _img(root / f"c{i % 2}" / f"{i:04d}.png", int(i % 251), (2, 2), mode="L")
    (root / "c1" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    d = open_dataset(root, channels=1, val_fraction=0, num_workers=2)
    assert len(d.train) == 1040 and d.train.images.shape == (1040, 1, 2, 2)
    # images come back in file order: class c0 holds the even file numbers
    assert d.train.images[:520, 0, 0, 0].tolist() == [int(i % 251) for i in a[::2]]
    assert [(os.path.basename(p), w.split(" (")[0]) for p, w in d.skipped] == [("bad.png", "truncated or corrupt image data")]
    with pytest.raises(DataError, match=r"ds/c1/bad\.png: truncated or corrupt image data"):
        open_dataset(root, channels=1, val_fraction=0, num_workers=2, strict=True)


def test_folder_errors(tmp_path):
    with pytest.raises(DataError, match=r"nowhere: no such folder$"):
        open_dataset(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: empty folder \(no class folders, IDX or CIFAR files\)$"):
        open_dataset(tmp_path / "empty")
    _img(tmp_path / "flat" / "x.png", 1)
    with pytest.raises(DataError, match=r"flat: 1 image\(s\) at the top level but no class folders"):
        open_dataset(tmp_path / "flat")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "readme.md").write_text("x")
    with pytest.raises(DataError, match=r"odd: cannot tell the dataset format"):
        open_dataset(tmp_path / "odd")
    root = _tree(tmp_path / "ds", {"a": 2})
    (root / "b").mkdir()
    (root / "b" / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"ds/b: class folder has no images"):
        open_dataset(root)
    root = _tree(tmp_path / "few", {"a": 3, "b": 1})
    with pytest.raises(DataError, match=r"few: class 'b' has 1 image; a validation split needs at least 2 per class"):
        open_dataset(root)
    assert len(open_dataset(root, val_fraction=0).train) == 4
    bad = _tree(tmp_path / "allbad", {"a": 0}) / "a"
    bad.mkdir(parents=True)
    (bad / "x.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"allbad: none of the 1 image\(s\) could be read \(first: .*x\.png: empty file"):
        open_dataset(tmp_path / "allbad", val_fraction=0)
    f = tmp_path / "file.png"
    f.write_bytes(b"x")
    with pytest.raises(DataError, match=r"file\.png: is a file; expected a dataset folder$"):
        open_dataset(f)
    with pytest.raises(DataError, match=r"fmt: unknown dataset format 'imagenet'"):
        open_dataset(root, fmt="imagenet")
    with pytest.raises(DataError, match=r"val_fraction: must be in \[0, 1\), got 1.5"):
        open_dataset(root, val_fraction=1.5)
    with pytest.raises(DataError, match=r"channels: must be 1 \(grey\) or 3 \(RGB\), got 2"):
        open_dataset(root, channels=2)


# ------------------------------------------------------------------------------------------------
# MNIST IDX
def _idx(path, arr, magic=None, gz=True, extra=b""):
    data = idx_bytes(arr, magic) + extra
    path.write_bytes(gzip.compress(data) if gz else data)


def _mnist(root, n_train=6, n_test=4, gz=True):
    root.mkdir(parents=True, exist_ok=True)
    sfx = ".gz" if gz else ""
    _idx(root / f"train-images-idx3-ubyte{sfx}", np.arange(n_train * 4 * 4).reshape(n_train, 4, 4) % 256, gz=gz)
    _idx(root / f"train-labels-idx1-ubyte{sfx}", np.arange(n_train) % 3, gz=gz)
    _idx(root / f"t10k-images-idx3-ubyte{sfx}", np.full((n_test, 4, 4), 9), gz=gz)
    _idx(root / f"t10k-labels-idx1-ubyte{sfx}", np.arange(n_test) % 10, gz=gz)
    return root


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx(tmp_path, gz):
    root = _mnist(tmp_path / "m", gz=gz)
    d = open_dataset(root, val_fraction=0)
    assert d.format == "mnist" and d.classes == [str(i) for i in range(10)]
    assert d.train.images.shape == (6, 1, 4, 4) and d.test.images.shape == (4, 1, 4, 4)
    assert d.train.images[1, 0].flatten().tolist() == list(range(16, 32))
    assert d.train.labels.tolist() == [0, 1, 2, 0, 1, 2] and d.test.labels.tolist() == [0, 1, 2, 3]
    d3 = open_dataset(root, channels=3, img_size=(8, 8), val_fraction=0)
    assert d3.train.images.shape == (6, 3, 8, 8) and int(d3.test.images.min()) == int(d3.test.images.max()) == 9


def test_mnist_bad_files(tmp_path):
    root = _mnist(tmp_path / "m")
    _idx(root / "train-images-idx3-ubyte.gz", np.zeros((6, 4, 4)), magic=0x0000_0802)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz: bad magic number 0x00000802 \(expected 0x00000803"):
        open_dataset(root)
    _idx(root / "train-images-idx3-ubyte.gz", np.zeros((6, 4, 4)), extra=b"xx")
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz: wrong size: header says 6x4x4 = 96 bytes of data, "
                                         r"file has 98$"):
        open_dataset(root)
    forged = struct.pack(">IIII", 0x803, 2**32 - 1, 2**32 - 1, 2**32 - 1) + bytes(16)
    (root / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(forged))
    with pytest.raises(DataError, match=r"wrong size: header says 4294967295x4294967295x4294967295 = "
                                         r"79228162458924105385300197375 bytes of data, file has 16$"):
        open_dataset(root)
    _idx(root / "train-images-idx3-ubyte.gz", np.zeros((5, 4, 4)))
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz: 6 labels for 5 images"):
        open_dataset(root)
    _idx(root / "train-images-idx3-ubyte.gz", np.zeros((6, 4, 4)))
    _idx(root / "train-labels-idx1-ubyte.gz", [0, 1, 12, 0, 1, 2])
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz: label 12 at index 2 is out of range 0\.\.9$"):
        open_dataset(root)
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    _idx(root / "train-labels-idx1-ubyte.gz", [0, 1, 2, 0, 1, 2])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz: no matching test labels file"):
        open_dataset(root)
    (root / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b\x08 not really gzip")
    _idx(root / "t10k-labels-idx1-ubyte.gz", [0])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz: cannot read \("):
        open_dataset(root)


def test_demo_set_is_real_mnist():
    assert (DEMO_DIR / "ATTRIBUTION").is_file()
    assert "CC BY-SA 3.0" in (DEMO_DIR / "ATTRIBUTION").read_text()
    d = open_dataset(val_fraction=0.1, seed=0)
    assert d.format == "demo" and d.classes == [str(i) for i in range(10)]
    assert len(d.train) + len(d.val) == 8000 and len(d.test) == 2000
    assert len(d.val) == 800 and d.train.size == (28, 28) and d.channels == 1
    counts = torch.tensor(d.val.class_counts()) / torch.tensor(d.train.class_counts())
    assert float(counts.min()) > 0.09 and float(counts.max()) < 0.13  # stratified: ~10% of every class
    assert int(d.train.images.max()) == 255 and 0.1 < float(d.test.images.float().mean() / 255) < 0.2
    with pytest.raises(DataError, match=r"fmt='mnist' needs a dataset path"):
        open_dataset(fmt="mnist")


# ------------------------------------------------------------------------------------------------
# CIFAR python batches
def _cifar_batch(path, n, label_key="labels", labels=None, data=None, protocol=2):
    rng = np.random.default_rng(n)
    d = {
        b"batch_label" if protocol == 2 else "batch_label": b"x",
        "data": data if data is not None else rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        label_key: labels if labels is not None else [i % 10 for i in range(n)],
    }
    path.write_bytes(pickle.dumps(d, protocol=protocol))
    return d


def test_cifar10_batches(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    b1 = _cifar_batch(root / "data_batch_1", 20)
    _cifar_batch(root / "data_batch_2", 10, protocol=pickle.HIGHEST_PROTOCOL)
    _cifar_batch(root / "test_batch", 10)
    (root / "batches.meta").write_bytes(pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]}, protocol=2))
    d = open_dataset(tmp_path, val_fraction=0)  # found one level down
    assert d.format == "cifar10" and d.classes == [f"c{i}" for i in range(10)]
    assert d.train.images.shape == (30, 3, 32, 32) and len(d.test) == 10
    # rows are 1024 red, 1024 green, 1024 blue values, row-major
    assert torch.equal(d.train.images[3], torch.from_numpy(b1["data"][3].reshape(3, 32, 32)))
    assert d.train.labels[:12].tolist() == [i % 10 for i in range(12)]
    assert open_dataset(root, val_fraction=0.5).val is not None
    assert len(open_dataset(tmp_path, fmt="cifar10", val_fraction=0).train) == 30


def _py2_pickle(arr, labels) -> bytes:
    """The opcodes Python 2's cPickle (protocol 2) writes for {'data': uint8 array, 'labels': [...]}, as in
    the official CIFAR-10 python batches (str keys and array bytes are Python 2 byte strings)."""

    def s(b):
        return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<I", len(b)) + b)

    n = arr.shape[0]
    out = b"\x80\x02}q\x00(" + s(b"data")
    out += b"cnumpy.core.multiarray\n_reconstruct\nq\x01cnumpy\nndarray\nq\x02K\x00\x85" + s(b"b") + b"\x87Rq\x03("
    out += b"K\x01J" + struct.pack("<i", n) + b"M" + struct.pack("<H", 3072) + b"\x86"
    out += b"cnumpy\ndtype\nq\x04" + s(b"u1") + b"K\x00K\x01\x87Rq\x05(K\x03" + s(b"|")
    out += b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89" + s(arr.tobytes()) + b"tb"
    out += s(b"labels") + b"]q\x06(" + b"".join(b"K" + bytes([v]) for v in labels) + b"eu."
    return out


def test_cifar10_python2_pickle(tmp_path):
    arr = (np.arange(2 * 3072) % 251).astype(np.uint8).reshape(2, 3072)
    (tmp_path / "data_batch_1").write_bytes(_py2_pickle(arr, [3, 7]))
    d = open_dataset(tmp_path, val_fraction=0)
    assert d.train.labels.tolist() == [3, 7] and d.classes[3] == "cat"
    assert torch.equal(d.train.images.reshape(2, -1), torch.from_numpy(arr))


def test_cifar100_and_bad_cifar_files(tmp_path):
    root = tmp_path / "c100"
    root.mkdir()
    _cifar_batch(root / "train", 5, label_key="fine_labels", labels=[0, 99, 5, 5, 7])
    _cifar_batch(root / "test", 2, label_key="fine_labels", labels=[1, 2])
    d = open_dataset(root, val_fraction=0)
    assert d.format == "cifar100" and len(d.classes) == 100 and d.train.labels.tolist() == [0, 99, 5, 5, 7]

    bad = tmp_path / "c10"
    bad.mkdir()
    _cifar_batch(bad / "data_batch_1", 4, labels=[0, 1, 10, 2])
    with pytest.raises(DataError, match=r"data_batch_1: label 10 at index 2 is out of range 0\.\.9$"):
        open_dataset(bad)
    _cifar_batch(bad / "data_batch_1", 4, data=np.zeros((4, 3000), np.uint8))
    with pytest.raises(DataError, match=r"data_batch_1: wrong size: 'data' has shape \(4, 3000\), expected \(N, 3072\)"):
        open_dataset(bad)
    _cifar_batch(bad / "data_batch_1", 4, labels=[0, 1])
    with pytest.raises(DataError, match=r"data_batch_1: 2 labels for 4 images$"):
        open_dataset(bad)
    (bad / "data_batch_1").write_bytes(pickle.dumps({"data": np.zeros((1, 3072), np.uint8)})[:50])
    with pytest.raises(DataError, match=r"data_batch_1: not a readable CIFAR batch \("):
        open_dataset(bad)
    with pytest.raises(DataError, match=r"c10: no CIFAR-10 training batches"):
        (bad / "data_batch_1").unlink()
        (bad / "test_batch").write_bytes(b"")
        open_dataset(bad, fmt="cifar10")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_cifar_pickle_never_runs_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "c10"
    root.mkdir()
    (root / "data_batch_1").write_bytes(pickle.dumps({"data": _Evil(), "labels": [0]}, protocol=2))
    with pytest.raises(DataError, match=r"data_batch_1: not a plain-data pickle \(refusing global (posix|os)\.system\); "
                                         r"refusing to load it$"):
        open_dataset(root)
    assert not (tmp_path / "pwned").exists()
    (root / "x").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(DataError, match=r"x: expected a pickled dict, got list$"):
        safe_unpickle(root / "x")


def test_split_sizes_add_up():
    from vitkit.data.splits import split_stratified

    for counts, frac in (([5, 7, 3], 0.3), ([2, 2, 2], 0.1), ([100, 1000, 10], 0.05), ([800] * 10, 0.1)):
        labels = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
        s = ImageSet(labels, [str(c) for c in range(len(counts))], torch.zeros(len(labels), 1, 1, 1, dtype=torch.uint8),
                     None, (1, 1), 1)
        tr, va = split_stratified(s, frac, seed=0)
        assert len(tr) + len(va) == sum(counts)
        assert all(v >= 1 and t >= 1 for v, t in zip(va.class_counts(), tr.class_counts()))
        assert len(va) == max(len(counts), round(sum(counts) * frac))


def test_imageset_subset_and_repr():
    s = ImageSet(torch.tensor([0, 1, 1]), ["a", "b"], torch.arange(3, dtype=torch.uint8).view(3, 1, 1, 1), None, (1, 1), 1)
    t = s.subset([2, 0])
    assert t.labels.tolist() == [1, 0] and t.images.flatten().tolist() == [2, 0]
    assert repr(s) == "ImageSet(3 images, 2 classes, 1x1x1, in memory)"
    with pytest.raises(IndexError, match="ImageSet: index 3 out of range for 3 images"):
        s.get(3)
