"""The `wandb-modprof` console command: its command table, parser, exit statuses and error
format, outside the package on purpose.

`import wandb_modprof` imports torch (seconds). This module imports nothing heavy, so every
`--help` (the overview and each command's), no command, an unknown command and any other usage
error are answered from here, at once. Only a command that parsed imports the package: its
implementation, `wandb_modprof.api.cli_commands`. A Ctrl-C while torch is still being imported
is caught here and reported as a later one is (one line, exit 130).

The imports go one way: `wandb_modprof.api.cli` (`python -m wandb_modprof`) runs `main` from
here, this module runs `wandb_modprof.api.cli_commands`, which imports neither.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NamedTuple, NoReturn

EXIT_OK = 0
# As `diff` and `cmp`: 1 is the verdict "differs" (the regression gate of `compare
# --fail-above`), 2 is trouble; a bug of ours is 3 so that a CI gate can tell it from a verdict.
EXIT_REGRESSED = 1  # `compare --fail-above`: a module call regressed (the offenders are printed)
EXIT_INPUT = 2  # usage, or bad input: unknown mode, missing / corrupt file, unwritable output
EXIT_INTERNAL = 3  # a bug in wandb_modprof (the traceback is printed)
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

# The package's values that the help shows, copied: importing them would import torch and cost
# every `--help` its speed. tests/api/test_cli.py checks each against the package.
MODE_KEYS = (  # = wandb_modprof.records.modes.MODE_KEYS
    "fwd",
    "bwd",
    "fwd_bwd",
    "self",
    "act",
    "param",
    "grad",
    "optim",
    "peak",
    "param_norm",
    "grad_norm",
    "flops",
    "flop_s",
    "eff",
    "eff_bwd",
    "imbalance",
    "ckpt",
    "load",
)
DEFAULT_MODE = "fwd_bwd"  # = wandb_modprof.records.modes.DEFAULT_MODE
SCALES = ("linear", "log")  # = wandb_modprof.records.modes.SCALES
DEFAULT_SCALE = "linear"  # = wandb_modprof.records.modes.DEFAULT_SCALE
CHART_NAME = "wandb-modprof-v4"  # = wandb_modprof.sinks.spec.CHART_NAME
MODE_KEYS_IN_HELP = ", ".join(MODE_KEYS)

DESCRIPTION = "Command line: `wandb-modprof COMMAND ...` or `python -m wandb_modprof COMMAND ...`."
# The exit statuses, once: in the overview (`wandb-modprof --help`). They are the same for every
# command (1 is compare's alone, and its --fail-above says so), so a command's help points here.
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
MODES_LINE = "analysis modes (--mode): " + MODE_KEYS_IN_HELP
COMMAND_EPILOG = "exit status: see `wandb-modprof --help`"


class Parser(argparse.ArgumentParser):
    """Usage errors as the README states them, from subcommands too: the usage, then
    `wandb-modprof: error: ...` (argparse would write `wandb-modprof summary: error: ...`)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        error(message)
        sys.exit(EXIT_INPUT)


def error(text: str) -> None:
    print(f"wandb-modprof: error: {text}", file=sys.stderr)


# ---- option values -------------------------------------------------------------------------
def _number(text: str, kind: type[float] | type[int], expected: str, ok: object) -> float:
    """An option's number, or argparse's usage error: "expected <expected>, got <text>"."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not (callable(ok) and ok(value)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
    return value


def _positive(text: str) -> int:
    return int(_number(text, int, "an integer >= 1", lambda v: v >= 1))


def _ratio_limit(text: str) -> float:
    try:  # (a word is "a ratio", a number out of range "a finite ratio")
        float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a ratio >= 1, got {text!r}") from None
    # NaN fails the comparison
    return _number(text, float, "a finite ratio >= 1", lambda v: 1.0 <= v < float("inf"))


def _fraction(text: str) -> float:
    return _number(text, float, "a fraction in [0, 1]", lambda v: 0.0 <= v <= 1.0)


def _add_mode(parser: argparse.ArgumentParser, default: str = DEFAULT_MODE) -> None:
    parser.add_argument(
        "--mode",
        default=default,
        choices=MODE_KEYS,
        metavar="MODE",
        help=f"analysis mode, one of: {', '.join(MODE_KEYS)} (default {default})",
    )


def _add_top(parser: argparse.ArgumentParser, default: int, what: str) -> None:
    parser.add_argument(
        "--top", type=_positive, default=default, help=f"{what} (default {default})"
    )


# ---- each command's options ----------------------------------------------------------------
def _demo_options(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--steps", type=_positive, default=12, help="training steps (default 12)")
    demo.add_argument(
        "--log-freq", type=_positive, default=4, help="sample every Nth step (default 4)"
    )
    _add_top(demo, 8, "modules per table")
    demo.add_argument(
        "--save",
        default="out/demo.modprof.json",
        help="where to write the profile file; the report and the trace go beside it "
        "(default out/demo.modprof.json)",
    )


def _report_options(report: argparse.ArgumentParser) -> None:
    report.add_argument("profile", metavar="PROFILE", help="a *.modprof.json file")
    report.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="HTML",
        help="output file (default: PROFILE with .modprof.json replaced by .html)",
    )
    _add_mode(report)
    report.add_argument(
        "--scale",
        default=DEFAULT_SCALE,
        choices=SCALES,
        help=f"colour scale (default {DEFAULT_SCALE})",
    )
    report.add_argument("--title", default=None, help="page title (default: the model's name)")


def _summary_options(summary: argparse.ArgumentParser) -> None:
    summary.add_argument("profile", metavar="PROFILE", help="a *.modprof.json file")
    _add_mode(summary)
    _add_top(summary, 15, "module calls shown")


def _compare_options(compare: argparse.ArgumentParser) -> None:
    compare.add_argument("a", metavar="A", help="baseline *.modprof.json file")
    compare.add_argument("b", metavar="B", help="*.modprof.json file compared with A")
    _add_mode(compare)
    _add_top(compare, 15, "module calls per section")
    compare.add_argument(
        "--html",
        default=None,
        metavar="HTML",
        help="also write the HTML report of both profiles, opened in compare mode (A baseline)",
    )
    compare.add_argument(
        "--fail-above",
        type=_ratio_limit,
        default=None,
        metavar="RATIO",
        help="regression gate: exit 1 when a module call holding >= --min-share of the model "
        "total got slower (or bigger, per --mode) than RATIO x its A value, judged on each "
        "side's fastest sample; the offenders are printed (e.g. 1.10)",
    )
    compare.add_argument(
        "--min-share",
        type=_fraction,
        default=None,
        metavar="FRACTION",
        help="with --fail-above: calls holding less of the model total in both A and B are not "
        "checked (default 0.01)",
    )


def _plan_options(plan: argparse.ArgumentParser) -> None:
    plan.add_argument("profile", metavar="PROFILE", help="a *.modprof.json file")
    plan.add_argument(
        "--budget",
        required=True,
        metavar="BUDGET",
        help="activation memory to fit: bytes (200000000), a share of today's (0.5) or a "
        "percentage (50%%)",
    )
    plan.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="JSON",
        help="where the plan is written (default: PROFILE with .modprof.json replaced by "
        ".plan.json); wandb_modprof.apply_checkpoint_plan(model, JSON) applies it",
    )


def _chart_options(chart: argparse.ArgumentParser) -> None:
    chart.add_argument(
        "--entity", default=None, help="W&B user or team (default: your default entity)"
    )
    chart.add_argument("--name", default=CHART_NAME, help=f"preset name (default {CHART_NAME})")
    chart.add_argument(
        "--public", action="store_true", help="public access (default: private to the entity)"
    )


# ---- the command table ---------------------------------------------------------------------
class Command(NamedTuple):
    """One command: the line `wandb-modprof --help` shows, its own help, its options. What it
    does is `wandb_modprof.api.cli_commands.COMMANDS[name]`, imported once it is given."""

    summary: str
    description: str
    options: Callable[[argparse.ArgumentParser], None]
    takes_mode: bool = False  # its help lists the analysis modes


COMMANDS: dict[str, Command] = {
    "demo": Command(
        "train a small GPT-2 on CPU under watch(); profile, HTML report, trace, W&B run",
        "Train GPT-2 (built from a config, random weights) on CPU under watch() with an "
        "offline W&B run beside --save (WANDB_MODE, when set, decides instead); print the top "
        "modules; write the profile (--save), the HTML report (.html) and a Chrome trace "
        "(.trace.json) next to it.",
        _demo_options,
    ),
    "report": Command(
        "profile file -> self-contained HTML report",
        "Write the HTML report of a saved profile (works offline: no server, no CDN) and print "
        "its path.",
        _report_options,
        takes_mode=True,
    ),
    "summary": Command(
        "profile file -> terminal table of the top modules in one analysis mode",
        "Print the top module calls of a saved profile in one analysis mode: value (median "
        "over the sampled steps, with its unit), share of the model total where the mode has "
        "one, module type and how many times the module is called per step. One row per call "
        "(`name#index`); the root is the model total.",
        _summary_options,
        takes_mode=True,
    ),
    "compare": Command(
        "two profile files -> per-module ratios B / A (and the report in compare mode)",
        "Match the module calls of two saved profiles by call key and print the ratio B / A of "
        "each in one analysis mode, largest change (|log ratio|) first, then the calls found in "
        "one profile only, and the ratio of the model totals.",
        _compare_options,
        takes_mode=True,
    ),
    "plan": Command(
        "profile file -> the modules to checkpoint for an activation-memory budget (JSON)",
        "Choose the modules to wrap in activation checkpointing so the activation memory fits "
        "--budget at the least recompute time, from the profile's measured saved bytes and "
        "forward times; print the plan (bytes freed, recompute, why; the modules left out and "
        "why) and write it as JSON for wandb_modprof.apply_checkpoint_plan.",
        _plan_options,
    ),
    "register-chart": Command(
        "register the panel's Vega spec as a W&B chart preset (once per entity)",
        "Create the W&B custom chart preset ENTITY/NAME that watch() logs its panels with; "
        "prints its name. Needs network and an API key (wandb login).",
        _chart_options,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the overview and every command with its options."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = Parser(
        prog="wandb-modprof",
        description=DESCRIPTION,
        epilog=EPILOG + "\n\n" + MODES_LINE,
        formatter_class=raw,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        epilog = COMMAND_EPILOG + ("\n\n" + MODES_LINE if command.takes_mode else "")
        command.options(
            sub.add_parser(
                name,
                help=command.summary,
                description=command.description,
                epilog=epilog,
                formatter_class=raw,
            )
        )
    return parser


# ---- running a command ---------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (see EPILOG) instead of exiting (except for a
    failed register-chart run as the command itself, argv None: see
    `wandb_modprof.api.cli_commands.ABANDON_WANDB_SERVICE`)."""
    try:  # from the first line on: building the parser, parsing, importing torch, the command
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exit_:  # usage errors (2) and --help (0), already printed
            return exit_.code if isinstance(exit_.code, int) else EXIT_INPUT
        from wandb_modprof.api import cli_commands  # the package: torch, seconds

        status = _run(cli_commands.COMMANDS[args.command], args)
        abandon = argv is None and cli_commands.ABANDON_WANDB_SERVICE[0]
    except KeyboardInterrupt:
        error("interrupted")
        return EXIT_INTERRUPTED
    if abandon:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _run(command: Callable[[argparse.Namespace], bool], args: argparse.Namespace) -> int:
    """`command(args)`: its outcome (False: the verdict "regressed") or its error, as an exit
    status."""
    from wandb_modprof import ModProfError

    try:
        passed = command(args)
    except ModProfError as problem:
        error(str(problem))
        return EXIT_INPUT
    except OSError as problem:  # a path given on the command line that the OS refuses
        where = f" {str(problem.filename)!r}" if problem.filename is not None else ""
        error(f"cannot use{where}: {problem.strerror or problem}")
        return EXIT_INPUT
    except Exception as problem:
        import traceback

        traceback.print_exc()
        error(
            f"internal error ({type(problem).__name__}: {problem}); this is a bug in "
            "wandb_modprof: please report it with the traceback above"
        )
        return EXIT_INTERNAL
    return EXIT_OK if passed else EXIT_REGRESSED


if __name__ == "__main__":
    sys.exit(main())
