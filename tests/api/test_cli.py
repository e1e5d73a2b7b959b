"""The README's main job, run the way a user runs it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import wandb_modprof
import wandb_modprof_cli
from wandb_modprof.api import demo as _demo


def test_demo_trains_and_prints_top_modules(tmp_path, capsys):
    pytest.importorskip("transformers")
    saved = tmp_path / "sub" / "demo.modprof.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wandb_modprof",
            "demo",
            "--steps",
            "3",
            "--log-freq",
            "1",
            "--top",
            "3",
            "--save",
            str(saved),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "2 sampled step(s)" in out
    assert out.count("(sampled)") == 2
    assert out.count("(structure pass)") == 1
    assert f"Profile written to {saved}" in out
    assert "step 1 is wandb_modprof's structure pass, it samples every later step" in out
    # not a terminal: one plain line per step, no bar redrawn with \r
    assert "\r" not in out
    assert "  step   3/3  loss " in out
    # the watch() warning about the missing entity is replaced by the demo's own notice
    assert "has no W&B entity" not in proc.stderr
    prof = wandb_modprof.load(saved)
    assert prof.num_samples == 2
    assert len(prof.structures()) == 1
    assert any(r["node_kind"] == "self" for r in prof.table().resolved())
    page = saved.with_name("demo.html")
    assert f"HTML report written to {page}" in out
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and "<title>GPT2LMHeadModel profile</title>" in text
    assert '"node_kind"' in text and "transformer.h.0#0" in text  # the table rows are inlined
    # the top modules: each table is, to the byte, what the command printed above it gives
    for key, what in _demo.DEMO_MODES:
        command = f"`wandb-modprof summary {saved} --mode {key}`"
        assert f"{what}: {command}\n" in out
        table = out.split(f"{what}: {command}\n")[1].split("\n\n")[0] + "\n"
        # the command run here, in this process (test_commands_in_a_subprocess runs `summary`
        # as its own process): a fresh interpreter per mode cost seconds of torch imports
        capsys.readouterr()
        assert wandb_modprof_cli.main(["summary", str(saved), "--mode", key, "--top", "3"]) == 0
        assert table == capsys.readouterr().out
        assert f"mode {key} (" in table  # labelled in both: the mode and its label
    trace = saved.with_name("demo.trace.json")
    assert f"Trace of the last sampled step written to {trace}" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(ev.get("name") == "transformer.h.0.backward" for ev in events)
    # an offline W&B run next to the profile (WANDB_MODE=offline here), one table per sample
    (run_dir,) = (saved.parent / "wandb").glob("offline-run-*")
    assert f"W&B offline run (modprof/GPT2LMHeadModel) written to {run_dir}" in out
    assert f"wandb sync {run_dir}" in out
    tables = list((run_dir / "files/media/table/modprof").glob("GPT2LMHeadModel_table_*.json"))
    assert len(tables) == 2


def test_cli_rejects_bad_arguments():
    proc = subprocess.run(
        [sys.executable, "-m", "wandb_modprof", "demo", "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "expected an integer >= 1, got 0" in proc.stderr


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_demo_progress_is_one_bar_on_a_terminal():
    out = _Tty()
    progress = _demo._Progress(steps=4, log_freq=2, out=out)
    for step in range(1, 5):
        progress.step(step, 1.0 / step)
    text = out.getvalue()
    assert "\n" not in text[:-1] and text.endswith("\n")  # one line, redrawn
    frames = text.rstrip("\n").split("\r")[1:]
    assert len(frames) == 5  # step 0 (before the structure pass) and steps 1-4
    assert frames[0].startswith("  [" + "-" * 30 + "] 0/4  samples 0")
    assert frames[-1].startswith("  [" + "#" * 30 + "] 4/4  loss 0.2500  samples 2")
    assert progress.samples == 2  # steps 2 and 4 (step 1 is the structure pass)


def test_demo_progress_is_one_line_per_step_otherwise():
    out = io.StringIO()
    progress = _demo._Progress(steps=3, log_freq=1, out=out)
    for step in range(1, 4):
        progress.step(step, 2.0)
    assert out.getvalue().splitlines() == [
        "  step   1/3  loss 2.0000 (structure pass)",
        "  step   2/3  loss 2.0000 (sampled)",
        "  step   3/3  loss 2.0000 (sampled)",
    ]


def test_an_interrupt_while_starting_is_one_line_and_130(monkeypatch, capsys):
    """Ctrl-C before a command runs (building the parser, parsing, its imports): no traceback."""
    from wandb_modprof.api import cli

    def interrupted() -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    try:
        status = cli.main(["summary", "p.modprof.json"])
    except KeyboardInterrupt:  # would end the whole pytest session
        pytest.fail("KeyboardInterrupt escaped main() (a traceback for the user)")
    assert status == cli.EXIT_INTERRUPTED
    out, err = capsys.readouterr()
    assert (out, err) == ("", "wandb-modprof: error: interrupted\n")


def test_a_fifo_given_as_the_profile_fails_at_once(tmp_path, capsys):
    from wandb_modprof.api import cli

    fifo = tmp_path / "p.modprof.json"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "wandb_modprof", "summary", str(fifo)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == cli.EXIT_INPUT, proc.stderr
    assert proc.stderr == (
        f"wandb-modprof: error: cannot load {str(fifo)!r}: it is a FIFO (named pipe); "
        "expected a regular file\n"
    )


ROOT = Path(__file__).resolve().parents[2]


# Installed in the child through `sitecustomize`: the first `import torch` marks a file and
# then sleeps, so the Ctrl-C lands inside the heavy import however fast this machine imports
# torch (a fixed delay raced a warm page cache: the command finished before the signal).
_SLOW_TORCH = """
import importlib.abc, pathlib, sys, time

class _SlowTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            pathlib.Path({marker!r}).write_text("importing torch")
            time.sleep(60)
        return None

sys.meta_path.insert(0, _SlowTorch())
"""


def _console(argv: list[str], entry: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run `entry` (`module:function`) as the console script does; Ctrl-C while it imports
    torch."""
    module, function = entry.split(":")
    marker = tmp_path / "importing-torch"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SLOW_TORCH.format(marker=str(marker)))
    # Ctrl-C as in a terminal (Python's own handler): a job started in the background by a
    # shell without job control (`cmd &` in a script) inherits SIGINT ignored, and the
    # interrupt would never reach the child
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"from {module} import {function} as f; sys.exit(f())"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert marker.exists(), "the child never began importing torch"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_an_interrupt_while_torch_imports_is_one_line_and_130(tmp_path: Path) -> None:
    """The console script's module imports nothing heavy: a Ctrl-C during `import wandb_modprof`
    (torch: seconds) is caught there. Importing the CLI first (`wandb_modprof.api.cli:main`, the
    entry point before) printed a traceback from inside torch."""
    # (tomllib is Python 3.11+; the package supports 3.10)
    pyproject = (ROOT / "pyproject.toml").read_text("utf-8")
    (entry,) = re.findall(r'^wandb-modprof = "([^"]+)"$', pyproject, re.MULTILINE)
    assert entry == "wandb_modprof_cli:main"
    # a command imports the package (`--help` does not: test_help_imports_no_torch)
    done = _console(["summary", "missing.modprof.json"], entry, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (
        130,
        "",
        "wandb-modprof: error: interrupted\n",
    ), done.stderr[-800:]


def test_help_imports_no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`wandb-modprof --help`, no command and an unknown command are answered by the console
    command's module alone (under a second), with the full parser's words."""
    code = (
        "import contextlib, io, sys, wandb_modprof_cli as cli\n"
        "for argv in (['--help'], [], ['bogus']):\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        status = cli.main(argv)\n"
        "    print(repr((status, out.getvalue(), err.getvalue())))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'wandb_modprof')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"},
    )
    assert proc.returncode == 0, proc.stderr
    *answers, imported = proc.stdout.splitlines()
    assert imported == "[]"
    from wandb_modprof.api import cli

    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps help to the terminal's width
    for line, argv in zip(answers, (["--help"], [], ["bogus"]), strict=True):
        # the same parser with each command's options: the same answer
        parser = cli.build_parser()
        out, err = io.StringIO(), io.StringIO()
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            pytest.raises(SystemExit) as exit_,
        ):
            parser.parse_args(argv)
        assert line == repr((exit_.value.code, out.getvalue(), err.getvalue()))
