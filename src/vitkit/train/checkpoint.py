"""Resumable run state, written atomically, and the run directory's lock.

A run directory holds ``last/`` and ``best/``, each a vitkit checkpoint (vitkit.safetensors +
vitkit.json, loadable with ``vitkit.load``) plus ``trainer.pt``: optimizer, step, epoch, position in
the epoch, EMA weights and every RNG state, saved with ``torch.save`` and read back with
``torch.load(weights_only=True)``.

A checkpoint is first written in full under a temporary name (every file fsynced), then swapped in
with renames: ``last`` -> ``.last.old``, temporary -> ``last``, then ``.last.old`` is removed. A
SIGKILL at any moment leaves either ``last`` or ``.last.old`` complete; ``find_checkpoint`` takes
whichever exists, so the previous checkpoint is always loadable.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import CheckpointError, TrainingError
from ..io import checkpoint as ckpt_io
from ..io.atomic import atomic_path, fsync_dir, process_alive

TRAINER_STATE = "trainer.pt"
LOCK = ".lock"


# ------------------------------------------------------------------------------------- RNG states
def rng_state() -> dict[str, Any]:
    """Every RNG a run draws from, as tensors and plain values (loadable with weights_only=True)."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (np_name, torch.from_numpy(np_keys.astype(np.int64)), int(np_pos), int(np_has_gauss), float(np_gauss)),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---------------------------------------------------------------------------------- save / load
def _contiguous_tensors(obj):
    """``obj`` (dicts, lists and tuples of tensors and plain values) with every tensor contiguous: trainer.pt
    holds ordinary tensors whatever the layout a run trains in (channels-last moments, say)."""
    if torch.is_tensor(obj):
        return obj.contiguous()
    if isinstance(obj, dict):
        return {k: _contiguous_tensors(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_contiguous_tensors(v) for v in obj)
    return obj


def _write_trainer_state(state: dict, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(_contiguous_tensors(state), tmp)


def save_checkpoint(run_dir: Path, name: str, model, trainer_state: dict | None, extra: dict | None = None,
                    weights: dict | None = None) -> Path:
    """Write checkpoint ``run_dir/name`` atomically (see the module docstring); return its path.
    ``weights``: the tensors to write in place of the model's own (see ``io.checkpoint.save``).

    A failure (full disk, permissions) raises CheckpointError and leaves the previous checkpoint intact.
    """
    run_dir = Path(run_dir)
    final = run_dir / name
    old = run_dir / f".{name}.old"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=run_dir))
    try:
        ckpt_io.save(model, tmp, extra=extra, weights=weights)  # each file atomic + fsynced
        if trainer_state is not None:
            _write_trainer_state(trainer_state, tmp / TRAINER_STATE)
        fsync_dir(tmp)
    except (OSError, CheckpointError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        cause = e
        if isinstance(e, OSError):
            cause = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        prev = f"; the previous checkpoint {final} is intact" if final.exists() else ""
        raise CheckpointError(f"could not save checkpoint {final}: {_one_line(cause)}{prev}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # swap: two renames; between them only .old exists, which find_checkpoint accepts
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(run_dir)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _one_line(e) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


def find_checkpoint(run_dir: Path, name: str = "last") -> Path | None:
    """``run_dir/name``, or its previous version if a save was interrupted mid-swap; None if neither."""
    for p in (Path(run_dir) / name, Path(run_dir) / f".{name}.old"):
        if ckpt_io.config_file(p) is not None and (p / TRAINER_STATE).is_file():
            return p
    return None


CHECKPOINT_FILES = frozenset({*ckpt_io.FILE_NAMES, TRAINER_STATE})  # a checkpoint folder's files (old names too)
CHECKPOINT_NAMES = ("last", "best")  # a run's checkpoints, each swapped in whole (its previous folder removed)


def foreign_checkpoint_file(run_dir: Path) -> Path | None:
    """The first entry of a run's checkpoint folders (last/, best/ and their previous versions) that vitkit
    does not write there, or None. Saving a checkpoint replaces such a folder whole, so anything else in
    it would be lost; a checkpoint name that is not a folder is returned itself."""
    for name in CHECKPOINT_NAMES:
        for folder in (Path(run_dir) / name, Path(run_dir) / f".{name}.old"):
            if not os.path.lexists(folder):
                continue
            if folder.is_symlink() or not folder.is_dir():
                return folder
            for entry in sorted(folder.iterdir()):
                if entry.name not in CHECKPOINT_FILES or entry.is_symlink() or not entry.is_file():
                    return entry
    return None


def checkpoint_step(ckpt_dir: Path) -> str:
    """The step a checkpoint of a run was saved at (its vitkit.json's ``train.step``), or '?'."""
    try:
        return str(json.loads(ckpt_io.config_file(ckpt_dir).read_text())["train"]["step"])
    except Exception:  # noqa: BLE001 - unreadable: the message that names it still goes out
        return "?"


def resume_point(run_dir: Path) -> tuple[Path, dict]:
    """The checkpoint ``--resume`` continues from (last/, or its previous version) and its trainer state."""
    ckpt_dir = find_checkpoint(run_dir, "last")
    if ckpt_dir is None:
        raise TrainingError(f"{run_dir}: nothing to resume (no last/ checkpoint with {TRAINER_STATE})")
    return ckpt_dir, load_trainer_state(ckpt_dir)


def load_trainer_state(ckpt_dir: Path) -> dict:
    file = Path(ckpt_dir) / TRAINER_STATE
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing; not a resumable checkpoint") from None
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad file
        raise CheckpointError(f"{file}: not a readable trainer state ({_one_line(e)[:200]})") from None


def cleanup_temp(run_dir: Path) -> None:
    """Remove half-written temporary checkpoints left by a killed run."""
    for p in Path(run_dir).glob(".*.tmp"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def write_json(path: Path, obj) -> None:
    from ..io.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


# ------------------------------------------------------------------------------------------- lock
class RunLock:
    """An exclusive lock on a run directory: a ``.lock`` file holding the owner's host and pid.

    A lock left by a process that no longer exists (same host) is stale and taken over.
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.held = False

    def acquire(self) -> "RunLock":
        me = f"{socket.gethostname()} {os.getpid()}\n"
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self.check(take_stale=True)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(me)
            self.held = True
            return self
        raise TrainingError(f"{self.path}: could not take the run directory's lock")

    def check(self, take_stale: bool = False) -> None:
        """A TrainingError naming the holder when another process holds the lock (one on another host, or
        alive on this one), so that a launcher refuses before it writes anything to the run directory. A
        lock whose process is gone is stale: left for ``acquire`` to replace, or removed (``take_stale``)."""
        if not os.path.lexists(self.path) or self.held:
            return
        host = socket.gethostname()
        owner_host, pid = self._owner()
        if pid is not None and owner_host == host and not process_alive(pid):
            if take_stale:
                self.path.unlink(missing_ok=True)  # stale: its process is gone
            return
        who = f"process {pid} on {owner_host}" if pid is not None else "another process"
        raise TrainingError(
            f"{self.path.parent}: run directory is in use by {who} (lock file {self.path}); "
            "use another --out, or delete the lock if that process is gone"
        )

    def _owner(self) -> tuple[str | None, int | None]:
        try:
            host, pid = self.path.read_text().split()
            return host, int(pid)
        except (OSError, ValueError):
            return None, None

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


__all__ = ["save_checkpoint", "find_checkpoint", "foreign_checkpoint_file", "checkpoint_step", "resume_point",
           "load_trainer_state", "rng_state", "set_rng_state", "cleanup_temp", "write_json", "RunLock",
           "CHECKPOINT_FILES"]
