"""The ``vitkit`` command: ``main`` parses (cli/main.py); each module of ``commands/`` is one subcommand."""


def main(argv=None) -> int:
    from .main import main as run

    return run(argv)
