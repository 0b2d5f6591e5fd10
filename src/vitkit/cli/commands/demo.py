"""`vitkit demo`: a small model shipped with vitkit, trained on the built-in digits, reads a few test digits."""

from __future__ import annotations


def register(p):
    p.add_argument("-n", type=int, default=3, metavar="N", help="how many test digits to show (default: 3)")
    p.add_argument("--start", type=int, default=0, metavar="I",
                   help="the first of the 2,000 built-in test digits to show (default: 0)")


def run(args) -> int:
    from ...core.errors import ConfigError
    from ...tools.demo import demo

    if not 1 <= args.n <= 100:
        raise ConfigError(f"-n {args.n}: show between 1 and 100 digits")
    if not 0 <= args.start < 2000:
        raise ConfigError(f"--start {args.start}: the built-in test digits are numbered 0 to 1999")
    print("\n".join(demo(args.n, args.start)))
    return 0
