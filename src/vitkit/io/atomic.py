"""Atomic file writes: a temporary file in the same folder, fsync, then rename over the target.

A reader (or a crash at any moment) sees either the old file or the new one, never a partial one.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import tempfile
from pathlib import Path

from ..core.errors import CheckpointError


def fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk (after a rename into it), where the platform allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ensure_dir(path: str | os.PathLike) -> Path:
    """``mkdir -p path``; a file in the way or a missing permission is one line naming the folder."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else (e.strerror or str(e))
        raise CheckpointError(f"{path}: cannot create the folder ({why})") from None
    return path


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):  # not a pid at all
        return False
    return True


def private_dir(target: Path) -> Path:
    """A new hidden folder beside ``target`` to write it in (``.NAME.PID.XXXXXXXX.tmp``), for a writer that
    renames its result over ``target`` and removes the folder after. Such folders left by a process that
    was killed (its PID is gone) are removed first. A folder that cannot be written in is a one-line
    CheckpointError naming ``target``."""
    parent, prefix = target.parent, f".{target.name}."
    for old in parent.glob(f"{glob.escape(prefix)}*.tmp"):
        pid = old.name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and old.is_dir() and not old.is_symlink() and not process_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    try:
        return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", suffix=".tmp", dir=parent))
    except OSError as e:
        why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        raise CheckpointError(f"{target}: cannot write in {parent} ({why})") from None


@contextlib.contextmanager
def removed_if_left_empty(folder: str | os.PathLike):
    """Run the block; when it fails, ``folder`` did not exist before it and is empty after, remove it, so
    that a failed write (a full disk, say) leaves no empty folder where its output was to go."""
    existed = os.path.lexists(folder)
    done = False
    try:
        yield
        done = True
    finally:
        if not existed and not done:
            with contextlib.suppress(OSError):
                Path(folder).rmdir()  # only when empty


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike):
    """Yield a temporary path next to ``target``; on success it is fsynced and renamed over ``target``.

    On any error the temporary file is removed and ``target`` is left as it was. A full disk or a
    permission problem becomes a CheckpointError naming the target.
    """
    target = Path(target)
    ensure_dir(target.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        raise CheckpointError(f"{target}: could not write ({why})") from None
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual permissions
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        why = "no space left on device" if e.errno == errno.ENOSPC else (e.strerror or str(e))
        raise CheckpointError(f"{target}: could not write ({why}); the previous file is unchanged") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> None:
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))
