"""One module per ``vitkit`` subcommand: ``register(parser)`` and ``run(args)``."""

from __future__ import annotations

import json


def _printable(obj):
    if isinstance(obj, str):
        # file names that are not valid UTF-8 carry lone surrogates: show their bytes as \xNN
        return obj.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(obj, dict):
        return {_printable(k): _printable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_printable(v) for v in obj]
    return obj


def json_line(obj) -> str:
    """The one-line JSON result of a command: strict JSON, even for file names that are not UTF-8."""
    return json.dumps(_printable(obj))
