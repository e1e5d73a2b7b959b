"""Command line: `wandb-modprof COMMAND ...` or `python -m wandb_modprof COMMAND ...`.

demo            train a small GPT-2 on CPU under watch(); profile, HTML report, trace, W&B run
report          profile file -> self-contained HTML report
summary         profile file -> terminal table of the top modules in one analysis mode
compare         two profile files -> per-module ratios B / A (and the report in compare mode)
register-chart  register the panel's Vega spec as a W&B chart preset (once per entity)
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.modes import DEFAULT_MODE, DEFAULT_SCALE, MODE_KEYS, SCALES
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.escape import escape_text

if TYPE_CHECKING:
    from wandb_modprof.api.profile import Profile

    # what `add_subparsers` returns (argparse names its class privately)
    _Commands = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug in wandb_modprof (the traceback is printed)
EXIT_INPUT = 2  # usage, or bad input: unknown mode, missing / corrupt file, unwritable output
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

EPILOG = """\
exit status:
  0    success
  1    internal error (a bug in wandb_modprof: the traceback is printed; please report it)
  2    usage or input error: unknown command, option or analysis mode, a profile file that
       is missing, not JSON or not a wandb_modprof profile, an output path whose directory
       does not exist or that is a directory, a W&B request that failed (register-chart)
  130  interrupted (Ctrl-C)
Errors are one line on stderr: "wandb-modprof: error: ..."."""
# only where a --mode is taken (report, summary, compare) and in the overview
MODES_EPILOG = EPILOG + "\n\nanalysis modes (--mode): " + ", ".join(MODE_KEYS)


class _Parser(argparse.ArgumentParser):
    """Usage errors as the README states them, from subcommands too: the usage, then
    `wandb-modprof: error: ...` (argparse would write `wandb-modprof summary: error: ...`)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        _error(message)
        sys.exit(EXIT_INPUT)


PROFILE_SUFFIX = ".modprof.json"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


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
    formatter = argparse.RawDescriptionHelpFormatter
    parser: argparse.ArgumentParser = _Parser(
        prog="wandb-modprof", description=__doc__, epilog=MODES_EPILOG, formatter_class=formatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_demo_parser, _report_parser, _summary_parser, _compare_parser, _chart_parser):
        add(sub)
    return parser


def _demo_parser(sub: _Commands) -> None:
    """`demo`: train GPT-2 on CPU under watch()."""
    formatter = argparse.RawDescriptionHelpFormatter
    demo = sub.add_parser(
        "demo",
        help="train a small GPT-2 on CPU under watch() and write its profile and report",
        description="Train GPT-2 (built from a config, random weights) on CPU under watch() "
        "with an offline W&B run beside --save (WANDB_MODE, when set, decides instead); print "
        "the top modules; write the profile (--save), the HTML report (.html) and a Chrome "
        "trace (.trace.json) next to it.",
        epilog=EPILOG,
        formatter_class=formatter,
    )
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


def _report_parser(sub: _Commands) -> None:
    """`report PROFILE`: the HTML report."""
    formatter = argparse.RawDescriptionHelpFormatter
    report = sub.add_parser(
        "report",
        help="profile file -> self-contained HTML report",
        description="Write the HTML report of a saved profile (works offline: no server, no "
        "CDN) and print its path.",
        epilog=MODES_EPILOG,
        formatter_class=formatter,
    )
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


def _summary_parser(sub: _Commands) -> None:
    """`summary PROFILE`: the top module calls in one mode."""
    formatter = argparse.RawDescriptionHelpFormatter
    summary = sub.add_parser(
        "summary",
        help="profile file -> the top modules in one analysis mode",
        description="Print the top module calls of a saved profile in one analysis mode: value "
        "(median over the sampled steps, with its unit), share of the model total where the mode "
        "has one, module type and how many times the module is called per step. One row per "
        "call (`name#index`); the root is the model total.",
        epilog=MODES_EPILOG,
        formatter_class=formatter,
    )
    summary.add_argument("profile", metavar="PROFILE", help="a *.modprof.json file")
    _add_mode(summary)
    _add_top(summary, 15, "module calls shown")


def _compare_parser(sub: _Commands) -> None:
    """`compare A B`: ratios B / A."""
    formatter = argparse.RawDescriptionHelpFormatter
    compare = sub.add_parser(
        "compare",
        help="two profile files -> per-module ratios B / A",
        description="Match the module calls of two saved profiles by call key and print the "
        "ratio B / A of each in one analysis mode, largest change (|log ratio|) first, then the "
        "calls found in one profile only, and the ratio of the model totals.",
        epilog=MODES_EPILOG,
        formatter_class=formatter,
    )
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


def _chart_parser(sub: _Commands) -> None:
    """`register-chart`: the W&B chart preset."""
    formatter = argparse.RawDescriptionHelpFormatter
    chart = sub.add_parser(
        "register-chart",
        help="register the panel's Vega spec as a W&B chart preset (once per entity)",
        description="Create the W&B custom chart preset ENTITY/NAME that watch() logs its "
        "panels with; prints its name. Needs network and an API key (wandb login).",
        epilog=EPILOG,
        formatter_class=formatter,
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
    from wandb_modprof.sinks.summary import format_mode_summary
    from wandb_modprof.sinks.values import mode_values

    values = mode_values(_load(args.profile), args.mode)
    _write(format_mode_summary(values, args.top))
    return EXIT_OK


def _compare(args: argparse.Namespace) -> int:
    from wandb_modprof.sinks.compare import compare, format_comparison

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
    return EXIT_OK


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


def _error(text: str) -> None:
    print(f"wandb-modprof: error: {text}", file=sys.stderr)


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
