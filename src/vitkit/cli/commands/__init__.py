"""One module per ``vitkit`` subcommand: ``register(parser)`` and ``run(args)``."""

from __future__ import annotations

import json
import math


def printable(text: str) -> str:
    """``text`` (a message) with the bytes that are not UTF-8 of the file names in it, carried as lone
    surrogates, shown as \\xNN: printing them raw fails. (A file name itself: data.images.show_path.)"""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _printable(obj):
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {_printable(k): _printable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_printable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no NaN or infinity: a strict parser refuses Python's bare NaN
    return obj


def json_line(obj) -> str:
    """The one-line JSON result of a command: strict JSON, even for file names that are not UTF-8 and
    numbers that are not finite (null)."""
    return json.dumps(_printable(obj), allow_nan=False)


def pixels(text: str) -> int:
    """argparse type of --max-pixels: a whole number >= 0 (0 = no limit)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of pixels, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def max_pixels(args) -> int | None:
    """The decompression-bomb limit a command asked for: Pillow's by default, None for 0."""
    from ...data.images import DEFAULT_MAX_PIXELS

    return DEFAULT_MAX_PIXELS if args.max_pixels is None else (args.max_pixels or None)


def image_size(text: str) -> tuple[int, int]:
    """argparse type of --img-size: 'N' -> (N, N); 'HxW' or 'H,W' -> (H, W), positive (``strict.to_hw``)."""
    import argparse

    from ...core.errors import ConfigError
    from ...core.strict import to_hw

    try:
        return to_hw(text, "--img-size")
    except ConfigError as e:  # argparse puts "argument --img-size: " before the reason itself
        raise argparse.ArgumentTypeError(str(e).removeprefix("--img-size: ")) from None


def seconds(text: str) -> float:
    """argparse type of --progress-every: a number of seconds >= 0 (0 = no progress lines)."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_precision_flag(p) -> None:
    """--precision and --engine of the inference tools (predict, eval): how the model runs (vitkit.infer.fastpath)."""
    p.add_argument("--precision", choices=("auto", "fp32", "bf16", "int8"), default="auto",
                   help="auto (default: bf16 where the hardware and the model's size make it pay, else fp32), "
                        "fp32, bf16, or int8 (dynamic quantization of the Linear layers; CPU only, opt-in)")
    p.add_argument("--engine", choices=("auto", "torch", "onnxruntime"), default="auto",
                   help="auto (default: ONNX Runtime for fp32 on a CPU where its measured gain repays exporting "
                        "the model, else torch), torch, or onnxruntime (fp32 on a CPU; needs vitkit[onnx])")


def add_progress_flags(p) -> None:
    """--progress-every and --quiet, for the commands that work through many images."""
    p.add_argument("--progress-every", type=seconds, default=30.0, metavar="SECONDS",
                   help="where stderr is not a terminal (a log), a progress line every SECONDS (0: none; default 30)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")


def cli_progress(quiet: bool, every: float):
    """What a command shows on stderr: a bar on a terminal, a line every ``every`` seconds in a log (0:
    none), nothing with --quiet. Progress goes to stderr, so that stdout holds the results alone."""
    import sys

    from ...core.progress import make_progress

    return make_progress(sys.stderr, tty=sys.stderr.isatty(), every=every, quiet=quiet)
