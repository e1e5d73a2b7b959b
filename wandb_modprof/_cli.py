"""Command line: `wandb-modprof demo` / `python -m wandb_modprof demo`."""

from __future__ import annotations

import argparse
import sys

from ._errors import ModProfError


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wandb-modprof", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="train a small GPT-2 on CPU under watch() and print the profile"
    )
    demo.add_argument("--steps", type=_positive, default=12, help="training steps (default 12)")
    demo.add_argument(
        "--log-freq", type=_positive, default=4, help="sample every Nth step (default 4)"
    )
    demo.add_argument("--top", type=_positive, default=8, help="modules per table (default 8)")
    demo.add_argument(
        "--save",
        default="out/demo.modprof.json",
        help="where to write the profile file (default out/demo.modprof.json)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from ._demo import run_demo

            return run_demo(args.steps, args.log_freq, args.top, args.save, sys.stdout)
    except ModProfError as error:
        print(f"wandb-modprof: error: {error}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
