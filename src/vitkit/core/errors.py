"""Errors that vitkit raises on bad input.

Every error is a single line that names the file, field, argument or shape at fault. The CLI prints
``vitkit: error: <message>`` and exits with status 1 for these; it never shows a traceback for them.
"""


class VitkitError(Exception):
    """Base class of every error vitkit raises for bad input (files, configs, arguments)."""


class ConfigError(VitkitError, ValueError):
    """A configuration field is unknown, ill-typed or inconsistent with another field."""


class ShapeError(VitkitError, ValueError):
    """A tensor has the wrong rank, channel count, dtype or spatial size for the model."""


class CheckpointError(VitkitError, ValueError):
    """A checkpoint (weights or config) is missing, unreadable, unsafe or does not fit the model."""


class DataError(VitkitError, ValueError):
    """A dataset or image is missing, unreadable, empty or malformed."""


class TrainingError(VitkitError, RuntimeError):
    """Training cannot go on (a non-finite loss, a run directory in use, ...)."""


class ExportError(VitkitError, RuntimeError):
    """An export failed, or the exported model (or ONNX Runtime running it) does not match the eager one."""


class VitkitWarning(UserWarning):
    """Something the user should know that did not stop the work (e.g. a fall back to a slower path); one
    line, which the command line prints as ``vitkit: warning: <message>``."""
