"""Command line: `wandb-modprof COMMAND ...` or `python -m wandb_modprof COMMAND ...`.

The command table, the top-level parser, the exit statuses and the usage-error format live in
the console command's module `wandb_modprof_cli` (outside the package, importing no torch, so
`wandb-modprof --help` answers at once); this module gives each command its options and runs it.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import wandb_modprof_cli as _top
from wandb_modprof._errors import ModProfError
from wandb_modprof.records.modes import DEFAULT_MODE, DEFAULT_SCALE, MODE_KEYS, SCALES
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.escape import escape_text

if TYPE_CHECKING:
    from wandb_modprof.api.profile import Profile

EXIT_OK = _top.EXIT_OK
EXIT_INTERNAL = _top.EXIT_INTERNAL
EXIT_INPUT = _top.EXIT_INPUT
EXIT_REGRESSED = _top.EXIT_REGRESSED
EXIT_INTERRUPTED = _top.EXIT_INTERRUPTED
EPILOG = _top.EPILOG
MODES_EPILOG = _top.MODES_EPILOG  # only where a --mode is taken (report, summary, compare)
_error = _top.error


PROFILE_SUFFIX = ".modprof.json"


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


def build_parser() -> argparse.ArgumentParser:
    """`wandb_modprof_cli`'s top-level parser, each command's subparser given its options."""
    parser, commands = _top.build_parser()
    options = {
        "demo": _demo_parser,
        "report": _report_parser,
        "summary": _summary_parser,
        "compare": _compare_parser,
        "register-chart": _chart_parser,
    }
    assert options.keys() == commands.keys() == COMMANDS.keys()
    for name, command in commands.items():
        options[name](command)
    return parser


def _demo_parser(demo: argparse.ArgumentParser) -> None:
    """`demo`: train GPT-2 on CPU under watch()."""
    demo.description = (
        "Train GPT-2 (built from a config, random weights) on CPU under watch() "
        "with an offline W&B run beside --save (WANDB_MODE, when set, decides instead); print "
        "the top modules; write the profile (--save), the HTML report (.html) and a Chrome "
        "trace (.trace.json) next to it."
    )
    demo.epilog = EPILOG
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


def _report_parser(report: argparse.ArgumentParser) -> None:
    """`report PROFILE`: the HTML report."""
    report.description = (
        "Write the HTML report of a saved profile (works offline: no server, no "
        "CDN) and print its path."
    )
    report.epilog = MODES_EPILOG
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


def _summary_parser(summary: argparse.ArgumentParser) -> None:
    """`summary PROFILE`: the top module calls in one mode."""
    summary.description = (
        "Print the top module calls of a saved profile in one analysis mode: value "
        "(median over the sampled steps, with its unit), share of the model total where the mode "
        "has one, module type and how many times the module is called per step. One row per "
        "call (`name#index`); the root is the model total."
    )
    summary.epilog = MODES_EPILOG
    summary.add_argument("profile", metavar="PROFILE", help="a *.modprof.json file")
    _add_mode(summary)
    _add_top(summary, 15, "module calls shown")


def _compare_parser(compare: argparse.ArgumentParser) -> None:
    """`compare A B`: ratios B / A."""
    compare.description = (
        "Match the module calls of two saved profiles by call key and print the "
        "ratio B / A of each in one analysis mode, largest change (|log ratio|) first, then the "
        "calls found in one profile only, and the ratio of the model totals."
    )
    compare.epilog = MODES_EPILOG
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
        "total got slower (or bigger, per --mode) than RATIO x its A value, beyond what its "
        "sample spread explains; the offenders are printed (e.g. 1.10)",
    )
    compare.add_argument(
        "--min-share",
        type=_fraction,
        default=None,
        metavar="FRACTION",
        help="with --fail-above: calls holding less of the model total in both A and B are not "
        "checked (default 0.01)",
    )


def _chart_parser(chart: argparse.ArgumentParser) -> None:
    """`register-chart`: the W&B chart preset."""
    chart.description = (
        "Create the W&B custom chart preset ENTITY/NAME that watch() logs its "
        "panels with; prints its name. Needs network and an API key (wandb login)."
    )
    chart.epilog = EPILOG
    chart.add_argument(
        "--entity", default=None, help="W&B user or team (default: your default entity)"
    )
    chart.add_argument(
        "--name", default=_spec.CHART_NAME, help=f"preset name (default {_spec.CHART_NAME})"
    )
    chart.add_argument(
        "--public", action="store_true", help="public access (default: private to the entity)"
    )


# ---- commands ------------------------------------------------------------------------------
def _load(path: str) -> Profile:
    from wandb_modprof.api.profile import load

    return load(path)


def _label(path: str) -> str:
    name = Path(path).name
    return name[: -len(PROFILE_SUFFIX)] if name.endswith(PROFILE_SUFFIX) else name


def _same_file(a: str | Path, b: str | Path) -> bool:
    """True where `a` and `b` are one file: the same path, a symlink to it, a hard link."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): not the same file
        return False


def _check_output(path: str | Path, what: str, inputs: tuple[str, ...] = ()) -> Path:
    """Fail before any work (exit 2) where `path` cannot be an output file, or is one of the
    `inputs` (writing it would destroy the profile it is made from)."""
    target = Path(path)
    for source in inputs:
        if _same_file(target, source):
            raise ModProfError(
                f"{what} {str(target)!r} is the input profile {source!r}; expected an output "
                "path that is not an input"
            )
    if target.is_dir():
        raise ModProfError(f"{what} {str(target)!r} is a directory; expected a file path")
    if not target.parent.is_dir():
        raise ModProfError(
            f"cannot write {what} {str(target)!r}: directory {str(target.parent)!r} does not exist"
        )
    return target


def _demo(args: argparse.Namespace) -> int:
    from wandb_modprof.api.demo import run_demo

    save = Path(args.save)
    if save.is_dir():
        raise ModProfError(f"--save {str(save)!r} is a directory; expected a file path")
    return run_demo(args.steps, args.log_freq, args.top, args.save, sys.stdout)


def _report(args: argparse.Namespace) -> int:
    from wandb_modprof.sinks.html import write_report

    prof = _load(args.profile)  # first: a missing profile is the error to report
    output = args.output
    if output is None:
        output = str(Path(args.profile).with_name(_label(args.profile) + ".html"))
    target = _check_output(output, "report", (args.profile,))
    path = write_report(
        target, [(_label(args.profile), prof)], title=args.title, mode=args.mode, scale=args.scale
    )
    _write(f"{path}\n")
    return EXIT_OK


def _summary(args: argparse.Namespace) -> int:
    from wandb_modprof.sinks.summary import mode_summary

    _write(mode_summary(_load(args.profile).snapshot(), args.mode, args.top))
    return EXIT_OK


def _compare(args: argparse.Namespace) -> int:
    from wandb_modprof.sinks.compare import compare, format_comparison
    from wandb_modprof.sinks.regression import DEFAULT_MIN_SHARE, check_limits, regression_check

    gate = args.fail_above is not None
    if args.min_share is not None and not gate:
        raise ModProfError("--min-share expected --fail-above beside it (it only sets the gate)")
    min_share = DEFAULT_MIN_SHARE if args.min_share is None else args.min_share
    if gate:
        check_limits(args.fail_above, min_share, args.mode)  # before loading anything
    target = None if args.html is None else _check_output(args.html, "report", (args.a, args.b))
    label_a, label_b = _label(args.a), _label(args.b)
    if label_a == label_b:  # same file name in two folders: the paths tell them apart
        label_a, label_b = args.a, args.b
    a, b = _load(args.a), _load(args.b)
    _write(format_comparison(compare(a, b, args.mode, label_a, label_b), args.top))
    if target is not None:
        from wandb_modprof.sinks.html import write_report

        path = write_report(target, [(label_a, a), (label_b, b)], compare=True, mode=args.mode)
        _write(f"HTML report (compare mode, baseline {escape_text(label_a)}) written to {path}\n")
    if not gate:
        return EXIT_OK
    check = regression_check(a, b, args.fail_above, args.mode, min_share, label_a, label_b)
    _write("\n" + check.format())
    return EXIT_OK if check.passed else EXIT_REGRESSED


def _register_chart(args: argparse.Namespace) -> int:
    from wandb_modprof.sinks.chart import register_chart

    try:
        name = register_chart(args.entity, name=args.name, public=args.public)
    except ModProfError:
        _ABANDON_WANDB_SERVICE[0] = True
        raise
    _write(f"{name}\n")
    return EXIT_OK


# Without network, W&B's background service (wandb-core) goes on retrying after our request
# gave up, and W&B's exit handler waits for it: `register-chart` printed its error after ~9 s,
# then the process sat there for a minute or more (2 runs in 5 here). A command process that
# failed in register-chart has nothing left to save, so it ends without that wait (the service
# exits with its parent). Set by `_register_chart`; acted on by `main()` run as the command.
_ABANDON_WANDB_SERVICE = [False]


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo,
    "report": _report,
    "summary": _summary,
    "compare": _compare,
    "register-chart": _register_chart,
}


def _write(text: str) -> None:
    """`text` on stdout; a character its encoding cannot write (a lone surrogate, CJK on an
    ASCII terminal) is written as a backslash escape instead of failing the command. Names in
    `text` are already escaped (`escape_text`); this covers paths and what is left."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    sys.stdout.write(text.encode(encoding, "backslashreplace").decode(encoding))


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (see EPILOG) instead of exiting (except for a
    failed register-chart run as the command itself, argv None: see _ABANDON_WANDB_SERVICE)."""
    try:
        status = _run(argv)
    except KeyboardInterrupt:  # from the first line on: building the parser, parsing, imports
        _error("interrupted")
        return EXIT_INTERRUPTED
    if argv is None and _ABANDON_WANDB_SERVICE[0]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _run(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # usage errors (2) and --help (0), already printed
        return exit_.code if isinstance(exit_.code, int) else EXIT_INPUT
    try:
        return COMMANDS[args.command](args)
    except ModProfError as error:
        _error(str(error))
        return EXIT_INPUT
    except OSError as error:  # a path given on the command line that the OS refuses
        where = f" {str(error.filename)!r}" if error.filename is not None else ""
        _error(f"cannot use{where}: {error.strerror or error}")
        return EXIT_INPUT
    except Exception as error:
        traceback.print_exc()
        _error(
            f"internal error ({type(error).__name__}: {error}); this is a bug in "
            "wandb_modprof: please report it with the traceback above"
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
