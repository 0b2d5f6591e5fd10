"""Opening files that may not be what their names say: only a regular file is read.

Opening a FIFO for reading waits for a writer, in a system call no signal handler of Python's runs
during, so a FIFO where a config file or a cache entry should be would hang the command for good. A
file is looked at with ``os.stat`` first (a device is never opened), then opened without blocking and
looked at again through its descriptor (the name may have been replaced in between), and only then read.
"""

from __future__ import annotations

import errno
import os
import stat

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def not_regular(mode: int) -> str | None:
    """What a file of ``mode`` (an os.stat st_mode) is when it is not a regular file ('a FIFO', ...), or None."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


class NotRegularFile(OSError):
    """A name that is not a regular file (a FIFO, socket, device); ``strerror`` says what it is."""


def open_regular(path: str | os.PathLike):
    """``path`` opened for binary reading when it is a regular file (after following links); never blocks.
    A directory is IsADirectoryError, a FIFO, socket or device NotRegularFile (an OSError whose strerror is
    'not a regular file (a FIFO)'); a missing file is the usual FileNotFoundError."""
    _check_mode(os.stat(path).st_mode, path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        _check_mode(os.fstat(fd).st_mode, path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_mode(mode: int, path) -> None:
    what = not_regular(mode)
    if what == "a directory":
        raise IsADirectoryError(errno.EISDIR, "is a directory", os.fspath(path))
    if what is not None:
        raise NotRegularFile(errno.EINVAL, f"not a regular file ({what})", os.fspath(path))


def fd_path(f, path: str | os.PathLike) -> str:
    """A name that opens the very file ``f`` (opened from ``path``) again, for a reader that takes names
    only: /proc/self/fd/N where the system has it (the name ``path`` may meanwhile be another file),
    else ``path``."""
    own = f"/proc/self/fd/{f.fileno()}"
    return own if os.path.exists(own) else os.fspath(path)


__all__ = ["open_regular", "not_regular", "fd_path", "NotRegularFile"]
