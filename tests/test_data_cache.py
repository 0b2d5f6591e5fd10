"""The decoded-image cache: a second opening of the same files reads them back without decoding; any
change to the files or the decode settings is a miss; a damaged entry is decoded and written again; the
cache never goes inside the data folder, which may be read-only; runs record the time loading took."""

import json
import os
import stat

import pytest
import torch
from helpers import FAST_TRAIN_ARGS, image_folder, noise_image, tiny_run_config

import vitkit.data.folders as folders
import vitkit.data.sets as sets
from vitkit.cli.main import main
from vitkit.core.errors import DataError
from vitkit.core.progress import Progress
from vitkit.data import open_dataset


def _folder(root, n=5):
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(n):
            noise_image(20 + 4 * (i % 3), 24, seed=10 * (c == "b") + i).save(root / c / f"{i}.png")
    return root


def _open(root, cache, **kw):
    return open_dataset(root, val_fraction=0, cache_dir=cache, **{"short_side": 20, **kw})


def _no_decoding(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("decoded although the cache holds the images")

    for module in (folders, sets):  # decoding a folder, and a streamed image
        monkeypatch.setattr(module, "decode_array", refuse)


def _same(a, b):
    ia, ib = a.train.get_batch(torch.arange(len(a.train)))[0], b.train.get_batch(torch.arange(len(b.train)))[0]
    return torch.equal(a.train.labels, b.train.labels) and all(torch.equal(x, y) for x, y in zip(ia, ib))


def test_second_open_reads_the_cache(tmp_path, monkeypatch):
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    first = _open(root, cache)
    assert first.cache == "miss" and len(list((cache / "decoded").glob("*.npz"))) == 1
    _no_decoding(monkeypatch)
    again = _open(root, cache)
    assert again.cache == "hit" and _same(first, again)
    assert again.train.ragged is not None  # images of different sizes, as decoded


@pytest.mark.parametrize("change", ["touch", "add", "remove", "short_side", "channels", "img_size"])
def test_any_change_is_a_miss(tmp_path, change):
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    _open(root, cache)
    kw = {}
    if change == "touch":
        st = os.stat(root / "a" / "0.png")
        os.utime(root / "a" / "0.png", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    elif change == "add":
        noise_image(24, 24, seed=99).save(root / "b" / "new.png")
    elif change == "remove":
        (root / "a" / "4.png").unlink()
    elif change == "short_side":
        kw = {"short_side": 22}
    elif change == "channels":
        kw = {"channels": 1}
    else:
        kw = {"short_side": None, "img_size": 16}
    d = _open(root, cache, **kw)
    assert d.cache == "miss"
    assert _same(d, open_dataset(root, val_fraction=0, **{"short_side": 20, **kw}))  # what decoding gives
    assert len(list((cache / "decoded").glob("*.npz"))) == (2 if change in ("short_side", "channels", "img_size") else 1)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_damaged_entry_is_decoded_and_written_again(tmp_path, monkeypatch, damage):
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    first = _open(root, cache)
    (entry,) = (cache / "decoded").glob("*.npz")
    raw = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":  # a pixel changed: the checksum tells
        i = raw.index(b"pixels.npy") + 200
        entry.write_bytes(raw[:i] + bytes([raw[i] ^ 0xFF]) + raw[i + 1:])
    else:
        entry.write_bytes(b"not an archive")
    again = _open(root, cache)
    assert again.cache == "miss" and _same(first, again)
    _no_decoding(monkeypatch)
    assert _open(root, cache).cache == "hit"


def test_cache_never_inside_the_data_folder(tmp_path):
    root = _folder(tmp_path / "data")
    for inside in (root, root / "a" / "cache", tmp_path / "data" / ".." / "data" / "x"):
        with pytest.raises(DataError, match=r"^cache_dir: .* is inside the data folder") as e:
            _open(root, inside)
        assert "\n" not in str(e.value)
    assert sorted(p.name for p in root.rglob("*")) == sorted(p.name for p in _folder(tmp_path / "again").rglob("*"))


def test_read_only_data_folder_and_unwritable_cache(tmp_path):
    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    modes = {p: p.stat().st_mode for p in [root, *root.rglob("*")]}
    try:
        for p in modes:
            p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
        assert _open(root, cache).cache == "miss" and _open(root, cache).cache == "hit"
    finally:
        for p, m in modes.items():
            p.chmod(m)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    # a cache that cannot be written is a note, never a failed opening
    blocked = tmp_path / "file"
    blocked.write_text("in the way")
    d = _open(root, blocked)
    assert d.cache == "miss, not cached" and d.cache_notes and "not cached" in d.cache_notes[0]


def test_train_reports_loading_and_the_cache(tmp_path, capsys):
    data = image_folder(tmp_path / "data")
    cache = tmp_path / "cache"
    args = ["train", "--data", str(data), "--epochs", "1", "--json", *[a for a in FAST_TRAIN_ARGS if a != "--quiet"]]
    runs, said = [], []
    for i, extra in enumerate([["--cache-dir", str(cache)], ["--cache-dir", str(cache)], ["--no-cache"],
                               ["--cache-dir", "none"]]):
        assert main([*args, "--out", str(tmp_path / f"run{i}"), *extra]) == 0
        out = capsys.readouterr().out.strip().splitlines()
        runs.append(json.loads(out[-1]))
        said.append([line for line in out if line.startswith("data loaded in ")])
    assert [r["data_cache"] for r in runs] == ["miss", "hit", "off", "off"]
    assert f"(decoded, cached in {cache}): split-folder: 2 classes, 3x32x32, train 24, test 8" in said[0][0]
    assert f"(from the cache in {cache})" in said[1][0]
    assert said[2:] == [[], []]  # no cache, and quick: no line
    assert all(r["data_seconds"] >= 0 for r in runs)
    final = [json.loads(x) for x in (tmp_path / "run1" / "metrics.jsonl").read_text().splitlines()][-1]
    assert final["type"] == "final" and final["data_cache"] == "hit" and "data_seconds" in final


def test_train_caches_under_xdg_cache_home_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    data = image_folder(tmp_path / "data")
    assert main(["train", "--data", str(data), "--epochs", "1", "--out", str(tmp_path / "run"), *FAST_TRAIN_ARGS]) == 0
    assert list((tmp_path / "xdg" / "vitkit" / "decoded").glob("*.npz"))


class _Tasks(Progress):
    """Records the tasks an opening starts."""

    def __init__(self):
        super().__init__()
        self.names = []

    def begin(self, task):
        self.names.append(task.what.split(" " + os.sep)[0])


def _open_after(barrier, root, cache, out):
    tasks = _Tasks()
    barrier.wait()
    out.put((_open(root, cache, progress=tasks).cache, tasks.names))


@pytest.mark.skipif(os.name != "posix", reason="the decode lock is an flock")
def test_processes_opening_one_folder_at_once_decode_it_once(tmp_path, monkeypatch):
    import multiprocessing as mp
    import time

    root, cache = _folder(tmp_path / "data"), tmp_path / "cache"
    pmap = folders._pmap
    monkeypatch.setattr(folders, "_pmap", lambda *a: time.sleep(1.0) or pmap(*a))  # a decoding long enough to overlap
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_open_after, args=(barrier, root, cache, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    # one decoded and stored; the other waited on its lock, saying so, and read the entry (without the lock,
    # both decoded)
    assert got == [("miss", ["decoding"]), ("shared", ["waiting while another process decodes"])]
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(list((cache / "decoded").glob("*.npz"))) == 1
    _no_decoding(monkeypatch)
    assert _open(root, cache).cache == "hit"


def _rank(tmp_path, monkeypatch, rank, first_sends):
    """Rank ``rank`` of 2 on one machine opening ``image_folder`` data through ``loop.open_shared``, the other
    rank played by ``first_sends()``: what it sends at the all-gather (and does before it)."""
    import vitkit.train.loop as loop
    from vitkit.train.build import model_config
    from vitkit.train.distributed import DistInfo

    data = tmp_path / "data" if (tmp_path / "data").exists() else image_folder(tmp_path / "data", n=6, test=2)
    cfg = tiny_run_config(data={"path": str(data), "val_fraction": 0.0})
    mcfg = model_config(cfg)
    sent = []
    monkeypatch.setattr(loop, "all_gather_object", lambda obj, dist: sent.append(obj) or [first_sends(), obj])
    return lambda: loop.open_shared(cfg, mcfg, lambda m: None, Progress(), tmp_path / "cache",
                                    DistInfo(rank, 2, rank)), (cfg, mcfg), sent


def test_the_processes_of_a_run_leave_a_miss_to_the_first_and_then_read_what_it_stored(tmp_path, monkeypatch):
    from vitkit.train.build import open_data

    decoded = []
    pmap = folders._pmap
    monkeypatch.setattr(folders, "_pmap", lambda *a: decoded.append(a[0]) or pmap(*a))
    state = {}

    def rank_zero():  # rank 0 decodes and stores before it sends that it is done
        assert decoded == []  # rank 1 decoded nothing while it waited
        state["zero"] = open_data(*state["cfgs"], lambda m: None, cache_dir=tmp_path / "cache")
        decoded.clear()

    opening, state["cfgs"], sent = _rank(tmp_path, monkeypatch, 1, rank_zero)
    splits = opening()
    assert sent == [None] and decoded == [] and splits.cache == "hit" and state["zero"].cache == "miss"
    assert _same(splits, state["zero"])
    # a filled cache: every process reads it at once, and meets the others once
    again, _, sent = _rank(tmp_path, monkeypatch, 1, lambda: None)
    assert again().cache == "hit" and sent == [None] and decoded == []


def test_the_first_process_of_a_run_opens_the_data_itself_decoding_what_the_cache_lacks(tmp_path, monkeypatch):
    decoded = []
    pmap = folders._pmap
    monkeypatch.setattr(folders, "_pmap", lambda *a: decoded.append(a[0]) or pmap(*a))
    from vitkit.data.cache import DecodeCache

    keyed = []
    key = DecodeCache.key
    monkeypatch.setattr(DecodeCache, "key", lambda self, *a, **k: keyed.append(a[0]) or key(self, *a, **k))
    opening, _, sent = _rank(tmp_path, monkeypatch, 0, lambda: None)
    splits = opening()
    # train/ and test/, each keyed (its files stat-ed) and decoded once
    assert splits.cache == "miss" and decoded == ["decode", "decode"] and len(keyed) == 2 and sent == [None]


def test_a_failure_of_the_first_process_to_open_the_data_is_an_error_on_the_others(tmp_path, monkeypatch):
    said = "data/train/cat/0.png: not an image (cannot identify image file)"
    opening, _, sent = _rank(tmp_path, monkeypatch, 1, lambda: said)
    with pytest.raises(DataError, match=r"^data/train/cat/0\.png: not an image \(cannot identify image file\)$"):
        opening()
    assert sent == [None]
