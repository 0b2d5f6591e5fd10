"""A cache of decoded image folders, so that a second run on the same folder skips the decoding.

Decoding a folder of small JPEGs costs a fraction of a millisecond an image, which for 50,000 images is
tens of seconds before every run. ``DecodeCache(folder)`` keeps what decoding a list of files gave (the
pixels of each image, or the one-line reason it could not be read) in one file per list of files and
decode settings, under ``folder/decoded/``; the data folder itself is never written to (it may be
read-only, or shared).

The key of an entry is a hash of the decode settings (channels, size or short side, the pixel limit,
Pillow's version, this format's version) and, for every file, its name relative to the dataset's root,
its size and its modification time: a file touched, added, removed or renamed, or another setting, is
another key, and is decoded afresh. Entries are written atomically (``io.atomic``), so processes that
race each write a whole file and the last rename wins; a file that is truncated or corrupt (its checksum
does not match) is ignored and written again. Entries for an older state of the same folder and settings
are removed when a new one is written. Processes that open the same folder at once (two runs on one
machine) decode it once: the first to miss holds a lock on the entry (``decoding``) while it decodes and
stores, and the others, waiting on it, then read what it stored, instead of each decoding the whole folder
on the same cores. The processes of one distributed run take turns in a set order instead
(``train.loop.open_shared``: the one that shows progress decodes).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from ..core.errors import VitkitError
from ..core.files import open_regular
from ..core.strict import parse_json
from ..io.atomic import atomic_path

VERSION = 1  # of the entry format and of what decoding gives; a change makes every old entry a miss
USER_CACHE = "~/.cache/vitkit"  # the cache folder of `vitkit train` and `vitkit.fit` by default (the command
#   line takes $XDG_CACHE_HOME/vitkit where that variable is set)


def user_cache() -> str:
    """``USER_CACHE`` with the user's home folder in place of ~."""
    return os.path.expanduser(USER_CACHE)


class CacheMiss(Exception):
    """An opening told to read the cache only (``open_dataset(cached_only=True)``) found a part it would have
    to decode: the message names the folder."""


class DecodeCache:
    """Decoded image lists under ``folder``/decoded/: ``key`` names one, ``load`` reads it back (None on a
    miss or a damaged file), ``store`` writes it (a note on failure: a cache never fails a run)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder).expanduser() / "decoded"

    def __repr__(self) -> str:
        return f"DecodeCache({self.folder})"

    def key(self, root: Path, paths: list[Path], settings: dict, part: str = "") -> tuple[str, str]:
        """(entry name, key) of decoding ``paths`` (under ``root``) with ``settings``. The name's first part
        depends on the folder, its ``part`` (train, val, test) and the settings only, so that a newer entry
        replaces the older ones of the same part."""
        import PIL

        settings = {**settings, "version": VERSION, "pillow": PIL.__version__}
        head = json.dumps(settings, sort_keys=True)
        h = hashlib.sha256(head.encode())
        prefix = os.path.join(os.fspath(root), "")
        for p in paths:
            p = os.fspath(p)
            try:
                st = os.stat(p)
                size, mtime = st.st_size, st.st_mtime_ns
            except OSError:
                size, mtime = -1, -1  # decoding names the problem; the key just differs from a readable file's
            name = p[len(prefix):] if p.startswith(prefix) else os.path.relpath(p, root)  # the files lie under root
            h.update(f"\0{name}\0{size}\0{mtime}".encode("utf-8", "surrogateescape"))
        where = hashlib.sha256(f"{Path(root).resolve()}\0{part}\0{head}".encode("utf-8", "surrogateescape")).hexdigest()
        return f"{where[:16]}-{h.hexdigest()[:32]}", h.hexdigest()

    def _file(self, name: str) -> Path:
        return self.folder / f"{name}.npz"

    def load(self, name: str, key: str, count: int, fits: Callable[[int, int, int], bool] | None = None) -> list | None:
        """The results stored under ``name`` ([(uint8 (h, w, C) array, None) | (None, reason)]), or None
        when there is no entry or it is damaged, stale, of another length, or not what ``store`` writes:
        its members' declared sizes, dtypes and shapes are checked before they are read, and each image's
        (h, w, C) must satisfy ``fits`` (the decode settings' sizes), so that an entry of the right key
        and checksum but a wrong structure is a miss too, not an error later."""
        try:
            with open_regular(self._file(name)) as f, zipfile.ZipFile(f) as z:  # a FIFO is never waited on
                meta = parse_json(_member(z, "meta", np.uint8, None, META_BYTES + ENTRY_BYTES * count).tobytes())
                if not isinstance(meta, dict) or meta.get("key") != key or not isinstance(meta.get("errors"), dict):
                    return None
                shapes = _member(z, "shapes", np.int64, (count, 3), 24 * count)
                if not _shapes_ok(shapes, fits):
                    return None
                pixels = _member(z, "pixels", np.uint8, (int(np.prod(shapes, 1).clip(0).sum()),), None)
        except Exception:  # noqa: BLE001 - missing, truncated, a folder, or not an entry at all: a miss
            return None
        if meta.get("crc") != zlib.crc32(pixels):
            return None
        errors = meta["errors"]
        out, at = [], 0
        for i, (h, w, c) in enumerate(shapes.tolist()):
            if h < 0:
                out.append((None, str(errors.get(str(i), "unreadable"))))
                continue
            n = h * w * c
            out.append((pixels[at : at + n].reshape(h, w, c), None))
            at += n
        return out

    @contextlib.contextmanager
    def decoding(self, name: str, waiting: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        """Hold the lock of ``name``'s folder and settings (an exclusive ``flock`` on ``<prefix>.lock`` beside
        the entries) while this process decodes what it missed, so that another process opening the same
        folder waits and then reads the entry (``load`` again inside) rather than decoding it too; a process
        that has to wait does so inside ``waiting()`` (a progress task saying so). Where the lock cannot be
        had (no ``fcntl``, a folder that cannot be written, a file system without locks), no wait: each
        process decodes, as without a lock."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX
            yield
            return
        fd = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / f"{name.split('-', 1)[0]}.lock",
                         os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _NOFOLLOW, 0o644)  # a FIFO there: never waited on
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                with waiting():
                    fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # the lock goes with the descriptor (and with the process, should it die)

    def store(self, name: str, key: str, results: list) -> str | None:
        """Write ``results`` (as ``load`` returns them) under ``name`` and remove older entries of the same
        folder and settings; a note saying why not, if it could not be written."""
        shapes = np.array([v.shape if v is not None else (-1, -1, -1) for v, _ in results], dtype=np.int64)
        shapes = shapes.reshape(-1, 3)
        pixels = np.concatenate([v.reshape(-1) for v, _ in results if v is not None] or [np.empty(0, np.uint8)])
        errors = {str(i): err for i, (v, err) in enumerate(results) if v is None}
        meta = json.dumps({"key": key, "crc": zlib.crc32(pixels), "errors": errors}).encode("utf-8")
        target = self._file(name)
        try:
            with atomic_path(target) as tmp, open(tmp, "wb") as f:
                np.savez(f, meta=np.frombuffer(meta, np.uint8), shapes=shapes, pixels=pixels)
        except (VitkitError, OSError) as e:
            return f"decoded images not cached ({e})"
        prefix = name.split("-", 1)[0]
        for old in self.folder.glob(f"{prefix}-*.npz"):
            if old != target and (old.is_symlink() or not old.is_dir()):  # a folder of that name is left alone
                with contextlib.suppress(OSError):
                    old.unlink()
        return None


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a lock file that is a link is not followed (an error: no lock)
META_BYTES = 1 << 16  # the most an entry's meta member may declare: its key and checksum, and
ENTRY_BYTES = 4096  # at most this much for each file's reason it could not be read


def _member(z: zipfile.ZipFile, name: str, dtype, shape: tuple | None, limit: int | None) -> np.ndarray:
    """Member ``name`` of an entry: a C-ordered 1-D or ``shape`` array of ``dtype``, stored uncompressed (as
    ``store`` writes it), its header checked before its data is read, its declared size that of the array
    its header describes and at most ``limit`` bytes; else ValueError. Reading a member thus costs no more
    than the bytes it takes in the file."""
    info = z.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:  # store writes members as they are: reading one costs its size
        raise ValueError(f"{name}: compressed")
    with z.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{name}: npy version {version}")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        got_shape, fortran, got_dtype = read_header(f)
        if got_dtype != np.dtype(dtype) or fortran or len(got_shape) != (1 if shape is None else len(shape)):
            raise ValueError(f"{name}: {got_dtype} {got_shape}")
        if shape is not None and tuple(got_shape) != shape:
            raise ValueError(f"{name}: shape {got_shape}, expected {shape}")
        nbytes = int(np.prod(got_shape)) * np.dtype(dtype).itemsize
        if (limit is not None and nbytes > limit) or info.file_size != f.tell() + nbytes:
            raise ValueError(f"{name}: declares {info.file_size} bytes")
        out = np.empty(got_shape, dtype)  # writable, as np.load gives it
        if f.readinto(memoryview(out.reshape(-1)).cast("B")) != nbytes:
            raise ValueError(f"{name}: truncated")
    return out


def _shapes_ok(shapes: np.ndarray, fits: Callable[[int, int, int], bool] | None) -> bool:
    """Each row an image's (h, w, C), each positive (and as ``fits`` wants), or (-1, -1, -1): unreadable."""
    for h, w, c in shapes.tolist():
        if (h, w, c) == (-1, -1, -1):
            continue
        if min(h, w, c) < 1 or (fits is not None and not fits(h, w, c)):
            return False
    return True


def check_outside(cache_dir: str | os.PathLike, data_root: str | os.PathLike) -> None:
    """A DataError unless ``cache_dir`` lies outside the data folder (which may be read-only)."""
    from ..core.errors import DataError

    cache, root = Path(cache_dir).expanduser().resolve(), Path(data_root).expanduser().resolve()
    if cache == root or root in cache.parents:
        raise DataError(f"cache_dir: {cache_dir} is inside the data folder {data_root}; put the cache elsewhere "
                        "(the data folder may be read-only)")


__all__ = ["DecodeCache", "check_outside", "VERSION", "USER_CACHE", "user_cache"]
