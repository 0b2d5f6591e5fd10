"""One module per ``vitkit`` subcommand: ``register(parser)`` and ``run(args)``."""
