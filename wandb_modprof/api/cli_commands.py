"""What each `wandb-modprof` command does, given its parsed arguments.

The command line itself (the command table, the options, the exit statuses, the error format)
is the console command's module `wandb_modprof_cli`, outside the package and free of torch so
that every `--help` answers at once. It imports this module once a command has parsed, and runs
`COMMANDS[name](args)`. This module imports neither it nor `wandb_modprof.api.cli`: the imports
go one way.

Each command returns True, or False for the verdict "regressed" (`compare --fail-above`), and
raises `ModProfError` for bad input; `wandb_modprof_cli` turns these into the exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from wandb_modprof._errors import ModProfError
from wandb_modprof.sinks.escape import escape_text

if TYPE_CHECKING:
    from wandb_modprof.api.profile import Profile

PROFILE_SUFFIX = ".modprof.json"


def _load(path: str) -> Profile:
    from wandb_modprof.api.profile_load import load

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


def _demo(args: argparse.Namespace) -> bool:
    """`demo`: train GPT-2 on CPU under watch()."""
    from wandb_modprof.api.demo import run_demo

    save = Path(args.save)
    if save.is_dir():
        raise ModProfError(f"--save {str(save)!r} is a directory; expected a file path")
    return run_demo(args.steps, args.log_freq, args.top, args.save, sys.stdout) == 0


def _report(args: argparse.Namespace) -> bool:
    """`report PROFILE`: the HTML report."""
    from wandb_modprof.sinks.report.html import write_report

    prof = _load(args.profile)  # first: a missing profile is the error to report
    output = args.output
    if output is None:
        output = str(Path(args.profile).with_name(_label(args.profile) + ".html"))
    target = _check_output(output, "report", (args.profile,))
    path = write_report(
        target, [(_label(args.profile), prof)], title=args.title, mode=args.mode, scale=args.scale
    )
    _write(f"{path}\n")
    return True


def _summary(args: argparse.Namespace) -> bool:
    """`summary PROFILE`: the top module calls in one mode."""
    from wandb_modprof.sinks.text.summary import mode_summary

    _write(mode_summary(_load(args.profile).snapshot(), args.mode, args.top))
    return True


def _budget(text: str) -> int | float | str:
    """`--budget` as `Profile.checkpoint_plan` takes it: "50%" as given, "0.5" a share, "2e8"
    or "200000000" bytes (which the plan checks)."""
    text = text.strip()
    if text.endswith("%"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise ModProfError(
            f"--budget expected bytes (200000000), a share (0.5) or a percentage (50%); got "
            f"{text!r}"
        ) from None
    return value if value <= 1 else int(value) if value.is_integer() else value


def _plan(args: argparse.Namespace) -> bool:
    """`plan PROFILE --budget B`: what to checkpoint; the plan printed and written as JSON."""
    import json

    from wandb_modprof.sinks.files import write_atomic
    from wandb_modprof.sinks.text.checkpoint_plan import format_plan

    budget = _budget(args.budget)
    prof = _load(args.profile)
    output = args.output
    if output is None:
        output = str(Path(args.profile).with_name(_label(args.profile) + ".plan.json"))
    target = _check_output(output, "plan", (args.profile,))
    plan = prof.checkpoint_plan(budget)
    text = json.dumps(plan.to_json(), indent=1) + "\n"
    write_atomic(target, text.encode("utf-8"), f"cannot write plan to {str(target)!r}")
    _write(format_plan(plan) + f"\nwritten to {target}\n")
    return True


def _compare(args: argparse.Namespace) -> bool:
    """`compare A B`: ratios B / A; False where the --fail-above gate found a regression."""
    from wandb_modprof.sinks.text.compare import compare, format_comparison
    from wandb_modprof.sinks.text.regression import (
        DEFAULT_MIN_SHARE,
        check_limits,
        regression_check,
    )

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
        from wandb_modprof.sinks.report.html import write_report

        path = write_report(target, [(label_a, a), (label_b, b)], compare=True, mode=args.mode)
        _write(f"HTML report (compare mode, baseline {escape_text(label_a)}) written to {path}\n")
    if not gate:
        return True
    check = regression_check(a, b, args.fail_above, args.mode, min_share, label_a, label_b)
    _write("\n" + check.format())
    return check.passed


def _register_chart(args: argparse.Namespace) -> bool:
    """`register-chart`: the W&B chart preset."""
    from wandb_modprof.sinks.wandb.chart import register_chart

    try:
        name = register_chart(args.entity, name=args.name, public=args.public)
    except ModProfError:
        ABANDON_WANDB_SERVICE[0] = True
        raise
    _write(f"{name}\n")
    return True


# Without network, W&B's background service (wandb-core) goes on retrying after our request
# gave up, and W&B's exit handler waits for it: `register-chart` printed its error after ~9 s,
# then the process sat there for a minute or more (2 runs in 5 here). A command process that
# failed in register-chart has nothing left to save, so it ends without that wait (the service
# exits with its parent). Set by `_register_chart`; acted on by `wandb_modprof_cli.main()` run
# as the command.
ABANDON_WANDB_SERVICE = [False]


# The same names as `wandb_modprof_cli.COMMANDS` (tests/api/test_cli.py checks it).
COMMANDS: dict[str, Callable[[argparse.Namespace], bool]] = {
    "demo": _demo,
    "report": _report,
    "summary": _summary,
    "compare": _compare,
    "plan": _plan,
    "register-chart": _register_chart,
}


def _write(text: str) -> None:
    """`text` on stdout; a character its encoding cannot write (a lone surrogate, CJK on an
    ASCII terminal) is written as a backslash escape instead of failing the command. Names in
    `text` are already escaped (`escape_text`); this covers paths and what is left."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    sys.stdout.write(text.encode(encoding, "backslashreplace").decode(encoding))
