"""Reading one image file into a uint8 tensor, and turning any image into the model's input.

``decode_image`` accepts whatever Pillow reads (JPEG, PNG, BMP, WebP, GIF, TIFF, ...) in any mode:
grey, RGB, RGBA, palette, CMYK, 16-bit. It applies the EXIF orientation, keeps the first frame of an
animation, composites transparent pixels on WHITE (the way a browser shows a transparent image on a
page), and converts to the model's channel count (1 = grey by ITU-R 601 luma, 3 = RGB). Every failure
is a one-line ``DataError`` that starts with the file's path.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import threading
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..core import files
from ..core.errors import DataError
from ..core.files import not_regular
from ..core.strict import to_hw
from .splits import eval_resize

DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own limit (about 9459 x 9459); larger images are refused as
#   possible decompression bombs unless the caller passes a larger max_pixels (or None = no limit)

IMAGE_EXTS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".dib", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm",
     ".pbm", ".pnm", ".tga", ".ico"}
)

_BACKGROUND = 255  # transparent pixels are composited on white (255) — see the module docstring
_PIL_LIMIT_LOCK = threading.RLock()


def show_path(path) -> str:
    """A path (or a name) as one line of printable text that says which file it is: a byte of the name that
    is not UTF-8 becomes \\xNN, a newline, tab or other non-printing character \\n, \\t, \\r or \\uNNNN,
    and, where a backslash is part of a name rather than the separator (not on Windows), a backslash \\\\.
    Reading \\\\ as a backslash and \\xNN as the byte NN gives the name back."""
    text = os.fsdecode(path) if isinstance(path, bytes) else str(path)
    if text.isprintable() and "\\" not in text:  # the common case, as it is
        return text
    return "".join(_SHOWN.get(ch) or _show_char(ch) for ch in text)


_SHOWN = {"\n": "\\n", "\t": "\\t", "\r": "\\r", **({"\\": "\\\\"} if os.sep == "/" else {})}


def _show_char(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, as os.fsdecode (surrogateescape) carries it
        return f"\\x{code - 0xDC00:02x}"
    if ch.isprintable():
        return ch
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _img():
    from PIL import Image

    return Image


@contextlib.contextmanager
def pil_limits(max_pixels: int | None):
    """Make Pillow's decompression-bomb warning an error, and its limit ``max_pixels``.

    Pillow warns above ``Image.MAX_IMAGE_PIXELS`` and raises above twice that. Inside this context the
    warning is an error too. When ``max_pixels`` differs from Pillow's current limit, the global limit is
    swapped under a lock for the duration (so concurrent callers with another limit wait). vitkit checks
    ``max_pixels`` itself on the header, so both paths refuse the same images.
    """
    Image = _img()
    with warnings.catch_warnings():
        # Pillow's remarks on damaged metadata (EXIF, TIFF tags) are not the caller's concern: the image
        # either decodes or raises, and a raise becomes a DataError naming the file
        warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.")
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        if max_pixels == Image.MAX_IMAGE_PIXELS:
            yield
            return
        with _PIL_LIMIT_LOCK:
            old = Image.MAX_IMAGE_PIXELS
            Image.MAX_IMAGE_PIXELS = max_pixels
            try:
                yield
            finally:
                Image.MAX_IMAGE_PIXELS = old


def _sniff(head: bytes) -> str:
    """A short description of what a non-image file seems to be, for error messages."""
    h = head.lstrip()[:64].lower()
    if h.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "an HTML page, not an image"
    if h.startswith(b"<?xml") or h.startswith(b"<svg"):
        return "an XML/SVG file, not a raster image"
    if h.startswith(b"{") or h.startswith(b"["):
        return "a JSON/text file, not an image"
    try:
        head.decode("utf-8")
        return "a text file, not an image"
    except UnicodeDecodeError:
        return "not a recognised image format"


_BOMB = "(possible decompression bomb; raise max_pixels if the file is trusted)"


def _check_pixels(shown: str, w: int, h: int, max_pixels: int | None) -> None:
    """vitkit's own decompression-bomb check on the header's size, before any pixel is decoded."""
    if max_pixels is not None and w * h > max_pixels:
        raise DataError(f"{shown}: {w}x{h} = {w * h} pixels exceeds max_pixels={max_pixels} {_BOMB}")


def bomb_message(shown: str, err: Exception, max_pixels) -> str:
    """One line for Pillow's DecompressionBombError/Warning, worded as vitkit's own size check."""
    import re

    m = re.search(r"\((\d+) pixels\)", str(err))
    size = f"{m.group(1)} pixels" if m else "image size"
    return f"{shown}: {size} exceeds max_pixels={max_pixels} {_BOMB}"


_SMALL_FILE = 1 << 16  # files below 64 KiB are read in one call and parsed from memory
_FORMAT_HINT = {".jpg": "JPEG", ".jpeg": "JPEG", ".jpe": "JPEG", ".jfif": "JPEG", ".png": "PNG"}


def open_pil(f, head: bytes, path: Path, shown: str):
    """Image.open on an open file, trying the format its extension names first (it saves Pillow trying
    its other plugins: ~10% of the time of a small JPEG), then any format. DataError if none reads it."""
    Image = _img()
    from PIL import UnidentifiedImageError

    hint = _FORMAT_HINT.get(path.suffix.lower())
    if hint is not None:
        f.seek(0)
        try:
            return Image.open(f, formats=[hint])
        except UnidentifiedImageError:
            pass
    f.seek(0)
    try:
        return Image.open(f)
    except UnidentifiedImageError:
        raise DataError(f"{shown}: {_sniff(head)}") from None


def open_regular(path):
    """``path`` opened for binary reading when it is a regular file (after following links). A FIFO, socket
    or device is never opened (opening a FIFO waits for a writer, forever): a DataError says what it is; so
    does a path that cannot be opened (missing, a broken link, a directory, ...)."""
    try:
        return files.open_regular(path)
    except OSError as e:
        _check_path(Path(path))  # names the cause (missing, broken link, directory, a FIFO, ...)
        why = e.strerror if isinstance(e, files.NotRegularFile) else f"cannot open ({e.strerror or e})"
        raise DataError(f"{show_path(path)}: {why}") from None


def _check_path(path: Path) -> None:
    if path.is_symlink() and not path.exists():
        raise DataError(f"{show_path(path)}: broken symbolic link (points to {show_path(os.readlink(path))})")
    if not path.exists():
        raise DataError(f"{show_path(path)}: no such file")
    if path.is_dir():
        raise DataError(f"{show_path(path)}: is a directory, not an image file")
    if (what := not_regular(path.stat().st_mode)) is not None:
        raise DataError(f"{show_path(path)}: not a regular file ({what}); not read")


def _to_uint8_array(im, path: Path) -> np.ndarray:
    """A decoded Pillow image in a high-bit-depth mode -> uint8 array (H, W), scaled from its own range."""
    a = np.asarray(im)
    if a.dtype == np.uint8:
        return a
    if np.issubdtype(a.dtype, np.floating):
        a = np.nan_to_num(a.astype(np.float64))
        top = 1.0 if a.max(initial=0) <= 1.0 else 255.0
        return np.clip(a / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
    # 16-bit (or 32-bit int holding 16-bit data): 0..65535 -> 0..255
    a = a.astype(np.int64)
    top = 65535 if a.max(initial=0) > 255 or im.mode.startswith("I;16") else 255
    return np.clip((a * 255 + top // 2) // top, 0, 255).astype(np.uint8)


def _convert(im, channels: int, path: Path):
    """Any Pillow mode -> 'L' or 'RGB' (transparency composited on white)."""
    Image = _img()
    mode = im.mode
    if mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        im = Image.fromarray(_to_uint8_array(im, path), "L")
        mode = "L"
    if mode == "LAB":  # CIE L*a*b* (TIFF): Pillow's plain convert() has no LAB -> RGB; use its colour engine
        try:
            from PIL import ImageCms

            lab2rgb = ImageCms.buildTransform(ImageCms.createProfile("LAB"), ImageCms.createProfile("sRGB"),
                                              "LAB", "RGB")
            im = ImageCms.applyTransform(im, lab2rgb)
        except (ImportError, OSError, ValueError, ImageCms.PyCMSError) as e:
            raise DataError(f"{show_path(path)}: cannot convert a CIE LAB image to RGB ({e})") from None
        mode = "RGB"
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
        mode = im.mode
    if mode in ("1",):
        im = im.convert("L")
        mode = "L"
    if mode == "L" and "transparency" in im.info:
        im = im.convert("LA")
        mode = "LA"
    if mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = im.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (_BACKGROUND,) * 3 + (255,))
        im = Image.alpha_composite(bg, rgba).convert("RGB")
        mode = "RGB"
    if mode == "RGB" and "transparency" in im.info:  # RGB with one transparent colour key
        im = im.convert("RGBA")
        bg = Image.new("RGBA", im.size, (_BACKGROUND,) * 3 + (255,))
        im = Image.alpha_composite(bg, im).convert("RGB")
    want = "L" if channels == 1 else "RGB"
    if im.mode != want:
        im = im.convert(want)
    return im


def _fit_box(w: int, h: int, out_h: int, out_w: int) -> tuple[float, float, float, float]:
    """Source box (left, top, right, bottom) of a centre crop with the output's aspect ratio, within the image:
    the side that binds spans it whole (its width or height computed back from the scale can differ from it in
    the last bit, and Pillow refuses a box a hair outside the image)."""
    scale = max(out_h / h, out_w / w)  # resize so the short side (in aspect terms) covers the output
    cw, ch = min(out_w / scale, w), min(out_h / scale, h)
    left, top = max((w - cw) / 2, 0.0), max((h - ch) / 2, 0.0)
    return left, top, min(left + cw, w), min(top + ch, h)


def short_side_size(h: int, w: int, short_side: int) -> tuple[int, int]:
    """(H, W) of an h x w image whose short side is brought down to ``short_side`` (aspect ratio kept, the
    long side truncated as torchvision's Resize(int) does); an image already that small keeps its size."""
    if min(h, w) <= short_side:
        return h, w
    if h <= w:
        return short_side, max(short_side, int(short_side * w / h))
    return max(short_side, int(short_side * h / w)), short_side


def decode_array(path, channels: int, max_pixels: int | None, size: tuple[int, int] | None = None,
                 short_side: int | None = None) -> np.ndarray:
    """decode_image without the warning context, as a numpy array: the dataset readers enter
    ``pil_limits`` once around many calls.

    Returns uint8 (H, W, C). With ``size`` = (H, W) the image is resized (short side) and centre cropped;
    with ``short_side`` the whole image is kept, shrunk (never enlarged) so that its short side is at
    most ``short_side`` (``short_side_size``).
    """
    Image = _img()
    from PIL import ImageOps

    if isinstance(path, bytes):
        path = os.fsdecode(path)
    path = Path(path)
    shown = show_path(path)
    if channels not in (1, 3):
        raise DataError(f"{shown}: channels must be 1 (grey) or 3 (RGB), got {channels!r}")
    f = open_regular(path)
    try:
        with f:
            head = f.read(_SMALL_FILE)
            if not head:
                raise DataError(f"{shown}: empty file (0 bytes)")
            if len(head) < _SMALL_FILE:  # the whole file: Pillow's many small header reads then cost less
                f = io.BytesIO(head)
            im = open_pil(f, head[:512], path, shown)
            w, h = im.size
            if w < 1 or h < 1:
                raise DataError(f"{shown}: image has no pixels ({w}x{h})")
            _check_pixels(shown, w, h, max_pixels)
            if getattr(im, "n_frames", 1) > 1:
                im.seek(0)  # animations: the first frame
            if short_side is not None:  # the output's size (as displayed, EXIF rotation applied)
                rot = im.getexif().get(0x0112, 1) in (5, 6, 7, 8)
                size = short_side_size(*((w, h) if rot else (h, w)), short_side)
            if size is not None and im.format == "JPEG":
                # let libjpeg decode at 1/2, 1/4 or 1/8 scale when that still covers the output (fast)
                rot = im.getexif().get(0x0112, 1) in (5, 6, 7, 8)
                th, tw = (size[1], size[0]) if rot else size
                im.draft("L" if channels == 1 else "RGB", (tw, th))
            im.load()
            if "exif" in im.info or im.format not in ("JPEG", "BMP", "GIF"):
                im = ImageOps.exif_transpose(im)  # rotation from the EXIF orientation tag
            im = _convert(im, channels, path)
            if size is not None and (im.height, im.width) != tuple(size):
                box = _fit_box(im.width, im.height, size[0], size[1])
                im = im.resize((size[1], size[0]), Image.BICUBIC, box=box)
            a = np.array(im, dtype=np.uint8)  # a writable copy
    except DataError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DataError(bomb_message(shown, e, max_pixels)) from None
    except OSError as e:
        msg = " ".join(str(e).split()) or type(e).__name__
        if "truncated" in msg.lower() or "broken data stream" in msg.lower() or "image file is" in msg.lower():
            raise DataError(f"{shown}: truncated or corrupt image data ({msg})") from None
        raise DataError(f"{shown}: cannot read image ({msg})") from None
    except (ValueError, SyntaxError, EOFError, IndexError, KeyError, TypeError, MemoryError) as e:
        raise DataError(f"{shown}: corrupt image ({type(e).__name__}: {' '.join(str(e).split())})") from None
    if a.ndim == 2:
        a = a[:, :, None]
    return a


def header_size(path: Path, max_pixels: int | None) -> tuple[int, int]:
    """(H, W) of an image file after EXIF rotation, reading the header only; raises DataError."""
    Image = _img()
    shown = show_path(path)
    try:
        with open_regular(path) as f:
            head = f.read(512)
            if not head:
                raise DataError(f"{shown}: empty file (0 bytes)")
            im = open_pil(f, head, path, shown)
            w, h = im.size
            _check_pixels(shown, w, h, max_pixels)
            if im.format in ("JPEG", "TIFF", "WEBP", "PNG") and im.getexif().get(0x0112, 1) in (5, 6, 7, 8):
                w, h = h, w
            return h, w
    except DataError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DataError(bomb_message(shown, e, max_pixels)) from None
    except Exception as e:  # noqa: BLE001 - any decoder failure is a bad file
        raise DataError(f"{shown}: cannot read image header ({type(e).__name__}: {' '.join(str(e).split())})") from None


def decode_image(path, channels: int, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> torch.Tensor:
    """Read one image file as uint8 (C, H, W) with C = ``channels`` (1 grey, 3 RGB).

    RGBA / palette transparency is composited on white, CMYK and 16-bit images are converted, the EXIF
    orientation is applied and animations give their first frame. Images above ``max_pixels`` pixels
    are refused (decompression bombs; None = no limit). Raises DataError("<path>: <why>").
    """
    with pil_limits(max_pixels):
        a = decode_array(path, channels, max_pixels)
    return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTS


def list_images(inputs: list[str], recursive: bool = True) -> list[Path]:
    """Files, folders and glob patterns -> image files (by extension), sorted, without duplicates.

    A folder gives the image files in it (and below it when ``recursive``); hidden files and folders
    (names starting with '.') are left out. An input that matches no image file is a DataError.
    """
    if isinstance(inputs, (str, os.PathLike, bytes)):
        inputs = [inputs]
    out: list[Path] = []
    seen: set[Path] = set()

    def add(p: Path):
        if p not in seen:
            seen.add(p)
            out.append(p)

    for raw in inputs:
        item = os.fsdecode(raw) if isinstance(raw, bytes) else str(raw)
        found: list[Path] = []
        p = Path(item)
        if p.is_dir():
            found = walk_images(p, recursive)
            if not found:
                raise DataError(f"{show_path(p)}: folder has no image files ({_ext_hint()})")
        elif p.is_file() or p.is_symlink():
            found = [p]  # an explicit file is taken whatever its extension (decode_image will judge it)
        elif os.path.exists(p):  # a FIFO, socket or device: never opened
            _check_path(p)
        elif glob.has_magic(item):
            matches = _glob(item, recursive)
            for m in matches:
                mp = Path(m)
                if mp.is_dir():
                    found.extend(walk_images(mp, recursive))
                elif is_image_name(mp.name):
                    found.append(mp)
            if not found:
                raise DataError(f"{show_path(item)}: pattern matches no image files")
        else:
            raise DataError(f"{show_path(item)}: no such file or folder")
        for f in found:
            add(f)
    return out


def _glob(pattern: str, recursive: bool) -> list[Path]:
    """Expand a glob pattern, sorted; '**' never follows a symbolic link back into a folder already
    searched (glob.glob does, so a link to a parent lists files many times or never ends)."""
    parts = Path(pattern).parts
    i = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    base = Path(*parts[:i]) if i else Path(".")
    rest = str(Path(*parts[i:]))
    if not recursive:
        rest = rest.replace("**", "*")
    try:
        hits = base.glob(rest)
        # hidden names are left out, as glob.glob and folder walks do
        return sorted(h for h in hits if not any(q.startswith(".") for q in h.relative_to(base).parts))
    except (OSError, ValueError):
        return []


def _ext_hint() -> str:
    return "looked for " + ", ".join(sorted({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif"}))


def walk_images(root: Path, recursive: bool = True) -> list[Path]:
    """Image files under ``root`` in a stable sorted order (a folder's files, then its subfolders' in turn);
    hidden entries skipped. The tree is walked without recursion, so that no depth exhausts the stack."""
    if not recursive:
        return [Path(e.path) for e in sorted(os.scandir(root), key=lambda e: e.name)
                if not e.name.startswith(".") and is_image_name(e.name) and not e.is_dir()]
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()  # folders searched, by (device, inode)
    stack = [os.fspath(root)]  # folders to search, the next one last
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:  # a symbolic link back to a folder already searched (a cycle would
            continue  # list its files again and again, exponentially with two links)
        seen.add((st.st_dev, st.st_ino))
        subfolders = []
        for entry in _sorted_entries(folder):
            if entry.name.startswith("."):
                continue
            if _is_dir(entry):
                subfolders.append(entry.path)
            elif is_image_name(entry.name):
                found.append(Path(entry.path))
        stack.extend(reversed(subfolders))
    return found


def _sorted_entries(folder) -> list[os.DirEntry]:
    """The entries of ``folder`` by name; none where it cannot be read."""
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _is_dir(entry: os.DirEntry) -> bool:
    """Whether ``entry`` is a folder (following a symbolic link), as os.walk tells them."""
    try:
        return entry.is_dir()
    except OSError:
        return False


# --------------------------------------------------------------------------------------------------
# tensor side: resize + centre crop + normalise
def _interp_mode(name: str) -> str:
    return {"nearest": "nearest-exact"}.get(name, name)


def resize_center_crop(x: torch.Tensor, img_size: tuple[int, int], crop_pct: float = 1.0,
                       interpolation: str = "bicubic", resize: str = "shorter_then_crop") -> torch.Tensor:
    """float (B, C, h, w) in [0, 255] -> (B, C, H, W): resize, keeping the aspect ratio, so that the image
    covers floor((H, W) / crop_pct), then take the centre (H, W). Antialiased when shrinking; clamped to
    [0, 255]. The sizes and offsets are those of timm's / torchvision's eval transform (Resize(int) +
    CenterCrop): the short side becomes floor(size / crop_pct), the long side int(long * scale), and the
    crop starts at round((resized - size) / 2). ``resize='squash'`` (Preprocess.resize) brings each side
    to floor(size / crop_pct) instead, the aspect ratio not kept (timm's crop_mode 'squash'; at crop_pct 1,
    HF's ViTImageProcessor)."""
    out_h, out_w = img_size
    h, w = x.shape[-2:]
    th, tw = eval_resize(img_size, crop_pct)
    if resize == "squash":
        rh, rw = th, tw
    elif th * w >= tw * h:  # the height binds: it becomes th exactly
        rh, rw = th, max(tw, int(w * th / h))
    else:
        rh, rw = max(th, int(h * tw / w)), tw
    if (rh, rw) != (h, w):
        mode = _interp_mode(interpolation)
        kw = {"antialias": True, "align_corners": False} if mode in ("bilinear", "bicubic") else {}
        x = F.interpolate(x, size=(rh, rw), mode=mode, **kw)
        if mode == "bicubic":
            x = x.clamp(0, 255)
    top, left = int(round((rh - out_h) / 2.0)), int(round((rw - out_w) / 2.0))
    return x[..., top : top + out_h, left : left + out_w]


def norm_consts(pre, channels: int, device, dtype=torch.float32):
    """The model's mean and std for ``channels``, scaled to pixel values 0..255, shaped (C, 1, 1)."""
    p = pre.for_channels(channels)
    mean = torch.tensor(p.mean, dtype=dtype, device=device).view(-1, 1, 1) * 255.0
    std = torch.tensor(p.std, dtype=dtype, device=device).view(-1, 1, 1) * 255.0
    return mean, std


def check_uint8(img: torch.Tensor, ndim: int, what: str) -> None:
    """ShapeError (naming ``what``) unless ``img`` is a uint8 tensor of ``ndim`` dimensions."""
    from ..core.errors import ShapeError

    if not isinstance(img, torch.Tensor) or img.ndim != ndim:
        shape = tuple(img.shape) if isinstance(img, torch.Tensor) else type(img).__name__
        want = "(C, H, W)" if ndim == 3 else "(B, C, H, W)"
        raise ShapeError(f"{what}: expected a uint8 tensor {want}, got shape {shape}")
    if img.dtype != torch.uint8:
        raise ShapeError(f"{what}: expected dtype uint8 (0..255), got {img.dtype}")


def to_model_input(img: torch.Tensor, img_size: tuple[int, int], pre) -> torch.Tensor:
    """uint8 (C, H, W) of any size -> float (C, img_h, img_w), the model's own preprocessing: resize (the
    short side, or each side: pre.resize) to size / pre.crop_pct with pre.interpolation, centre crop, scale
    to [0, 1], (x - mean) / std."""
    check_uint8(img, 3, "to_model_input")
    img_size = to_hw(img_size, "img_size", DataError)
    x = resize_center_crop(img[None].float(), img_size, pre.crop_pct, pre.interpolation, pre.resize)
    mean, std = norm_consts(pre, img.shape[0], img.device)
    return ((x - mean) / std)[0]


__all__ = ["DEFAULT_MAX_PIXELS", "IMAGE_EXTS", "decode_image", "decode_array", "header_size", "short_side_size",
           "list_images", "walk_images", "is_image_name", "to_model_input", "resize_center_crop", "norm_consts", "check_uint8",
           "show_path", "pil_limits"]
