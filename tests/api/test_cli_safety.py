"""The CLI keeps its inputs and the terminal safe: an output that is an input (the same path,
another spelling, a symlink, a hard link) is refused before anything is written, and names from
a file are printed escaped, on any stdout encoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import wandb_modprof
from wandb_modprof.api import cli as _cli

TITLE_AND_RED = "\x1b]0;owned\x07\x1b[31mRED"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two small profiles, and one whose model name and module names are hostile or odd."""
    folder = tmp_path_factory.mktemp("profiles")
    torch.manual_seed(0)
    out = {}
    for name, width in (("a", 4), ("b", 8)):
        model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
        model._modules["a\x1bb"] = nn.Linear(2, 2)
        model._modules["注意\ud800"] = nn.Linear(2, 2)
        with wandb_modprof.profile(model) as prof:
            for _ in range(2):
                model(torch.randn(3, 4)).sum().backward()
        out[name] = prof.save(folder / f"{name}.modprof.json")
    data = json.loads(out["a"].read_text(encoding="utf-8"))
    for model_name, key in ((TITLE_AND_RED, "red"), ("\udfff", "surrogate")):
        data["model_name"] = model_name
        out[key] = folder / f"{key}.modprof.json"
        out[key].write_text(json.dumps(data), encoding="utf-8")  # ensure_ascii: valid JSON
    return out


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *kept: Path) -> None:
    before = [p.read_bytes() for p in kept]
    assert _cli.main(argv) == _cli.EXIT_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wandb-modprof: error: report "), lines
    assert "is the input profile" in lines[0]
    assert [p.read_bytes() for p in kept] == before  # byte-identical


def _links(tmp_path: Path, target: Path) -> list[Path]:
    """`target` by another spelling, by a symlink and by a hard link."""
    (tmp_path / "sub").mkdir(exist_ok=True)
    symlink, hardlink = tmp_path / "sym.html", tmp_path / "hard.html"
    symlink.symlink_to(target)
    os.link(target, hardlink)
    return [tmp_path / "sub" / ".." / target.name, symlink, hardlink]


def test_report_refuses_to_write_over_its_input(saved, tmp_path, capsys):
    profile = tmp_path / "p.modprof.json"
    profile.write_bytes(saved["a"].read_bytes())
    for output in [profile, *_links(tmp_path, profile)]:
        _refused(capsys, ["report", str(profile), "-o", str(output)], profile)
    assert wandb_modprof.load(profile).num_samples == 1


def test_compare_refuses_to_write_its_report_over_an_input(saved, tmp_path, capsys):
    a, b = tmp_path / "a.modprof.json", tmp_path / "b.modprof.json"
    a.write_bytes(saved["a"].read_bytes())
    b.write_bytes(saved["b"].read_bytes())
    for output in [a, b, *_links(tmp_path, b)]:
        _refused(capsys, ["compare", str(a), str(b), "--html", str(output)], a, b)
    # a new path still works
    assert _cli.main(["compare", str(a), str(b), "--html", str(tmp_path / "ab.html")]) == 0


@pytest.mark.parametrize("key", ["red", "surrogate"])
def test_summary_and_compare_print_names_escaped(saved, capsys, key):
    for argv in (["summary", str(saved[key])], ["compare", str(saved[key]), str(saved["b"])]):
        assert _cli.main(argv) == _cli.EXIT_OK, capsys.readouterr().err
        out = capsys.readouterr().out
        assert not any(c < " " and c != "\n" for c in out), repr(out)
        out.encode("utf-8")  # no lone surrogate reaches the terminal
        assert "a\\x1bb#0" in out and "注意\\ud800#0" in out
        shown = "\\x1b]0;owned\\x07\\x1b[31mRED" if key == "red" else "\\udfff"
        assert f"profile of {shown}:" in out or f"({shown})" in out


def test_summary_on_a_terminal_that_cannot_encode_a_name(saved):
    proc = subprocess.run(
        [sys.executable, "-m", "wandb_modprof", "summary", str(saved["surrogate"])],
        capture_output=True,
        timeout=120,
        check=False,
        env=dict(os.environ, PYTHONIOENCODING="ascii"),
    )
    assert proc.returncode == 0, proc.stderr.decode("ascii", "replace")
    out = proc.stdout.decode("ascii")
    assert "profile of \\udfff:" in out
    assert "\\u6ce8\\u610f\\ud800#0" in out  # CJK kept by the escaping, then written as ascii


def test_the_garbage_collection_note_prints_names_escaped(tmp_path, capsys):
    """The summary's note naming calls whose sample held a garbage collection prints their
    keys escaped like every other name (it printed a raw ESC whenever a collection happened to
    land in the odd-named call: the test above failed at random)."""
    from models import Pausing

    junk = [[i] for i in range(200_000)]  # tracked objects: the forced collection takes ms
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    model._modules["a\x1bb"] = Pausing(4)
    with wandb_modprof.profile(model) as prof:
        for step in range(3):  # sampled, structure pass, sampled with the collection
            model._modules["a\x1bb"].collect_next = step == 2
            model(torch.randn(3, 4)).sum().backward()
    del junk
    path = prof.save(tmp_path / "gc.modprof.json")
    assert _cli.main(["summary", str(path)]) == _cli.EXIT_OK
    out = capsys.readouterr().out
    assert "left out by the median: a\\x1bb#0" in out, out  # the note is there, escaped
    assert not any(c < " " and c != "\n" for c in out), repr(out)
