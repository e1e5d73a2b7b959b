"""The `wandb-modprof` console command's entry point and its command table, outside the package
on purpose.

`import wandb_modprof` imports torch (seconds). This module imports nothing heavy, so:

- `wandb-modprof --help`, no command and an unknown command are answered from here, from the
  same top-level parser that `wandb_modprof.api.cli` fills in (a fraction of a second);
- a command imports the package and runs there (`wandb_modprof.api.cli.main`), and a Ctrl-C
  while torch is still being imported is caught here and reported as the CLI reports it later
  (one line, exit 130).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EXIT_OK = 0
# As `diff` and `cmp`: 1 is the verdict "differs" (the regression gate of `compare
# --fail-above`), 2 is trouble; a bug of ours is 3 so that a CI gate can tell it from a verdict.
EXIT_REGRESSED = 1  # `compare --fail-above`: a module call regressed (the offenders are printed)
EXIT_INPUT = 2  # usage, or bad input: unknown mode, missing / corrupt file, unwritable output
EXIT_INTERNAL = 3  # a bug in wandb_modprof (the traceback is printed)
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

# The command table: name -> the one line `wandb-modprof --help` shows. Each command's options
# and its run function are in wandb_modprof.api.cli, imported only once a command is given.
COMMANDS: dict[str, str] = {
    "demo": "train a small GPT-2 on CPU under watch(); profile, HTML report, trace, W&B run",
    "report": "profile file -> self-contained HTML report",
    "summary": "profile file -> terminal table of the top modules in one analysis mode",
    "compare": "two profile files -> per-module ratios B / A (and the report in compare mode)",
    "register-chart": "register the panel's Vega spec as a W&B chart preset (once per entity)",
}

# = wandb_modprof.records.modes.MODE_KEYS, copied: importing the package (torch) would cost the
# overview its speed. tests/api/test_cli_commands.py checks the two are the same.
MODE_KEYS_IN_HELP = (
    "fwd, bwd, fwd_bwd, self, act, param, grad, optim, peak, param_norm, grad_norm, flops, "
    "flop_s, eff, eff_bwd, imbalance"
)

EPILOG = """\
exit status:
  0    success (compare --fail-above: no module call regressed)
  1    compare --fail-above: a module call regressed (the offenders are printed)
  2    usage or input error: unknown command, option or analysis mode, a profile file that
       is missing, not JSON or not a wandb_modprof profile, an output path whose directory
       does not exist or that is a directory, a W&B request that failed (register-chart)
  3    internal error (a bug in wandb_modprof: the traceback is printed; please report it)
  130  interrupted (Ctrl-C)
Errors are one line on stderr: "wandb-modprof: error: ..."."""
# only where a --mode is taken (report, summary, compare) and in the overview
MODES_EPILOG = EPILOG + "\n\nanalysis modes (--mode): " + MODE_KEYS_IN_HELP

DESCRIPTION = "Command line: `wandb-modprof COMMAND ...` or `python -m wandb_modprof COMMAND ...`."


class Parser(argparse.ArgumentParser):
    """Usage errors as the README states them, from subcommands too: the usage, then
    `wandb-modprof: error: ...` (argparse would write `wandb-modprof summary: error: ...`)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        error(message)
        sys.exit(EXIT_INPUT)


def error(text: str) -> None:
    print(f"wandb-modprof: error: {text}", file=sys.stderr)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and one (empty) subparser per command, which
    `wandb_modprof.api.cli.build_parser` gives its options."""
    parser = Parser(
        prog="wandb-modprof",
        description=DESCRIPTION,
        epilog=MODES_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands: dict[str, argparse.ArgumentParser] = {
        name: sub.add_parser(name, help=text, formatter_class=argparse.RawDescriptionHelpFormatter)
        for name, text in COMMANDS.items()
    }
    return parser, commands


def _needs_the_package(argv: list[str]) -> bool:
    """False where the top-level parser alone answers as the full one would: no arguments,
    `-h` / `--help` first, or an unknown command first (a usage error)."""
    if not argv or argv[0] in ("-h", "--help"):
        return False
    return argv[0].startswith("-") or argv[0] in COMMANDS


def main(argv: list[str] | None = None) -> int:
    """Run one command (see `wandb_modprof.api.cli.main`); returns the exit status."""
    try:
        if not _needs_the_package(sys.argv[1:] if argv is None else argv):
            try:
                build_parser()[0].parse_args(argv)
            except SystemExit as exit_:  # usage errors (2) and --help (0), already printed
                return exit_.code if isinstance(exit_.code, int) else EXIT_INPUT
            raise AssertionError("the top-level parser accepted no command")  # pragma: no cover
        from wandb_modprof.api.cli import main as run
    except KeyboardInterrupt:
        error("interrupted")
        return EXIT_INTERRUPTED
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
