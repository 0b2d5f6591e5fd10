"""The ``vitkit`` command: a thin layer that parses arguments and calls the library.

Each subcommand lives in a module of ``vitkit.cli.commands`` that defines ``register(parser)`` (adds its
arguments) and ``run(args) -> int``. Modules are imported only when their subcommand runs, so
``vitkit --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import importlib.util
import os
import signal
import sys
import threading
import warnings

from ..core.errors import VitkitError, VitkitWarning

# name -> (module under vitkit.cli.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("list_models", "list the named models with their parameter counts"),
    "demo": ("demo", "a small model shipped with vitkit reads a few built-in test digits"),
    "train": ("train", "train a ViT on a folder of images, MNIST, CIFAR or the built-in demo set"),
    "finetune": ("finetune", "fine-tune a checkpoint on new data, at a new resolution"),
    "eval": ("evaluate", "evaluate a checkpoint: loss, top-1/top-5, per-class metrics, confusion matrix"),
    "predict": ("predict", "top-k predictions for images, folders or globs"),
    "explain": ("explain", "attention rollout, class-token attention and class relevance over an image"),
    "export": ("export", "export to ONNX, TorchScript or an ExportedProgram, checked against eager"),
    "convert": ("convert", "convert weights from/to timm, Hugging Face or JAX checkpoints"),
    "bench": ("bench", "measure throughput, latency, memory, FLOPs and MFU"),
}


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one usage line and one error line, exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _load(module: str):
    return importlib.import_module(f"vitkit.cli.commands.{module}")


def available_commands() -> list[str]:
    """Subcommands whose module is part of this installation."""
    return [n for n, (m, _) in COMMANDS.items() if importlib.util.find_spec(f"vitkit.cli.commands.{m}") is not None]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand; only the arguments of subcommand ``only`` are registered (none for the
    top-level help), so that `vitkit --help` imports neither torch nor the command modules."""
    parser = _Parser(prog="vitkit", description="Vision Transformers: train, convert, evaluate, explain, export.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.subcommands = {}
    for name in available_commands():
        module, help_ = COMMANDS[name]
        p = sub.add_parser(name, help=help_, description=help_)
        parser.subcommands[name] = p
        if only == name:
            _load(module).register(p)
    return parser


def unrecognized(extra: list[str], argv: list[str], parser: argparse.ArgumentParser, keys: list[str]) -> str:
    """argparse's message for arguments no option takes, with a hint for the first unknown flag: the
    closest flag of ``parser`` and, where one of the config's dotted ``keys`` is closer to its name than
    any flag, that key as a --set override (with the value that followed the flag)."""
    message = f"unrecognized arguments: {' '.join(extra)}"
    flag = next((a for a in extra if a.startswith("--")), None)
    if flag is None:
        return message
    name, eq, value = flag.partition("=")
    if not eq:  # the value, as the next argument (which parses as a stray argument of its own)
        after = argv[argv.index(flag) + 1:argv.index(flag) + 2]
        value = after[0] if after and not after[0].startswith("-") else "VALUE"
    from .commands.timm_flags import timm_hint

    if (hint := timm_hint(name)) is not None:  # a timm flag: its vitkit form, never a look-alike
        return f"{message}; {hint}"
    flags = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    hints = difflib.get_close_matches(name, flags, n=1, cutoff=0.75)
    key = _closest_key(name[2:].replace("-", "_"), keys)
    if key and not (hints and hints[0][2:].replace("-", "_") == key.rsplit(".", 1)[-1]):
        hints.append(f"--set {key}={value}")
    return message + (f"; did you mean {' or '.join(hints)}?" if hints else "")


def _closest_key(name: str, keys: list[str]) -> str | None:
    """The dotted key whose last part (or whole, dots as underscores) is closest to ``name``; the
    shortest key where several end alike (img_size, not data.img_size)."""
    forms: dict[str, str] = {}
    for key in sorted(keys, key=lambda k: (k.count("."), k)):
        forms.setdefault(key.rsplit(".", 1)[-1], key)
        forms.setdefault(key.replace(".", "_"), key)
    close = difflib.get_close_matches(name, list(forms), n=1, cutoff=0.75)
    return forms[close[0]] if close else None


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; errors (exit 2) print the usage of the subcommand at fault, not the top level's."""
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=first if first in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:
        at_fault = parser.subcommands.get(args.command, parser)
        keys = getattr(args, "config_keys", None)  # commands with a run config: train, finetune
        at_fault.error(unrecognized(extra, argv, at_fault, keys() if keys else []))
    args._parser = parser
    args.argv = list(argv)  # the command line as given, for commands that start copies of themselves
    return args


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """vitkit's own warnings as one line, ``vitkit: warning: ...``; any other warning as Python shows it."""
    if issubclass(category, VitkitWarning):
        print(f"vitkit: warning: {message}", file=sys.stderr)
    else:
        _default(message, category, filename, lineno, file, line)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is (also inside a blocking system call), so that it ends at once,
    as Ctrl-C ends it; ``vitkit train`` takes both signals over to save its run first."""


@contextlib.contextmanager
def _sigterm_ends_the_command():
    """SIGTERM raises Terminated while a command runs (in the main thread, where handlers are set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise Terminated

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Only the chosen subcommand's arguments are registered: importing every command module costs time.
    args = parse_args(argv)
    parser = args._parser
    if args.version:
        from .. import __version__

        print(__version__)
        return 0
    if args.command is None:
        parser.print_help()
        return 0
    try:
        with _sigterm_ends_the_command(), warnings.catch_warnings():
            warnings.showwarning = _show_warning
            command = _load(COMMANDS[args.command][0])
            from ..core.hardware import keep_freed_memory

            keep_freed_memory()  # the process is the command's: its allocator keeps freed memory for reuse
            return int(command.run(args) or 0)
    except VitkitError as e:
        print(f"vitkit: error: {e}", file=sys.stderr)
        return 1
    except Terminated:
        print("vitkit: interrupted (SIGTERM)", file=sys.stderr)
        return _end_by_sigterm()
    except KeyboardInterrupt:
        print("vitkit: interrupted", file=sys.stderr)
        return 130


def _end_by_sigterm() -> int:
    """End this process by SIGTERM's own default action, so that its parent (a shell: exit status 143; a
    launcher) sees a process stopped by the signal; 143 where that cannot be done."""
    if threading.current_thread() is threading.main_thread() and sys.platform != "win32":
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    return 128 + signal.SIGTERM


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
