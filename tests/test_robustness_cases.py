"""What a careless or hostile user finds, end to end: an --out folder of someone else's files, FIFOs in a data
folder, signals, configs that would build a model of terabytes or nest without end, decoded-image cache
entries that pass the checksum but not the shape, non-finite numbers in --json output, weights that are
not float, a rank killed in a run of several processes.

Every case: one line (``vitkit: error: ...`` or a warning), no traceback, no hang (each that could hang
runs under a timeout), and no file of the user's lost.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FAST_TRAIN_ARGS, image_folder

from vitkit.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]


def cli(capsys, *argv):
    """Run ``vitkit ARGV`` in-process: (exit code, stdout, stderr lines)."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err.splitlines()


def one_error(err_lines, names=None) -> str:
    """Exactly one ``vitkit: error:`` line, naming ``names`` (a regex), no traceback."""
    text = "\n".join(err_lines)
    assert "Traceback" not in text and len(err_lines) == 1 and err_lines[0].startswith("vitkit: error: "), text
    if names is not None:
        assert re.search(names, err_lines[0]), (names, text)
    return err_lines[0]


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
    assert (early / "last" / "model.safetensors").is_file() and (early / "notes.txt").read_text() == "keep\n"
