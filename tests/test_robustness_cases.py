"""What a careless or hostile user finds, end to end: an --out folder of someone else's files, FIFOs in a data
folder, signals, configs that would build a model of terabytes or nest without end, decoded-image cache
entries that pass the checksum but not the shape, non-finite numbers in --json output, weights that are
not float (or float8, or a negative BatchNorm variance), a rank killed in a run of several processes,
preprocessing and model fields that are NaN, infinite, ill-typed or out of range, and every field of each
preprocessing source and of vitkit.json fuzzed.

Every case: one line (``vitkit: error: ...`` or a warning), no traceback, no hang (each that could hang
runs under a timeout), and no file of the user's lost.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FAST_TRAIN_ARGS, image_folder, tiny_model
from test_robustness import assert_clean as one_error
from test_robustness import cli

import vitkit
from vitkit.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return image_folder(tmp_path_factory.mktemp("data"), n=4, test=2)


def train(capsys, data, out, *extra):
    return cli(capsys, "train", "--data", data, "--epochs", "1", "--out", out, *FAST_TRAIN_ARGS, *extra)


# ============================================================= 1. --out at a folder of the user's files
USERS_FOLDERS = {
    "config-json": {"config.json": b"mine\n"},
    "config-json-and-last": {"config.json": b"mine\n", "last/notes.txt": b"keep\n"},
    "config-json-object": {"config.json": b'{"name": "my project"}\n'},
    "metrics": {"metrics.jsonl": b"my log\n"},
    "last-notes": {"last/notes.txt": b"keep\n"},
    "other-files": {"notes.txt": b"keep\n", "summary.json": b"{}\n"},
}


@pytest.mark.parametrize("name", sorted(USERS_FOLDERS))
def test_out_at_a_folder_of_the_users_files_is_refused(name, data, tmp_path, capsys):
    out = tmp_path / "d"
    for rel, content in USERS_FOLDERS[name].items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(content)
    before = snapshot(out)
    rc, _, err = train(capsys, data, out)
    assert rc == 1
    line = one_error(err, names=re.escape(str(out)))
    assert "not written by vitkit" in line or "not a vitkit run" in line, line
    assert snapshot(out) == before  # nothing replaced, nothing deleted, nothing added
    assert sorted(p.name for p in out.iterdir()) == sorted({Path(r).parts[0] for r in USERS_FOLDERS[name]})


def test_out_at_a_vitkit_run_with_the_users_file_in_last_is_refused_on_resume(data, tmp_path, capsys):
    out = tmp_path / "run"
    rc, _, err = train(capsys, data, out)
    assert rc == 0, err
    (out / "last" / "notes.txt").write_text("keep\n")
    rc, _, err = cli(capsys, "train", "--resume", out, "--epochs", "2", "--quiet")
    assert rc == 1
    one_error(err, names=re.escape(str(out / "last" / "notes.txt")) + ".*not written by vitkit")
    assert (out / "last" / "notes.txt").read_text() == "keep\n"


def test_out_at_an_empty_folder_or_a_run_that_saved_no_checkpoint_is_taken(data, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = train(capsys, data, empty)
    assert rc == 0, err
    # a run killed before its first checkpoint leaves config.json, classes.json, metrics.jsonl and its lock:
    # a new run may take the folder, and the user's own file beside them stays
    early = tmp_path / "early"
    early.mkdir()
    for name in ("config.json", "classes.json", "metrics.jsonl"):
        (early / name).write_bytes((empty / name).read_bytes())
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (early / ".lock").write_text(f"{socket.gethostname()} {dead.stdout.strip()}\n")  # a dead process's lock
    (early / "notes.txt").write_text("keep\n")
    rc, _, err = train(capsys, data, early)
    assert rc == 0, err
    assert (early / "last" / "vitkit.safetensors").is_file() and (early / "notes.txt").read_text() == "keep\n"


# ================================================================== 2. FIFOs in data folders; signals
def bounded_run(argv: list[str], timeout: float, what: str) -> tuple[int, str, str]:
    """``argv`` in a process of its own (and its own session, killed whole, and the test failed, if it is
    still running after ``timeout`` s), with src/ and tests/ on its path: (exit code, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"{what}: still running after {timeout} s")
    return p.returncode, out, err


def vitkit_run(*argv, timeout: float = 60) -> tuple[int, str, list[str]]:
    """``vitkit ARGV`` in a process of its own (``bounded_run``): (exit code, stdout, stderr lines). A command
    blocked in a system call in a worker thread cannot be interrupted in-process, so whatever could hang
    runs here."""
    rc, out, err = bounded_run([sys.executable, "-m", "vitkit", *map(str, argv)], timeout,
                               f"vitkit {' '.join(map(str, argv))}")
    return rc, out, err.splitlines()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return vitkit.save(tiny_model(head_std=1.0, labels=["cat", "dog"], num_classes=2),
                       tmp_path_factory.mktemp("ck") / "ckpt")


@pytest.fixture
def fifo_data(tmp_path) -> Path:
    """An image folder with a FIFO named like an image in one class folder."""
    root = image_folder(tmp_path / "imgs", n=4, test=2)
    os.mkfifo(root / "train" / "cat" / "p.png")
    os.mkfifo(root / "test" / "dog" / "q.png")
    return root


def test_a_fifo_in_a_folder_is_skipped_with_a_warning_never_opened(ckpt, fifo_data):
    fifo = fifo_data / "train" / "cat" / "p.png"
    rc, out, err = vitkit_run("predict", ckpt, fifo_data / "train", "--json", "--quiet")
    assert rc == 0, err
    assert err == [f"vitkit: warning: skipped {fifo}: not a regular file (a FIFO); not read"], err
    assert len(json.loads(out)["predictions"]) == 8
    rc, out, err = vitkit_run("predict", ckpt, fifo_data / "train", "--strict", "--quiet")
    assert rc == 1
    one_error(err, names=re.escape(str(fifo)) + r": not a regular file \(a FIFO\)")
    rc, out, err = vitkit_run("eval", ckpt, "--data", fifo_data, "--quiet")
    q = fifo_data / "test" / "dog" / "q.png"
    assert rc == 0 and f"vitkit: warning: skipped {q}: not a regular file (a FIFO); not read" in err, err
    assert all(line.startswith("vitkit: warning: skipped") for line in err), err


def test_a_fifo_given_directly_is_one_line(ckpt, tmp_path):
    fifo = tmp_path / "p.png"
    os.mkfifo(fifo)
    rc, out, err = vitkit_run("predict", ckpt, fifo, "--quiet")
    assert rc == 1
    one_error(err, names=re.escape(str(fifo)) + r": not a regular file \(a FIFO\)")
    rc, out, err = vitkit_run("explain", ckpt, fifo, "--out", tmp_path / "x")
    assert rc == 1
    one_error(err, names=re.escape(str(fifo)) + r": not a regular file \(a FIFO\)")


def test_training_on_a_folder_with_fifos_skips_them(fifo_data, tmp_path):
    rc, out, err = vitkit_run("train", "--data", fifo_data, "--epochs", "1", "--out", tmp_path / "run",
                              *[a for a in FAST_TRAIN_ARGS if a != "--quiet"])
    assert rc == 0 and "Traceback" not in "\n".join(err), err
    p = fifo_data / "train" / "cat" / "p.png"
    assert f"skipped 2 unreadable file(s), e.g. {p}: not a regular file (a FIFO); not read" in out, out
    rc, out, err = vitkit_run("train", "--data", fifo_data, "--epochs", "1", "--out", tmp_path / "strict",
                              *FAST_TRAIN_ARGS, "--set", "data.strict=true")
    assert rc == 1
    one_error(err, names=r"p\.png: not a regular file \(a FIFO\)")


# a command held in its library call (a stand-in that sleeps), so that the signal arrives while it runs
HELD = """
import sys, time, importlib
sys.path.insert(0, {tests!r})
module, name = sys.argv[1], sys.argv[2]
def held(*args, **kwargs):
    print("ready", flush=True)
    time.sleep(60)
setattr(importlib.import_module(module), name, held)
from vitkit.cli.main import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("command", ["predict", "eval", "explain"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_end_a_command_at_once(command, sig, ckpt, tmp_path):
    module, argv = {
        "predict": ("vitkit.tools.predict", ["predict", ckpt, tmp_path]),
        "eval": ("vitkit.tools.evaluate", ["eval", ckpt, "--data", tmp_path]),
        "explain": ("vitkit.tools.explain", ["explain", ckpt, tmp_path / "x.png", "--out", tmp_path / "o"]),
    }[command]
    name = {"eval": "evaluate"}.get(command, command)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    # as from a terminal: a suite started in the background (`cmd &` from a script) has SIGINT ignored, which
    # its children would inherit, and Python then raises no KeyboardInterrupt
    p = subprocess.Popen([sys.executable, "-c", HELD.format(tests=str(ROOT / "tests")), module, name,
                          *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert p.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        p.kill()
        p.wait()
    if sig == signal.SIGTERM:  # ended by the signal itself, after its line: a shell's status 143
        assert (p.returncode, err) == (-signal.SIGTERM, "vitkit: interrupted (SIGTERM)\n"), (p.returncode, err)
    else:
        assert (p.returncode, err) == (130, "vitkit: interrupted\n"), (p.returncode, err)
    assert took < 10


# ================================================================= 7. --json output is strict JSON
def _no_constant(name):
    raise ValueError(f"not strict JSON: {name}")


def strict_json(line: str):
    """``line`` parsed as strict JSON: NaN, Infinity and -Infinity are refused."""
    return json.loads(line, parse_constant=_no_constant)


@pytest.fixture(scope="module")
def nan_ckpt(tmp_path_factory) -> Path:
    """A checkpoint whose head's bias is NaN: every logit, probability and loss is NaN."""
    import torch

    m = tiny_model(head_std=1.0, labels=["cat", "dog"], num_classes=2)
    with torch.no_grad():
        m.head.bias.fill_(float("nan"))
    return vitkit.save(m, tmp_path_factory.mktemp("nan") / "ckpt")


def test_json_output_is_strict_json_also_for_nan(nan_ckpt, ckpt, data, tmp_path, capsys):
    image = data / "test" / "cat" / "0.png"
    commands = {
        "predict": ["predict", nan_ckpt, image, "--json", "--quiet"],
        "eval": ["eval", nan_ckpt, "--data", data, "--json", "--quiet"],
        "explain": ["explain", nan_ckpt, image, "--out", tmp_path / "x", "--json"],
        "bench": ["bench", ckpt, "--batch-sizes", "1", "--repeats", "1", "--warmup", "0", "--threads", "1",
                  "--device", "cpu", "--json"],
        "convert": ["convert", ckpt, tmp_path / "timm.safetensors", "--to", "timm", "--json"],
        "export": ["export", nan_ckpt, "--format", "torchscript", "--out", tmp_path / "m.pt", "--no-check", "--json"],
        "list": ["list", "vit_test", "--json"],
        "train": ["train", "--data", data, "--epochs", "1", "--out", tmp_path / "run", *FAST_TRAIN_ARGS, "--json"],
    }
    parsed = {}
    for name, argv in commands.items():
        rc, out, err = cli(capsys, *argv)
        assert rc == 0 and "Traceback" not in "\n".join(err), (name, err)
        parsed[name] = strict_json(out.strip().splitlines()[-1])
    assert parsed["predict"]["predictions"][0]["top"][0]["prob"] is None
    assert parsed["eval"]["loss"] is None
    assert parsed["list"][0]["name"] == "vit_test" and parsed["train"]["status"] == "completed"


# ===================================================== 3. configs of absurd size, or nested without end
def _edit_json(file: Path, **changes) -> None:
    data = json.loads(file.read_text())
    for key, value in changes.items():
        target = data
        *path, last = key.split(".")
        for k in path:
            target = target[k]
        target[last] = value
    file.write_text(json.dumps(data))


HUGE = {  # field (of the checkpoint's model config) -> (value, the field the error names)
    "depth": (10**9, "depth"),
    "embed_dim": (2**31, "embed_dim"),
    "img_size": ([10**6, 10**6], "img_size"),
    "num_classes": (2**40, "num_classes"),
}


@pytest.mark.parametrize("field", sorted(HUGE))
def test_a_checkpoint_of_absurd_size_is_one_line(field, ckpt, data, tmp_path, capsys):
    import shutil

    bad = Path(shutil.copytree(ckpt, tmp_path / "ck"))
    value, named = HUGE[field]
    changes = {f"model.{field}": value}
    if field == "embed_dim":
        changes["model.num_heads"] = 1
    _edit_json(bad / "vitkit.json", **changes)
    t0 = time.monotonic()
    for argv in (["predict", bad, data / "test" / "cat" / "0.png"], ["convert", bad, tmp_path / "t.safetensors",
                                                                    "--to", "timm"]):
        rc, _, err = cli(capsys, *argv)
        assert rc == 1
        line = one_error(err, names=re.escape(str(bad / "vitkit.json")) + rf".*ViTConfig\.{named}: ")
        assert "over the limit" in line, line
    assert time.monotonic() - t0 < 20


HF_HUGE = {"num_hidden_layers": 10**9, "hidden_size": 2**31, "image_size": 10**6}


@pytest.fixture(scope="module")
def hf_dir(ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf") / "hf"
    assert main(["convert", str(ckpt), str(out), "--to", "hf"]) == 0
    return out


@pytest.mark.parametrize("key", sorted(HF_HUGE))
def test_an_hf_config_of_absurd_size_is_one_line(key, hf_dir, tmp_path, capsys):
    import shutil

    bad = Path(shutil.copytree(hf_dir, tmp_path / "hf"))
    _edit_json(bad / "config.json", **{key: HF_HUGE[key]},
               **({"num_attention_heads": 1, "intermediate_size": 2**33} if key == "hidden_size" else {}))
    t0 = time.monotonic()
    rc, _, err = cli(capsys, "convert", bad, tmp_path / "ck", "--from", "hf")
    assert rc == 1
    line = one_error(err, names=re.escape(str(bad)))
    assert "over the limit" in line, line
    assert time.monotonic() - t0 < 20


def test_the_limits_can_be_raised_for_a_larger_model(monkeypatch):
    from vitkit.core.errors import ConfigError
    from vitkit.model import config as model_config

    with pytest.raises(ConfigError, match=r"ViTConfig\.depth: 500 blocks of width 2048 .* over the limit of 5e\+09"):
        model_config.ViTConfig(depth=500, embed_dim=2048, num_heads=16)
    monkeypatch.setattr(model_config, "MAX_PARAMS", 3e10)
    assert model_config.ViTConfig(depth=500, embed_dim=2048, num_heads=16).depth == 500


DEEP = 100_000


def _deep_json() -> str:
    return '{"model": ' + "[" * DEEP + "]" * DEEP + "}"


def _deep_toml() -> str:
    return "x = " + "[" * DEEP + "]" * DEEP + "\n"


def test_a_config_nested_without_end_is_one_line(ckpt, hf_dir, data, tmp_path, capsys):
    import shutil

    cases = []
    bad_ck = Path(shutil.copytree(ckpt, tmp_path / "ck"))
    (bad_ck / "vitkit.json").write_text(_deep_json())
    cases.append((bad_ck / "vitkit.json", ["predict", bad_ck, data / "test" / "cat" / "0.png"]))
    bad_hf = Path(shutil.copytree(hf_dir, tmp_path / "hf"))
    (bad_hf / "config.json").write_text(_deep_json())
    cases.append((bad_hf / "config.json", ["convert", bad_hf, tmp_path / "out", "--from", "hf"]))
    for name, text in (("x.json", _deep_json()), ("x.toml", _deep_toml())):
        (tmp_path / name).write_text(text)
        cases.append((tmp_path / name, ["train", "--config", tmp_path / name, "--out", tmp_path / "run", "--quiet"]))
    dotted = tmp_path / "dotted.toml"  # dotted keys nest without brackets
    dotted.write_text(".".join(["a"] * 5000) + " = 1\n")
    cases.append((dotted, ["train", "--config", dotted, "--out", tmp_path / "run", "--quiet"]))
    for file, argv in cases:
        rc, _, err = cli(capsys, *argv)
        assert rc == 1, (argv, err)
        one_error(err, names=re.escape(str(file)) + r".*nested more than \d+ levels deep")
    rc, _, err = cli(capsys, "list", "vit_test")  # the interpreter is fine afterwards
    assert rc == 0


# ================================== 4. decoded-image cache entries that pass the checksum but not the shape
def _cache_folder(root: Path) -> Path:
    from helpers import noise_image

    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(5):
            noise_image(20 + 4 * (i % 3), 24, seed=10 * (c == "b") + i).save(root / c / f"{i}.png")
    return root


def _open_cached(root, cache):
    import torch

    from vitkit.data import open_dataset

    d = open_dataset(root, val_fraction=0, cache_dir=cache, short_side=20)
    d.train.get_batch(torch.arange(len(d.train)))  # every image read back
    return d


def _rewrite(entry: Path, meta, shapes, pixels, compress: bool = False) -> None:
    """An entry with the right key and a recomputed checksum, holding what it is given."""
    import zipfile
    import zlib

    import numpy as np

    if isinstance(meta, dict):
        meta = dict(meta, crc=zlib.crc32(np.ascontiguousarray(pixels)))
    members = {"meta": np.frombuffer(json.dumps(meta).encode(), np.uint8), "shapes": shapes, "pixels": pixels}
    with zipfile.ZipFile(entry, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as z:
        for name, array in members.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)


def _bad_entries():
    import numpy as np

    def tall(meta, shapes, pixels):  # all pixels as one 1-wide grey image, the others unreadable
        rows = [[pixels.size, 1, 1]] + [[-1, -1, -1]] * (len(shapes) - 1)
        return meta, np.array(rows, np.int64), pixels

    def negative(meta, shapes, pixels):
        s = shapes.copy()
        s[0] = [-s[0, 0], -s[0, 1], s[0, 2]]  # the same product, negative sides
        return meta, s, pixels

    def zero(meta, shapes, pixels):
        s = shapes.copy()
        s[1] = [0, 5, 3]
        return meta, s, pixels[: pixels.size - int(np.prod(shapes[1]))]

    return {
        "meta-list": lambda m, s, p: ([m["key"]], s, p),
        "meta-errors-list": lambda m, s, p: ({**m, "errors": []}, s, p),
        "shapes-0d": lambda m, s, p: (m, np.array(len(s)), p),
        "shapes-float": lambda m, s, p: (m, s.astype(np.float64), p),
        "negative": negative,
        "zero": zero,
        "fortran-pixels": lambda m, s, p: (m, s, np.asfortranarray(np.stack([p, p], 1))),
        "float64-pixels": lambda m, s, p: (m, s, p.astype(np.float64)),
        "2d-pixels": lambda m, s, p: (m, s, p.reshape(-1, 1)),
        "one-tall-image": tall,
    }


@pytest.mark.parametrize("case", sorted(_bad_entries()))
def test_a_cache_entry_of_the_wrong_structure_is_a_miss(case, tmp_path, monkeypatch):
    import numpy as np
    import torch

    root, cache = _cache_folder(tmp_path / "data"), tmp_path / "cache"
    first = _open_cached(root, cache)
    (entry,) = (cache / "decoded").glob("*.npz")
    with np.load(entry) as z:
        meta, shapes, pixels = json.loads(bytes(z["meta"]).decode()), z["shapes"], z["pixels"]
    _rewrite(entry, *_bad_entries()[case](meta, shapes, pixels))
    again = _open_cached(root, cache)
    assert again.cache == "miss"
    a, b = (d.train.get_batch(torch.arange(len(d.train)))[0] for d in (first, again))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert _open_cached(root, cache).cache == "hit"  # written again, whole


def test_a_cache_entry_claiming_a_gigabyte_is_not_read(tmp_path):
    import resource

    import numpy as np

    root, cache = _cache_folder(tmp_path / "data"), tmp_path / "cache"
    _open_cached(root, cache)
    (entry,) = (cache / "decoded").glob("*.npz")
    with np.load(entry) as z:
        meta, shapes = json.loads(bytes(z["meta"]).decode()), z["shapes"]
    rows = [[1 << 15, 1 << 15, 1]] + [[-1, -1, -1]] * (len(shapes) - 1)  # 1 GiB of zeros, deflated to 1 MB
    big = np.zeros(1 << 30, np.uint8)
    _rewrite(entry, meta, np.array(rows, np.int64), big, compress=True)
    del big
    assert entry.stat().st_size < 8 << 20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; the writing above set it already
    from vitkit.data.cache import DecodeCache

    name = entry.stem
    assert DecodeCache(cache).load(name, meta["key"], len(shapes)) is None
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss <= peak + (64 << 10)  # no new 1 GiB


def test_a_folder_named_like_an_old_entry_and_a_failed_write(tmp_path, capsys):
    root, cache = _cache_folder(tmp_path / "data"), tmp_path / "cache"
    _open_cached(root, cache)
    (entry,) = (cache / "decoded").glob("*.npz")
    stale = entry.with_name(entry.name.split("-")[0] + "-" + "0" * 32 + ".npz")
    stale.mkdir()
    (stale / "mine.txt").write_text("keep\n")
    (root / "a" / "new.png").write_bytes((root / "a" / "0.png").read_bytes())  # another key: a new entry
    d = _open_cached(root, cache)
    assert d.cache == "miss" and (stale / "mine.txt").read_text() == "keep\n" and not entry.exists()
    # the write fails: the run says so, and never that it cached the data
    data = image_folder(tmp_path / "imgs", n=4, test=2)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go\n")
    rc, out, err = cli(capsys, "train", "--data", data, "--epochs", "1", "--out", tmp_path / "run", "--cache-dir",
                       blocked, "--json", *[a for a in FAST_TRAIN_ARGS if a != "--quiet"])
    assert rc == 0, err
    assert json.loads(out.splitlines()[-1])["data_cache"] == "miss, not cached"
    assert "cached in" not in out.replace("not cached in", ""), out
    assert any(line.startswith("warning: decoded images not cached") for line in out.splitlines()), out


# ============================================= 8. labels that do not fit, weights that are not floats, link loops
def test_an_hf_id2label_of_another_length_is_a_warning(hf_dir, tmp_path):
    import shutil

    from vitkit.core.errors import VitkitWarning
    from vitkit.io.convert import read

    bad = Path(shutil.copytree(hf_dir, tmp_path / "hf"))
    _edit_json(bad / "config.json", id2label={"0": "cat", "1": "dog", "2": "bird"},
               label2id={"cat": 0, "dog": 1, "bird": 2})
    with pytest.warns(VitkitWarning, match=re.escape(str(bad / "config.json")) + r": id2label names 3 classes but "
                      r"the head has 2"):
        model = read(bad, "hf")[0]
    assert model.labels is None


def _weights_with(ckpt: Path, tmp_path: Path, change) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    bad = Path(shutil.copytree(ckpt, tmp_path / "bad"))
    state = load_file(str(bad / "vitkit.safetensors"))
    change(state)
    save_file(state, str(bad / "vitkit.safetensors"))
    return bad


@pytest.mark.parametrize("dtype", ["int8", "bool"])
def test_weights_that_are_not_floats_are_refused_naming_the_tensor(dtype, ckpt, data, tmp_path, capsys):
    import torch

    def change(state):
        state["head.weight"] = state["head.weight"].to(getattr(torch, dtype))

    bad = _weights_with(ckpt, tmp_path, change)
    for argv in (["predict", bad, data / "test" / "cat" / "0.png"], ["convert", bad, tmp_path / "t.safetensors",
                                                                    "--to", "timm"]):
        rc, _, err = cli(capsys, *argv)
        assert rc == 1
        one_error(err, names=re.escape(str(bad / "vitkit.safetensors")) + rf": tensor head\.weight is {dtype}, not "
                  "floating point")
    timm_file = tmp_path / "timm.safetensors"  # the foreign readers check the same
    assert main(["convert", str(ckpt), str(timm_file), "--to", "timm"]) == 0
    capsys.readouterr()
    from safetensors.torch import load_file, save_file

    state = load_file(str(timm_file))
    state["head.weight"] = state["head.weight"].to(getattr(torch, dtype))
    save_file(state, str(timm_file))
    rc, _, err = cli(capsys, "convert", timm_file, tmp_path / "ck2", "--from", "timm", "--model", "vit_test")
    assert rc == 1
    one_error(err, names=r"tensor head\.weight is " + dtype)


def test_weights_holding_nan_load_with_a_warning_naming_the_tensor(ckpt, data, tmp_path, capsys):
    def change(state):
        state["blocks.0.mlp.fc1.weight"][0, 0] = float("nan")

    bad = _weights_with(ckpt, tmp_path, change)
    rc, out, err = cli(capsys, "predict", bad, data / "test" / "cat" / "0.png", "--json", "--quiet")
    assert rc == 0
    assert err == [f"vitkit: warning: {bad / 'vitkit.safetensors'}: tensor blocks.0.mlp.fc1.weight holds NaN or "
                   "infinite values; the model's outputs will not be finite"], err


def test_a_weights_file_linked_to_itself_is_a_link_loop(ckpt, data, tmp_path, capsys):
    import shutil

    bad = Path(shutil.copytree(ckpt, tmp_path / "loop"))
    (bad / "vitkit.safetensors").unlink()
    os.symlink("vitkit.safetensors", bad / "vitkit.safetensors")
    rc, _, err = cli(capsys, "predict", bad, data / "test" / "cat" / "0.png")
    assert rc == 1
    one_error(err, names=re.escape(str(bad / "vitkit.safetensors")) + ": a symbolic link loop$")
    rc, _, err = cli(capsys, "convert", bad / "vitkit.safetensors", tmp_path / "ck", "--from", "timm")
    assert rc == 1
    one_error(err, names="a symbolic link loop")


# ============================================================ 6. a rank killed in a run of two processes
# Loaded as sitecustomize by the processes of the test's run (their PYTHONPATH holds it): the rank named in
# the environment kills itself with SIGKILL at its Nth training step, as the kernel's OOM killer would.
KILL_RANK = """
import os
if os.environ.get("KILL_RANK") == os.environ.get("RANK", "-"):
    import signal
    import vitkit.train.trainer as trainer
    real, calls = trainer.Trainer.train_step, [0]

    def step_then_die(self, *a, **k):
        calls[0] += 1
        if calls[0] == int(os.environ["KILL_AT_STEP"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *a, **k)

    trainer.Trainer.train_step = step_then_die
"""


@pytest.mark.parametrize("rank", [1, 0])
def test_a_killed_rank_ends_the_run_in_one_line_with_how_to_resume(rank, data, tmp_path):
    from vitkit.train.checkpoint import checkpoint_step

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(KILL_RANK)
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hooks), str(ROOT / "src")]), KILL_RANK=str(rank),
               KILL_AT_STEP="3")  # 8 training images, one step an epoch: dies in epoch 3, step 2 saved
    argv = [sys.executable, "-m", "vitkit", "train", "--data", data, "--epochs", "3", "--nproc", "2", "--out", run,
            *FAST_TRAIN_ARGS]
    t0 = time.monotonic()
    r = subprocess.run(list(map(str, argv)), capture_output=True, text=True, timeout=120, env=env)
    assert time.monotonic() - t0 < 60
    assert r.returncode == 128 + signal.SIGKILL, r.stderr
    lines = r.stderr.splitlines()
    assert lines == [f"vitkit: error: process {rank} of 2 failed (killed by SIGKILL); tracebacks in {run}/failure.log; "
                     f"the last checkpoint {run}/last (step 2) is kept; continue with: vitkit train --resume {run}"], \
        r.stderr
    assert checkpoint_step(run / "last") == "2"
    assert "Traceback (most recent call last)" in (run / "failure.log").read_text()
    if rank == 1:  # the line's command continues the run (the hook does nothing then)
        r = subprocess.run([sys.executable, "-m", "vitkit", "train", "--resume", str(run), "--quiet", "--json"],
                           capture_output=True, text=True, timeout=120, env=dict(env, KILL_RANK="-"))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.splitlines()[-1])["status"] == "completed"


# ================================================= 9. numbers that are not finite, flags that disagree, odd data
@pytest.mark.parametrize("flag, key", [("--max-minutes", "max_minutes"), ("--weight-decay", "optim.weight_decay"),
                                       ("--mixup", "augment.mixup_alpha"), ("--lr", "optim.lr")])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_number_that_is_not_finite_is_refused_naming_the_key(flag, key, value, data, tmp_path, capsys):
    rc, _, err = train(capsys, data, tmp_path / "run", flag, value)
    assert rc == 1
    one_error(err, names=re.escape(key) + ": expected a finite number, got " + value)
    assert not (tmp_path / "run").exists()


def test_non_finite_settings_are_refused_in_the_library_and_in_files(data, tmp_path):
    from vitkit.core.errors import ConfigError
    from vitkit.train.config import resolve_config

    with pytest.raises(ConfigError, match=r"max_minutes: expected a finite number, got nan"):
        vitkit.fit(data, max_minutes=float("nan"), epochs=1, out=tmp_path / "run", log=None)
    with pytest.raises(ConfigError, match=r"augment\.mixup_alpha: expected a finite number, got nan"):
        resolve_config(None, overrides=["augment.mixup_alpha=NaN"])
    with pytest.raises(ConfigError, match=r"model_args\.drop_path_rate|drop_path_rate: expected a finite number"):
        from vitkit.train.build import model_config

        model_config(resolve_config(None, {"model_args.drop_path_rate": float("inf")}))
    toml = tmp_path / "c.toml"
    toml.write_text("[optim]\nweight_decay = nan\n")
    with pytest.raises(ConfigError, match=re.escape(str(toml)) + r".*optim\.weight_decay: expected a finite number"):
        resolve_config(toml)
    for override, key in (("optim.eps=0", "optim.eps"), ("optim.momentum=1.5", "optim.momentum")):
        with pytest.raises(ConfigError, match=re.escape(key) + ": must be"):
            resolve_config(None, overrides=[override])


@pytest.mark.parametrize("flags", [("--amp", "--precision", "fp32"), ("--precision", "fp32", "--amp"),
                                   ("--model-ema", "--ema", "0.5"), ("--ema", "0.5", "--model-ema"),
                                   ("--model-ema-decay", "0.9", "--ema", "0.5")])
def test_a_timm_alias_and_a_flag_that_disagree_are_refused(flags, data, tmp_path, capsys):
    args = [a for a in FAST_TRAIN_ARGS if a not in ("--precision", "fp32")]
    rc, _, err = cli(capsys, "train", "--data", data, "--epochs", "1", "--out", tmp_path / "run", *args, *flags)
    assert rc == 1
    key = "precision" if "--amp" in flags else "ema"
    one_error(err, names=rf"--(amp|model-ema).* and --{key} both set {key}, to .*; give one of the two")
    assert not (tmp_path / "run").exists()


def test_a_timm_alias_that_agrees_with_the_flag_is_taken(data, tmp_path, capsys):
    from vitkit.cli.commands.train import flags_from_args
    from vitkit.cli.main import parse_args

    args = parse_args(["train", "--precision", "bf16", "--amp", "--ema", "0.9998", "--model-ema"])
    flags = flags_from_args(args)
    assert (flags["precision"], flags["ema"]) == ("bf16", 0.9998)


@pytest.mark.parametrize("settings, says", [({1: 2}, r"settings key 1: expected a dotted config key"),
                                            ("x", r"settings must be a dict of config keys and values"),
                                            ({"nosuch.key": 1}, r"nosuch\.key: not a config key"),
                                            ({"optim.": 1}, r"settings key 'optim\.': expected a dotted")])
def test_fit_with_settings_that_are_not_config_keys_is_a_config_error(settings, says, tmp_path):
    from vitkit.core.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        vitkit.fit(settings=settings, out=tmp_path / "run", log=None)


def test_a_class_of_one_image_trains_without_a_hold_out_and_the_advice_works(tmp_path, capsys):
    root = image_folder(tmp_path / "imgs", n=9, test=0)
    folder = root / "train"
    for extra in (f"{i}.png" for i in range(1, 9)):
        (folder / "cat" / extra).unlink()
    rc, _, err = cli(capsys, "train", "--data", folder, "--epochs", "1", "--out", tmp_path / "a", *FAST_TRAIN_ARGS,
                     "--set", "data.val_fraction=0.25")
    assert rc == 1
    line = one_error(err, names=r"class 'cat' has 1 image; a validation split needs at least 2 per class")
    assert "set val_fraction to 0" in line, line
    rc, out, err = cli(capsys, "train", "--data", folder, "--epochs", "1", "--out", tmp_path / "b",
                       *[a for a in FAST_TRAIN_ARGS if a != "--quiet"], "--set", "data.val_fraction=0")
    assert rc == 0, err
    assert "class 'cat' has one image, so none are held out" in out, out
    rc, out, err = cli(capsys, "eval", tmp_path / "b", "--data", folder, "--quiet")  # the run's own data again
    assert rc == 0, err


def test_preprocess_constants_that_fit_no_channels_name_the_field_and_file(ckpt, data, tmp_path, capsys):
    import shutil

    for mean, says in (([], r"Preprocess\.mean: expected a number or a list of numbers in \[-10, 10\], got \(\)"),
                       ([0.1, 0.2], r"Preprocess\.mean: 2 values do not fit 3 channels")):
        bad = Path(shutil.copytree(ckpt, tmp_path / f"ck{len(mean)}"))
        _edit_json(bad / "vitkit.json", **{"preprocess.mean": mean, "preprocess.std": [0.5] * len(mean)})
        rc, _, err = cli(capsys, "predict", bad, data / "test" / "cat" / "0.png")
        assert rc == 1
        one_error(err, names=re.escape(str(bad / "vitkit.json")) + ": " + says)
    rc, _, err = train(capsys, data, tmp_path / "run", "--set", "preprocess.mean=[]")
    assert rc == 1
    one_error(err, names=r"Preprocess\.mean: ")


# ========================================================= 10. FIFOs where vitkit's own files should be
def python_run(code: str, timeout: float = 60) -> tuple[int, str, str]:
    """``code`` in a Python process of its own (``bounded_run``)."""
    return bounded_run([sys.executable, "-c", code], timeout, code)


def test_a_fifo_in_place_of_a_decoded_image_cache_entry_is_a_miss(tmp_path):
    root, cache = _cache_folder(tmp_path / "data"), tmp_path / "cache"
    _open_cached(root, cache)
    (entry,) = (cache / "decoded").glob("*.npz")
    entry.unlink()
    os.mkfifo(entry)
    rc, out, err = python_run(f"from test_robustness_cases import _open_cached\n"
                              f"print(_open_cached({str(root)!r}, {str(cache)!r}).cache)", timeout=60)
    assert (rc, out.strip()) == (0, "miss"), err
    assert entry.is_file()  # written again in its place


def test_a_fifo_in_place_of_a_probe_feature_cache_entry_is_a_miss(tmp_path):
    code = f"""
import torch
from vitkit.train.features import FeatureCache
cache = FeatureCache({str(tmp_path)!r})
labels, feats = torch.tensor([0, 1, 1]), torch.randn(3, 4)
file = cache.file("weights+data", "k" * 32)
assert cache.store(file, "k" * 32, feats, labels) is None
assert torch.equal(cache.load(file, "k" * 32, labels, 4), feats)  # a hit
file.unlink()
import os; os.mkfifo(file)
print(cache.load(file, "k" * 32, labels, 4))
"""
    rc, out, err = python_run(code, timeout=60)
    assert (rc, out.strip()) == (0, "None"), err


@pytest.mark.parametrize("name", ["run.toml", "run.json"])
def test_a_config_file_that_is_a_fifo_is_one_line(name, data, tmp_path):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    rc, _, err = vitkit_run("train", "--config", fifo, "--data", data, "--out", tmp_path / "run", "--quiet",
                            timeout=60)
    assert rc == 1
    one_error(err, names=re.escape(str(fifo)) + r": not a regular file \(a FIFO\)")


# ======================================================== 11. a run held by another process is never touched
@pytest.fixture
def held_run(data, tmp_path, capsys) -> Path:
    """A run folder as a run in progress has it before its first checkpoint: its config.json, metrics.jsonl
    and a lock naming a live process (this one)."""
    rc, _, err = train(capsys, data, tmp_path / "done")
    assert rc == 0, err
    run = tmp_path / "held"
    run.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        (run / name).write_bytes((tmp_path / "done" / name).read_bytes())
    (run / ".lock").write_text(f"{socket.gethostname()} {os.getpid()}\n")
    return run


def test_a_run_held_by_a_live_process_is_refused_before_anything_is_written(held_run, data, capsys):
    before = snapshot(held_run)
    for nproc in ("1", "2"):
        rc, _, err = train(capsys, data, held_run, "--nproc", nproc, "--epochs", "2")
        assert rc == 1, (nproc, err)
        one_error(err, names=re.escape(str(held_run)) + rf": run directory is in use by process {os.getpid()} ")
        assert snapshot(held_run) == before, nproc
    from vitkit.core.errors import TrainingError

    with pytest.raises(TrainingError, match=rf"in use by process {os.getpid()} "):
        vitkit.fit(data, out=held_run, epochs=2, settings={"processes": 2, "model": "vit_test", "batch_size": 8,
                                                           "device": "cpu", "precision": "fp32"}, log=None)
    assert snapshot(held_run) == before


def test_write_resolved_refuses_a_held_run(held_run):
    from vitkit.core.errors import TrainingError
    from vitkit.train.resolve import ResolvedRun, read_resolved, write_resolved

    run = read_resolved(held_run)
    before = snapshot(held_run)
    run.cfg.epochs += 5
    with pytest.raises(TrainingError, match="in use by process"):
        write_resolved(ResolvedRun(run.cfg, held_run))
    assert snapshot(held_run) == before


def test_a_failed_run_leaves_no_empty_folder_it_created(tmp_path, capsys):
    root = image_folder(tmp_path / "imgs", n=9, test=0)
    for extra in (f"{i}.png" for i in range(1, 9)):
        (root / "train" / "cat" / extra).unlink()
    out = tmp_path / "new" / "run"
    rc, _, err = train(capsys, root / "train", out, "--set", "data.val_fraction=0.25")  # fails on the data
    assert rc == 1 and "has 1 image" in err[0], err
    assert not out.exists()
    out.mkdir()  # a folder the user made stays
    rc, _, err = train(capsys, root / "train", out, "--set", "data.val_fraction=0.25")
    assert rc == 1 and out.is_dir() and not list(out.iterdir())


# ============================================== 12. convert into a checkpoint, a run, or onto a full disk
@pytest.fixture(scope="module")
def timm_file(ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("timm") / "vit.safetensors"
    assert main(["convert", str(ckpt), str(out), "--to", "timm"]) == 0
    return out


def test_convert_into_a_checkpoint_or_a_run_is_refused_unless_forced(timm_file, data, tmp_path, capsys):
    run = tmp_path / "run"
    rc, _, err = train(capsys, data, run)
    assert rc == 0, err
    before = snapshot(run)
    src = ["convert", timm_file]
    foreign = ["--from", "timm", "--model", "vit_test"]
    for argv, says in (([*src, run / "best", *foreign], r"best: holds a vitkit checkpoint \(vitkit\.json\)"),
                       ([*src, run / "last", *foreign], r"last: holds a vitkit checkpoint"),
                       ([*src, run, *foreign], r"run: holds a training run \(best/ holds a checkpoint\)"),
                       ([*src, run, *foreign, "--to", "hf"], r"run: holds a training run"),
                       (["convert", run, run / "timm.safetensors", "--to", "timm"], r"run: holds a training run")):
        rc, _, err = cli(capsys, *argv)
        assert rc == 1, argv
        line = one_error(err, names=says)
        assert "--force" in line, line
        assert snapshot(run) == before, argv
    rc, _, err = cli(capsys, *src, run / "best", *foreign, "--force")
    assert rc == 0, err
    assert vitkit.load(run / "best").cfg.depth == 2


def test_convert_onto_a_full_disk_leaves_no_empty_destination(timm_file, tmp_path):
    if not shutil.which("unshare") or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("needs a private mount namespace (unshare -m) for a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=64k tmpfs {disk} || exit 90; head -c 1M /dev/zero > {disk}/filler 2>/dev/null; "
              f"{sys.executable} -m vitkit convert {timm_file} {disk}/out --from timm --model vit_test; echo rc=$?; "
              f"ls -a {disk}")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120, env=env)
    if r.returncode == 90:
        pytest.skip("cannot mount a tmpfs here")
    assert "rc=1" in r.stdout, (r.stdout, r.stderr)
    one_error(r.stderr.splitlines(), names=r"out/vitkit\.safetensors: could not write \(no space left on device\)")
    assert r.stdout.split("rc=1", 1)[1].split() == [".", "..", "filler"], r.stdout  # no empty out/ left


# ================================================================ 13. a folder tree deeper than the stack
@pytest.fixture
def deep_tree(tmp_path):
    """An image folder whose class 'cat' holds an image 1,100 folders down; removed after the test one
    folder at a time (shutil.rmtree, as pytest's own clean-up, recurses and would fail on it)."""
    from helpers import noise_image

    root = image_folder(tmp_path / "imgs", n=6, test=0) / "train"
    deep = root / "cat"
    for _ in range(1100):  # one at a time: mkdir(parents=True) itself recurses
        deep = deep / "d"
        deep.mkdir()
    noise_image(32, 32, seed=9).save(deep / "deep.png")
    yield root, deep
    (deep / "deep.png").unlink()
    while deep != root / "cat":
        deep.rmdir()
        deep = deep.parent


def test_a_folder_tree_1100_levels_deep_is_walked(deep_tree, ckpt, tmp_path, capsys):
    root, deep = deep_tree
    rc, out, err = cli(capsys, "predict", ckpt, root, "--json", "--quiet")
    assert rc == 0, err[-3:]
    paths = [p["path"] for p in json.loads(out)["predictions"]]
    assert len(paths) == 13 and paths[6] == str(deep / "deep.png"), paths  # cat's files, its subfolders, then dog's
    rc, _, err = train(capsys, root, tmp_path / "run")
    assert rc == 0, err[-3:]


# ========================================================== 14. export where it cannot write; a killed export
def test_export_where_the_folder_cannot_be_written_is_one_line(ckpt, tmp_path, capsys, monkeypatch):
    argv = ["export", ckpt, "--format", "torchscript", "--no-check", "--out"]
    rc, _, err = cli(capsys, *argv, "/proc/m.pt")  # /proc takes no new files, even from root
    assert rc == 1
    one_error(err, names=r"--out: /proc/m\.pt: cannot write in /proc \(")
    import errno
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)  # a read-only file system, as mkdtemp reports it
    rc, _, err = cli(capsys, *argv, tmp_path / "m.pt")
    assert rc == 1
    one_error(err, names=re.escape(str(tmp_path / "m.pt")) + r": cannot write in .*\(Read-only file system\)")


def test_a_killed_exports_temporary_folder_is_removed_by_the_next(ckpt, tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".m.pt.{dead.stdout.strip()}.abcdefgh.tmp"  # as a SIGKILL mid-export leaves it
    stale.mkdir()
    (stale / "m.pt").write_bytes(b"half written")
    live = tmp_path / f".m.pt.{os.getpid()}.ijklmnop.tmp"  # an export running now
    live.mkdir()
    rc, _, err = cli(capsys, "export", ckpt, "--format", "torchscript", "--no-check", "--out", tmp_path / "m.pt")
    assert rc == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "m.pt"])


# ====================================================== 15. names that are not UTF-8, labels across lines
def _read_shown(text: str) -> bytes:
    """The bytes of a name as vitkit shows it: \\\\ a backslash, \\xNN the byte NN, \\n a newline."""
    return re.sub(rb"\\(\\|x[0-9a-f]{2}|n)", lambda m: {b"\\": b"\\", b"n": b"\n"}.get(m.group(1)) or
                  bytes([int(m.group(1)[1:], 16)]), text.encode())


def test_a_name_that_is_not_utf8_reads_back_from_predict_json(ckpt, data, tmp_path, capsys):
    folder = tmp_path / "imgs"
    folder.mkdir()
    png = (data / "test" / "cat" / "0.png").read_bytes()
    names = [b"bad\xff.png", b"bad\\xff.png", b"two\nlines.png"]  # the second holds a backslash, not a byte
    for name in names:
        with open(os.fsencode(folder) + b"/" + name, "wb") as f:
            f.write(png)
    rc, out, err = cli(capsys, "predict", ckpt, folder, "--json", "--quiet")
    assert rc == 0, err
    shown = [p["path"] for p in json.loads(out)["predictions"]]
    assert len(set(shown)) == 3, shown  # three files, three names
    assert sorted(_read_shown(p) for p in shown) == sorted(os.fsencode(folder) + b"/" + n for n in names)


def test_a_label_holding_a_newline_keeps_the_predict_table_one_line_a_row(data, tmp_path, capsys):
    ck = vitkit.save(tiny_model(head_std=1.0, labels=["ca\nt", "d\\og"], num_classes=2), tmp_path / "ck")
    rc, out, err = cli(capsys, "predict", ck, data / "test" / "cat", "--quiet")
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 1 + 2 + 2, out  # the header, a row an image, the path taken and the count
    assert all(re.search(r"(ca\\nt|d\\\\og) \d\.\d{3}", row) for row in lines[1:3]), out


@pytest.mark.parametrize("argv, says", [(["export", "--format", "torchscript", "--out", "m.pt", "--atol"],
                                         r"--atol: must be a finite number >= 0, got "),
                                        (["explain", "IMAGE", "--out", "x", "--alpha"],
                                         r"--alpha: the heatmap's opacity must be in \[0, 1\], got ")])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_the_tools_numbers_that_are_not_finite_or_in_range_are_one_line(argv, says, value, ckpt, data, tmp_path,
                                                                          capsys):
    argv = [str(data / "test" / "cat" / "0.png") if a == "IMAGE" else str(tmp_path / a) if a in ("m.pt", "x") else a
            for a in argv]
    rc, _, err = cli(capsys, argv[0], ckpt, *argv[1:], value)
    assert rc == 1
    one_error(err, names=says)
    assert not (tmp_path / "m.pt").exists() and not (tmp_path / "x").exists()
# ============================================ 9. preprocessing and model fields out of range, odd weights
NAN, INF = float("nan"), float("inf")
CKPT_BAD = {  # case -> (vitkit.json field, value, the error after "vitkit.json: ")
    "mean-nan": ("preprocess.mean", [NAN] * 3, r"preprocess\.mean\[0\]: expected a finite number, got nan"),
    "mean-text": ("preprocess.mean", "abc", r"preprocess\.mean: expected a list, got 'abc'"),
    "mean-empty": ("preprocess.mean", [], r"Preprocess\.mean: expected a number or a list of numbers in \[-10, 10\]"),
    "std-inf": ("preprocess.std", [INF] * 3, r"preprocess\.std\[0\]: expected a finite number, got inf"),
    "crop-tiny": ("preprocess.crop_pct", 1e-9, r"Preprocess\.crop_pct: expected a finite number in \[0.1, 1\], got 1e-09"),
    "crop-subnormal": ("preprocess.crop_pct", 5e-324, r"Preprocess\.crop_pct: expected a finite number in \[0.1, 1\]"),
    "norm-eps-inf": ("model.norm_eps", INF, r"model\.norm_eps: expected a finite number, got inf"),
    "mlp-ratio-inf": ("model.mlp_ratio", INF, r"model\.mlp_ratio: expected a finite number, got inf"),
    "mlp-ratio-huge": ("model.mlp_ratio", 1e308, r"ViTConfig\.mlp_ratio: must be a finite number giving an MLP width"),
    "layer-scale-inf": ("model.layer_scale", INF, r"model\.layer_scale: expected a finite number, got inf"),
    "depth-beyond-cap": ("model.depth", 2000, r"ViTConfig\.depth: 2000 blocks, over the limit of 1024 "
                                              r"\(vitkit\.model\.config\.MAX_DEPTH"),
    "classes-beyond-float": ("model.num_classes", 10**400,
                             r"model\.num_classes: expected an integer of 64 bits, got 10000000000000000"),
}


@pytest.mark.parametrize("case", sorted(CKPT_BAD))
def test_a_checkpoint_field_out_of_range_is_one_line_naming_it(case, ckpt, data, tmp_path, capsys):
    import shutil

    field, value, message = CKPT_BAD[case]
    bad = Path(shutil.copytree(ckpt, tmp_path / "ck"))
    _edit_json(bad / "vitkit.json", **{field: value})
    rc, _, err = cli(capsys, "predict", bad, data / "test" / "cat" / "0.png", "--json")
    assert rc == 1
    one_error(err, names="^vitkit: error: " + re.escape(f"{bad / 'vitkit.json'}: ") + message)


def test_a_preprocess_given_out_of_range_is_one_line(ckpt):
    from vitkit.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--set preprocess\.mean\[0\]: expected a finite number, got nan$"):
        vitkit.create_model(weights=ckpt, preprocess={"mean": [NAN, 0.5, 0.5]})


def test_a_negative_batchnorm_variance_is_refused_naming_the_tensor(data, tmp_path, capsys):
    from safetensors.torch import load_file

    conv = vitkit.save(tiny_model(head_std=1.0, stem="conv"), tmp_path / "conv")
    key = next(k for k in load_file(str(conv / "vitkit.safetensors")) if k.endswith("running_var"))

    def change(state):
        state[key][0] = -0.5

    bad = _weights_with(conv, tmp_path, change)
    rc, _, err = cli(capsys, "predict", bad, data / "test" / "cat" / "0.png", "--json")
    assert rc == 1
    one_error(err, names=re.escape(f"{bad / 'vitkit.safetensors'}: tensor {key} holds negative values (min -0.5); "
                                   "a BatchNorm's running variance is >= 0"))


def test_float8_weights_load_as_the_floats_they_hold(ckpt, data, tmp_path, capsys):
    """float8 has no isfinite kernel: the check reads it as the float32 the model will hold, and the model
    predicts as one whose weights are those float32 values."""
    import torch

    def to_f8(state):
        state["head.weight"] = state["head.weight"].to(torch.float8_e4m3fn)

    image = data / "test" / "cat" / "0.png"
    f8 = _weights_with(ckpt, tmp_path, to_f8).rename(tmp_path / "f8")
    same = _weights_with(ckpt, tmp_path, lambda s: (to_f8(s), s.update({"head.weight": s["head.weight"].float()})))
    outs = []
    for folder in (f8, same):
        rc, out, err = cli(capsys, "predict", folder, image, "--json", "--quiet")
        assert rc == 0 and not err, err
        outs.append(strict_json(out.strip().splitlines()[-1])["predictions"][0]["top"])
    assert outs[0] == outs[1] and all(t["prob"] is not None for t in outs[0])


def test_float64_weights_beyond_float32_warn_as_infinite(ckpt, data, tmp_path, capsys):
    """1e300 in a float64 file is infinite in the float32 model that holds it."""
    bad = _weights_with(ckpt, tmp_path, lambda s: s.update({"head.bias": s["head.bias"].double().fill_(1e300)}))
    rc, _, err = cli(capsys, "predict", bad, data / "test" / "cat" / "0.png", "--json", "--quiet")
    assert rc == 0 and err == [f"vitkit: warning: {bad / 'vitkit.safetensors'}: tensor head.bias holds NaN or "
                               "infinite values; the model's outputs will not be finite"], err


# --------------------------------------------------- every field of each source fuzzed: one line, or finite
def _fuzz_values():
    from hypothesis import strategies as st

    edges = st.sampled_from([NAN, INF, -INF, 0, 0.0, -1, -0.5, 1e-9, 5e-324, 1e9, 10**9, 2**63, 10**400, 1e308,
                             True, False, None, "", "abc", "0.5", 1 / 255, "gelu", "relu", "squash", "bilinear"])
    near = st.one_of(st.floats(-0.1, 1.1), st.integers(0, 64))  # in range or just outside it
    scalars = st.one_of(edges, near, st.floats(), st.integers(-5, 10**12), st.text(max_size=4))
    sizes = st.dictionaries(st.sampled_from(["height", "width", "shortest_edge"]), scalars, max_size=3)
    return st.one_of(scalars, st.lists(scalars, max_size=4), st.lists(near, min_size=1, max_size=4), sizes)


TIMM_FIELDS = ["mean", "std", "crop_pct", "crop_mode", "interpolation", "test_input_size", "test_crop_pct"]
HF_PROCESSOR_FIELDS = ["image_mean", "image_std", "size", "crop_size", "do_resize", "do_center_crop", "do_normalize",
                       "do_rescale", "rescale_factor", "resample", "image_processor_type"]
HF_CONFIG_FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
                    "layer_norm_eps", "image_size", "patch_size", "num_channels", "qkv_bias", "hidden_dropout_prob",
                    "attention_probs_dropout_prob", "model_type", "id2label"]


def _vitkit_fields() -> list[str]:
    import dataclasses

    from vitkit.model.config import Preprocess, ViTConfig

    return ([f"model.{f.name}" for f in dataclasses.fields(ViTConfig)] +
            [f"preprocess.{f.name}" for f in dataclasses.fields(Preprocess)] + ["labels", "format"])


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, tuple[Path, Path, str, list[str]]]:
    """Each file fuzzed: source -> (the folder read, the file, the key of the table whose fields change, fields)."""
    from helpers import random_model
    from test_hub import hf_folder, timm_folder

    root = tmp_path_factory.mktemp("sources")
    timm, hf = timm_folder(root / "timm", random_model(seed=1)), hf_folder(root / "hf", random_model(seed=2))
    ck = vitkit.save(random_model(seed=3), root / "ck")
    return {"timm": (timm, timm / "config.json", "pretrained_cfg", TIMM_FIELDS),
            "hf-processor": (hf, hf / "preprocessor_config.json", "", HF_PROCESSOR_FIELDS),
            "hf-config": (hf, hf / "config.json", "", HF_CONFIG_FIELDS),
            "vitkit": (ck, ck / "vitkit.json", "", _vitkit_fields())}


def _changed(file: Path, table: str, changes: dict) -> str:
    """``file``'s JSON with ``changes`` (dotted fields) made, under ``table`` when given."""
    data = json.loads(file.read_text())
    for key, value in changes.items():
        *path, last = ([table] if table else []) + key.split(".")
        target = data
        for k in path:
            target = target.setdefault(k, {}) if isinstance(target.get(k, {}), dict) else {}
        target[last] = value
    return json.dumps(data)


def _predict_fuzzed(folder: Path, image: Path) -> tuple[int, str, str]:
    """``vitkit predict FOLDER IMAGE --json`` in-process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["predict", str(folder), str(image), "--json", "--quiet", "--engine", "torch", "--device", "cpu",
                   "--precision", "fp32"])
    return rc, out.getvalue(), err.getvalue()


def test_fuzz_every_field_of_the_preprocessing_sources_and_vitkit_json(sources, data):
    """Random values (wrong types, NaN, infinities, zero, negative, huge) in 1-3 fields of a timm
    pretrained_cfg, an HF preprocessor_config.json or config.json, or a vitkit.json: `vitkit predict` ends
    in one error line naming the folder read, or a prediction of finite probabilities; never another
    exception."""
    from hypothesis import HealthCheck, event, given, settings
    from hypothesis import strategies as st

    image = data / "test" / "cat" / "0.png"

    @settings(max_examples=200, deadline=20_000, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(st.sampled_from(sorted(sources)).flatmap(lambda s: st.tuples(st.just(s), st.dictionaries(
        st.sampled_from(sources[s][3]), _fuzz_values(), min_size=1, max_size=2))))
    def check(case):
        name, changes = case
        event(f"{name}: {'predicted' if _predict_ends_cleanly(sources[name], changes, image) else 'refused'}")

    check()


EDGE_VALUES = [NAN, INF, -INF, 10**400, -10**400, 1e308, -1e308, True, None, "abc", [10**400, 1], {"height": 10**400}]


def test_every_field_of_the_preprocessing_sources_takes_every_edge_value(sources, data):
    """Each field of each source alone set to each edge value (NaN, the infinities, whole numbers too large for a
    float, a bool, None, text, such a number in a list or a size): the fuzz's end, walked exhaustively so that
    no edge waits for a lucky draw: one error line naming the folder, or finite probabilities."""
    image = data / "test" / "cat" / "0.png"
    outcomes = collections.Counter()
    for name in sorted(sources):
        for field in sources[name][3]:
            for value in EDGE_VALUES:
                outcomes[_predict_ends_cleanly(sources[name], {field: value}, image)] += 1
    assert outcomes[False] > 0 and outcomes[True] > 0, outcomes  # most refused; some (a None: the default) predict


def _predict_ends_cleanly(source, changes: dict, image: Path) -> bool:
    """`vitkit predict` on ``source`` (folder, file, table, fields) with ``changes`` made to its file: asserts one
    error line naming the folder or a prediction of finite probabilities, never another exception; True when it
    predicted."""
    folder, file, table, _ = source
    original = file.read_text()
    file.write_text(_changed(file, table, changes))
    try:
        rc, out, err = _predict_fuzzed(folder, image)
    finally:
        file.write_text(original)
    lines = err.strip().splitlines()
    assert "Traceback" not in err and all(ln.startswith(("vitkit: warning: ", "vitkit: error: ")) for ln in lines), \
        (changes, err)
    if rc == 0:
        top = strict_json(out.strip().splitlines()[-1])["predictions"][0]["top"]
        assert all(isinstance(t["prob"], float) and 0 <= t["prob"] <= 1 for t in top), (changes, top)
        return True
    assert rc == 1 and lines[-1].startswith("vitkit: error: ") and str(folder) in lines[-1], (changes, err)
    assert sum(ln.startswith("vitkit: error: ") for ln in lines) == 1, err
    return False
