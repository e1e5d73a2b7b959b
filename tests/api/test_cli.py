"""The README's main job, run the way a user runs it."""

from __future__ import annotations

import ast
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

    monkeypatch.setattr(wandb_modprof_cli, "build_parser", interrupted)
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


# Answered by the console command's module alone: every --help, no command, an unknown command,
# a usage error of each command (before any file is opened).
NO_PACKAGE_NEEDED = [
    ["--help"],
    [],
    ["bogus"],
    *([name, "--help"] for name in wandb_modprof_cli.COMMANDS),
    *([name, "-h"] for name in wandb_modprof_cli.COMMANDS),
    ["summary"],
    ["summary", "x.modprof.json", "--top", "0"],
    ["report", "x.modprof.json", "--mode", "speed"],
    ["compare", "a.modprof.json"],
    ["compare", "a.modprof.json", "b.modprof.json", "--fail-above", "0.5"],
    ["demo", "--steps", "0"],
    ["register-chart", "--bogus"],
]


def test_help_imports_no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`wandb-modprof --help`, `wandb-modprof COMMAND --help`, no command, an unknown command
    and usage errors import neither torch nor the package (a fresh interpreter: nothing is
    imported before), and answer as `python -m wandb_modprof` does (`wandb_modprof.api.cli`)."""
    code = (
        "import contextlib, io, json, sys, wandb_modprof_cli as cli\n"
        "answers = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        status = cli.main(argv)\n"
        "    answers.append([status, out.getvalue(), err.getvalue()])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'wandb_modprof'))\n"
        "print(json.dumps([answers, heavy]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(NO_PACKAGE_NEEDED)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"},
    )
    assert proc.returncode == 0, proc.stderr
    answers, imported = json.loads(proc.stdout)
    assert imported == []
    from wandb_modprof.api import cli

    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps help to the terminal's width
    for (status, out, err), argv in zip(answers, NO_PACKAGE_NEEDED, strict=True):
        assert status == (0 if "--help" in argv or "-h" in argv else cli.EXIT_INPUT), argv
        assert (out if status == 0 else err).startswith("usage: wandb-modprof"), argv
        with (
            contextlib.redirect_stdout(io.StringIO()) as out2,
            contextlib.redirect_stderr(io.StringIO()) as err2,
        ):
            assert cli.main(argv) == status
        assert (out, err) == (out2.getvalue(), err2.getvalue()), argv


def test_the_values_copied_into_the_help_are_the_packages() -> None:
    """`wandb_modprof_cli` copies the values its help shows (importing them would import
    torch); each copy is the package's value."""
    from wandb_modprof.records import modes
    from wandb_modprof.sinks import spec

    assert wandb_modprof_cli.MODE_KEYS == modes.MODE_KEYS
    assert wandb_modprof_cli.DEFAULT_MODE == modes.DEFAULT_MODE
    assert wandb_modprof_cli.SCALES == modes.SCALES
    assert wandb_modprof_cli.DEFAULT_SCALE == modes.DEFAULT_SCALE
    assert wandb_modprof_cli.CHART_NAME == spec.CHART_NAME


def test_every_command_in_the_table_has_an_implementation() -> None:
    from wandb_modprof.api import cli_commands

    assert list(cli_commands.COMMANDS) == list(wandb_modprof_cli.COMMANDS)


# ---- the imports go one way -----------------------------------------------------------------
def _modules() -> dict[str, Path]:
    """The package's modules and the console command's module, by name."""
    found = {"wandb_modprof_cli": ROOT / "wandb_modprof_cli.py"}
    for path in (ROOT / "wandb_modprof").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that importing `name` runs: every import in the file, also those
    inside functions and under TYPE_CHECKING (a lazy import is an edge of a cycle too), with
    the packages above each (importing `a.b.c` runs `a` and `a.b` first)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: list[str] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    found = set()
    for target in targets:
        parts = target.split(".")
        found |= {".".join(parts[:n]) for n in range(1, len(parts) + 1)} & known
    return found - {name}


def _reachable(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = list(edges[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += edges[module]
    return seen


def test_no_import_cycle_between_the_console_command_and_the_package() -> None:
    """`wandb_modprof.api.cli` imports `wandb_modprof_cli`, which runs the commands of
    `wandb_modprof.api.cli_commands`: nothing `wandb_modprof_cli` imports, however late,
    leads back to it (before, it imported `wandb_modprof.api.cli`, which imports it)."""
    modules = _modules()
    edges = {name: _imported(name, path, set(modules)) for name, path in modules.items()}
    top, cli, commands = (
        "wandb_modprof_cli",
        "wandb_modprof.api.cli",
        "wandb_modprof.api.cli_commands",
    )
    assert top in edges[cli]  # the package's name for the command line is the console module
    assert commands in edges[top]  # which runs the implementations
    assert top not in _reachable(top, edges)
    assert cli not in _reachable(top, edges)
    assert not {top, cli} & _reachable(commands, edges)


def test_the_cycle_check_sees_lazy_imports(tmp_path: Path) -> None:
    late = tmp_path / "late.py"
    late.write_text("def f():\n    from wandb_modprof.api.cli import main\n")
    known = {"wandb_modprof", "wandb_modprof.api", "wandb_modprof.api.cli"}
    assert _imported("late", late, known) == known
    edges = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _reachable("a", edges) == {"a", "b"} and "c" not in _reachable("a", edges)
