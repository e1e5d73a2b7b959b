"""Command line: `wandb-modprof demo` / `python -m wandb_modprof demo`, and
`wandb-modprof register-chart [--entity E] [--name N] [--public]` (the panel's W&B preset)."""

from __future__ import annotations

import argparse
import sys

from . import _spec
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
    chart = sub.add_parser(
        "register-chart",
        help="register the panel's Vega spec as a W&B chart preset (once per entity)",
        description="Create the W&B custom chart preset ENTITY/NAME that watch() logs its "
        "panels with; prints its name. Needs network and an API key (wandb login).",
    )
    chart.add_argument(
        "--entity", default=None, help="W&B user or team (default: your default entity)"
    )
    chart.add_argument(
        "--name", default=_spec.CHART_NAME, help=f"preset name (default {_spec.CHART_NAME})"
    )
    chart.add_argument(
        "--public", action="store_true", help="public access (default: private to the entity)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from ._demo import run_demo

            return run_demo(args.steps, args.log_freq, args.top, args.save, sys.stdout)
        if args.command == "register-chart":
            from ._chart import register_chart

            print(register_chart(args.entity, name=args.name, public=args.public))
            return 0
    except ModProfError as error:
        print(f"wandb-modprof: error: {error}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
