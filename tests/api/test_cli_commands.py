"""`wandb-modprof report / summary / compare` on profile files made here, and every error path
with its exit status (0 ok, 1 a regression (`compare --fail-above`), 2 usage or bad input,
3 internal error, 130 interrupted)."""

from __future__ import annotations

import html
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from models import ResNet, TinyGPT, gpt_input, resnet_input
from torch import nn

import wandb_modprof
from wandb_modprof.api import cli as _cli
from wandb_modprof.records.modes import MODE_KEYS, mode
from wandb_modprof.sinks.report import html as _html
from wandb_modprof.sinks.text import summary as _summary
from wandb_modprof.sinks.text import values as _values
from wandb_modprof.sinks.text.compare import compare


def _profile(model: nn.Module, x: torch.Tensor, steps: int = 3) -> wandb_modprof.Profile:
    """A `profile` block around `steps` training steps (the second is the structure pass)."""
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            model(x).float().pow(2).mean().backward()
    return prof


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Profile files: ResNet at batch 8 and 16, TinyGPT with 2 and 3 blocks, one without
    samples; saved once for the module (profiling is the slow part)."""
    folder = tmp_path_factory.mktemp("profiles")
    torch.manual_seed(0)
    resnet = ResNet()
    made = {
        "resnet": _profile(resnet, resnet_input(batch=8)),
        "resnet16": _profile(resnet, resnet_input(batch=16)),
        "gpt2": _profile(TinyGPT(layers=2), gpt_input()),
        "gpt3": _profile(TinyGPT(layers=3), gpt_input()),
    }
    empty = TinyGPT(layers=2)
    with wandb_modprof.profile(empty) as prof:
        empty(gpt_input())  # no sample: its backward never ran inside the block; a graph
    assert prof.num_samples == 0 and prof.structures()
    made["empty"] = prof
    return {name: prof.save(folder / f"{name}.modprof.json") for name, prof in made.items()}


def _module_rows(path: Path) -> list[dict[str, Any]]:
    """The node rows of kind module of a profile's table, computed here without the CLI."""
    records = wandb_modprof.load(path).table().resolved()
    return [r for r in records if r["row_kind"] == "node" and r["node_kind"] == "module"]


def _total(path: Path, meta_key: str) -> float:
    records = wandb_modprof.load(path).table().resolved()
    (row,) = [r for r in records if r["row_kind"] == "meta" and r["meta_key"] == meta_key]
    return float(row["meta_number"])


def _table_lines(out: str, header_start: str) -> list[list[str]]:
    """The rows (split on runs of 2+ spaces) of the first table whose header starts so."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(header_start))
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("  ") or line.startswith("  ..."):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def _spec_of(page: str) -> dict[str, Any]:
    found = re.search(
        rf'<script type="application/json" id="{_html.SPEC_ID}">(.*?)</script>', page, re.S
    )
    assert found is not None
    spec: dict[str, Any] = json.loads(found.group(1))
    return spec


def _signal(spec: dict[str, Any], name: str) -> Any:
    (signal,) = [s for s in spec["signals"] if s["name"] == name]
    return signal["value"]


# ---- summary -------------------------------------------------------------------------------
def test_summary_ranks_module_calls_of_the_mode(files, capsys):
    path = files["resnet"]
    assert _cli.main(["summary", str(path), "--mode", "bwd", "--top", "4"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    out = captured.out
    total = _total(path, "total_bwd_ms")
    assert out.startswith("wandb_modprof profile of ResNet: 2 sampled step(s); mode bwd")
    assert f"model total {_summary.format_value('ms', total)}" in out
    m = mode("bwd")
    expected = sorted(
        ((m.value(r), r) for r in _module_rows(path) if m.value(r) is not None),
        key=lambda vr: vr[0] or 0.0,
        reverse=True,
    )[:4]
    rows = _table_lines(out, "#  module")
    assert [r[1] for r in rows] == [r["node_key"] for _, r in expected]
    for (rank, key, type_, calls, value, share), (v, r) in zip(rows, expected, strict=True):
        assert key == r["node_key"] and type_ == r["module_type"] and calls == "1"
        assert rank == str(expected.index((v, r)) + 1)
        assert value == _summary.format_value("ms", v)
        assert share == f"{(v or 0.0) / total:.1%}"
    assert "top 4 of 56 module calls" in out


@pytest.mark.parametrize("key", MODE_KEYS)
def test_summary_runs_in_every_mode(files, capsys, key):
    assert _cli.main(["summary", str(files["gpt2"]), "--mode", key]) == 0
    out = capsys.readouterr().out
    assert f"mode {key} ({mode(key).label})" in out
    # optimizer state without optimizer=; rank imbalance in one process (peaks are measured
    # on CPU too, from the memory curve)
    if key in ("optim", "imbalance"):
        assert f"no module has a value in mode {key} (not measured in this profile)" in out
    elif key == "load":  # the members of the model's module lists only: its blocks
        lines = _table_lines(out, "#  module")
        assert len(lines) >= 2 and all(re.search(r"\.\d+#\d+$", line[1]) for line in lines)
        assert sum(float(line[-1].rstrip("%")) for line in lines) == pytest.approx(100, abs=1)
    else:
        assert len(_table_lines(out, "#  module")) == 15


def test_summary_counts_calls_of_a_reused_module(tmp_path, capsys):
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.lin(torch.relu(self.lin(x)))
            return out

    path = _profile(Twice(), torch.randn(4, 8)).save(tmp_path / "twice.modprof.json")
    assert _cli.main(["summary", str(path), "--mode", "param"]) == 0
    rows = _table_lines(capsys.readouterr().out, "#  module")
    assert sorted(r[1] for r in rows) == ["lin#0", "lin#1"]
    assert {r[3] for r in rows} == {"2"}  # calls per step of that module
    assert {r[4] for r in rows} == {_summary.format_value("bytes", (64 + 8) * 4)}


def test_summary_of_a_profile_without_samples(files, capsys):
    assert _cli.main(["summary", str(files["empty"])]) == 0
    out = capsys.readouterr().out
    assert "0 sampled step(s)" in out
    assert "no module has a value in mode fwd_bwd (no sampled steps)" in out


def test_format_value_writes_units_like_the_panel():
    fv = _summary.format_value
    assert fv("ms", None) == "-"
    assert fv("ms", 0.5) == "500 µs" and fv("ms", 12.345) == "12.3 ms" and fv("ms", 2500) == "2.5 s"
    assert fv("bytes", 512) == "512 B" and fv("bytes", 3 * 1024**2) == "3 MiB"
    assert fv("bytes", 1536) == "1.5 KiB" and fv("bytes", 5 * 1024**3) == "5 GiB"
    assert fv("flops", 4.27e8) == "427 MFLOP" and fv("flop_s", 2e12) == "2 TFLOP/s"
    assert fv("flops", 12) == "12 FLOP" and fv("norm", 20.6612) == "20.66"


# ---- report --------------------------------------------------------------------------------
def test_report_writes_the_html_and_prints_its_path(files, tmp_path, capsys):
    out = tmp_path / "r.html"
    argv = ["report", str(files["resnet"]), "-o", str(out), "--mode", "bwd", "--scale", "log"]
    assert _cli.main([*argv, "--title", "My <run>"]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>")
    assert f"<title>{html.escape('My <run>')}</title>" in page
    spec = _spec_of(page)
    assert _signal(spec, "mode") == "bwd" and _signal(spec, "scale_type") == "log"
    assert _signal(spec, "compare") is False


def test_report_default_output_is_beside_the_profile(files, capsys):
    assert _cli.main(["report", str(files["gpt2"])]) == 0
    expected = files["gpt2"].with_name("gpt2.html")
    assert capsys.readouterr().out == f"{expected}\n"
    page = expected.read_text(encoding="utf-8")
    assert "<title>TinyGPT profile</title>" in page
    assert _signal(_spec_of(page), "mode") == "fwd_bwd"


# ---- compare -------------------------------------------------------------------------------
def test_compare_ratios_match_the_profiles(files, capsys):
    a, b = files["resnet"], files["resnet16"]
    assert _cli.main(["compare", str(a), str(b), "--mode", "fwd", "--top", "100"]) == 0
    out = capsys.readouterr().out
    m = mode("fwd")
    va = {r["node_key"]: m.value(r) for r in _module_rows(a)}
    vb = {r["node_key"]: m.value(r) for r in _module_rows(b)}
    assert va.keys() == vb.keys() and len(va) == 56
    ratios = {k: vb[k] / va[k] for k in va if va[k] and vb[k]}  # type: ignore[operator]
    ta, tb = _total(a, "total_fwd_ms"), _total(b, "total_fwd_ms")
    assert out.startswith(
        "wandb_modprof compare, mode fwd (Forward): A = resnet (ResNet), "
        "B = resnet16 (ResNet); ratio = B / A\n"
    )
    assert f"model total: A {_summary.format_value('ms', ta)}, B " in out
    assert f"ratio {_summary.format_value('ratio', tb / ta)}" in out  # one unit formatter
    rows = _table_lines(out, "module")
    assert len(rows) == 56
    shown = {key: ratio for key, _type, _a, _b, ratio in rows}
    for key, value in ratios.items():
        assert shown[key] == _summary.format_value("ratio", value), key
    ranked = [key for key, *_ in rows if key in ratios]
    logs = [abs(math.log(ratios[k])) for k in ranked]
    assert logs == sorted(logs, reverse=True)
    assert "only in" not in out


def test_compare_of_two_different_models_says_so(files, capsys):
    """A ResNet against TinyGPT: no call in common. The comparison says the models differ and
    that there is nothing to compare call by call, instead of "the 0 that changed most"."""
    a, b = files["resnet"], files["gpt2"]
    assert _cli.main(["compare", str(a), str(b), "--mode", "fwd"]) == 0
    out = capsys.readouterr().out
    assert "NOTE: A and B are different models (ResNet, TinyGPT): 0 module calls in common" in out
    assert "no module call in both: nothing to compare call by call" in out
    assert "that changed most" not in out and "only in A" in out and "only in B" in out


def test_compare_lists_calls_found_in_one_profile_only(files, capsys):
    a, b = files["gpt2"], files["gpt3"]
    assert _cli.main(["compare", str(a), str(b), "--mode", "param", "--top", "3"]) == 0
    out = capsys.readouterr().out
    only_b = sorted(r["node_key"] for r in _module_rows(b) if r["node_key"].startswith("blocks.2"))
    assert len(only_b) == 10  # the block, ln1, attn, qkv, proj, ln2, mlp, up, act, down
    assert f"only in B ({len(only_b)} module calls):" in out
    assert "  ... and 7 more" in out
    assert "only in A" not in out
    # parameters of a block are the same in both: ratio 1 for the matched blocks
    c = compare(wandb_modprof.load(a), wandb_modprof.load(b), "param")
    assert {m.key for m in c.only_b} == set(only_b) and not c.only_a
    block0 = next(m for m in c.matched if m.key == "blocks.0#0")
    assert block0.ratio == 1.0
    assert c.total_ratio == pytest.approx(
        _total(b, "total_param_bytes") / _total(a, "total_param_bytes")
    )


def test_compare_without_a_mode_total_and_without_ratios(files, capsys):
    a, b = files["gpt2"], files["empty"]
    assert _cli.main(["compare", str(a), str(b), "--mode", "param_norm", "--top", "2"]) == 0
    assert "model total: mode param_norm has none" in capsys.readouterr().out
    c = compare(wandb_modprof.load(a), wandb_modprof.load(b), "fwd")
    assert c.matched and all(m.ratio is None and m.b is None for m in c.matched)
    assert c.total_b is None and c.total_ratio is None


def test_compare_html_opens_in_compare_mode(files, tmp_path, capsys):
    out = tmp_path / "cmp.html"
    argv = ["compare", str(files["resnet"]), str(files["resnet16"]), "--html", str(out)]
    assert _cli.main([*argv, "--mode", "act"]) == 0
    text = capsys.readouterr().out
    assert f"HTML report (compare mode, baseline resnet) written to {out}" in text
    spec = _spec_of(out.read_text(encoding="utf-8"))
    assert _signal(spec, "compare") is True and _signal(spec, "mode") == "act"


def test_compare_labels_files_of_the_same_name_by_path(files, tmp_path, capsys):
    other = tmp_path / "resnet.modprof.json"
    other.write_bytes(files["resnet16"].read_bytes())
    assert _cli.main(["compare", str(files["resnet"]), str(other), "--top", "1"]) == 0
    assert f"A = {files['resnet']} (ResNet), B = {other} (ResNet)" in capsys.readouterr().out


# ---- errors and exit status ------------------------------------------------------------------
def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2) -> str:
    assert _cli.main(argv) == status
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


@pytest.mark.parametrize("command", ["summary", "report"])
def test_a_missing_profile_file(tmp_path, capsys, command):
    missing = tmp_path / "no-such-dir" / "nope.modprof.json"
    err = _fails([command, str(missing)], capsys)
    assert err == f"wandb-modprof: error: cannot load {str(missing)!r}: No such file or directory\n"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"not json at all", "not valid JSON"),
        (b'{"columns": ["a"], "data": [[1]]}', "not a wandb_modprof profile"),  # a W&B table
        (b'{"traceEvents": []}', "not a wandb_modprof profile"),  # a Chrome trace
        (b"[1, 2, 3]", "cannot load"),
        (b"\xff\xfe", "not UTF-8 text"),
    ],
)
def test_a_file_that_is_not_a_profile(tmp_path, capsys, content, problem):
    path = tmp_path / "bad.modprof.json"
    path.write_bytes(content)
    for argv in (["summary", str(path)], ["report", str(path)], ["compare", str(path), str(path)]):
        err = _fails(argv, capsys)
        assert err.startswith(f"wandb-modprof: error: cannot load {str(path)!r}: ")
        assert problem in err and err.count("\n") == 1


def test_a_truncated_profile_file(files, tmp_path, capsys):
    path = tmp_path / "cut.modprof.json"
    raw = files["resnet"].read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    err = _fails(["summary", str(path)], capsys)
    assert "not valid JSON" in err
    # valid JSON but a field cut away: the schema check names it
    doc = json.loads(raw)
    del doc["last_sample"]
    path.write_text(json.dumps(doc))
    err = _fails(["compare", str(files["resnet"]), str(path)], capsys)
    assert f"cannot load {str(path)!r}" in err and "last_sample" in err


def test_a_directory_as_profile(tmp_path, capsys):
    err = _fails(["summary", str(tmp_path)], capsys)
    assert err.startswith(f"wandb-modprof: error: cannot load {str(tmp_path)!r}")


def test_an_unknown_mode_lists_the_valid_ones(files, capsys):
    for command in (["summary", str(files["gpt2"])], ["report", str(files["gpt2"])]):
        err = _fails([*command, "--mode", "speed"], capsys)
        assert "argument --mode: invalid choice: 'speed'" in err
        assert all(repr(key) in err for key in MODE_KEYS)
    with pytest.raises(wandb_modprof.ModProfError, match=r"mode expected one of 'fwd', 'bwd'"):
        _values.mode_values(wandb_modprof.load(files["gpt2"]), "speed")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["flame"], "invalid choice: 'flame'"),
        (["summary"], "the following arguments are required: PROFILE"),
        (["compare", "a.json"], "the following arguments are required: B"),
        (["summary", "x.json", "--top", "0"], "expected an integer >= 1, got 0"),
        (["summary", "x.json", "--top", "many"], "expected an integer >= 1, got 'many'"),
        (["report", "x.json", "--scale", "sqrt"], "invalid choice: 'sqrt'"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, message):
    err = _fails(argv, capsys)
    assert message in err and err.startswith("usage: wandb-modprof")
    # the usage, then one line in the README's form, from a subcommand too
    (line,) = [text for text in err.splitlines() if "error:" in text]
    assert line.startswith("wandb-modprof: error: ") and message in line


def test_unwritable_outputs_fail_before_any_work(files, tmp_path, capsys):
    profile = str(files["gpt2"])
    missing_dir = tmp_path / "no" / "such" / "r.html"
    err = _fails(["report", profile, "-o", str(missing_dir)], capsys)
    assert err == (
        f"wandb-modprof: error: cannot write report {str(missing_dir)!r}: directory "
        f"{str(missing_dir.parent)!r} does not exist\n"
    )
    err = _fails(["report", profile, "-o", str(tmp_path)], capsys)
    assert err == (
        f"wandb-modprof: error: report {str(tmp_path)!r} is a directory; expected a file path\n"
    )
    # compare checks --html before it loads or prints anything
    err = _fails(["compare", profile, profile, "--html", str(missing_dir)], capsys)
    assert "does not exist" in err
    err = _fails(["demo", "--save", str(tmp_path)], capsys)
    assert err == (
        f"wandb-modprof: error: --save {str(tmp_path)!r} is a directory; expected a file path\n"
    )


def test_an_unwritable_report_is_an_input_error(files, tmp_path, capsys):
    profile = str(files["gpt2"])
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        try:
            err = _fails(["report", profile, "-o", str(folder / "r.html")], capsys)
        finally:
            folder.chmod(0o700)
        assert "permission denied" in err
    elif Path("/proc/version").exists():  # root writes anywhere, but not to this file
        err = _fails(["report", profile, "-o", "/proc/version"], capsys)
        assert err.startswith("wandb-modprof: error: ") and "cannot write '/proc/version'" in err
    else:
        pytest.skip("no file here that this user cannot write")


def test_an_internal_error_exits_3_with_the_traceback(files, capsys, monkeypatch):
    def broken(*args: object) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(_summary, "format_mode_summary", broken)
    err = _fails(["summary", str(files["gpt2"])], capsys, status=3)
    assert "Traceback (most recent call last)" in err
    assert err.endswith(
        "wandb-modprof: error: internal error (RuntimeError: boom); this is a bug in "
        "wandb_modprof: please report it with the traceback above\n"
    )


def test_an_interrupt_exits_130(files, capsys, monkeypatch):
    def interrupted(*args: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(_values, "mode_values", interrupted)
    assert _fails(["summary", str(files["gpt2"])], capsys, status=130) == (
        "wandb-modprof: error: interrupted\n"
    )


EXIT_STATUS_ROWS = [
    "  0    success",
    "  1    compare --fail-above: a module call regressed",
    "  2    usage or input error",
    "  3    internal error",
    "  130  interrupted (Ctrl-C)",
    'Errors are one line on stderr: "wandb-modprof: error: ...".',
]


def test_help_documents_the_exit_status_once(capsys):
    """The exit statuses are the same for every command: the overview lists them, once; each
    command's help points there instead of repeating them."""
    assert _cli.main(["--help"]) == 0
    overview = capsys.readouterr().out
    for command in ("demo", "report", "summary", "compare", "register-chart"):
        # each command once: one table row (name, then two spaces or the end of the line)
        assert len(re.findall(rf"^ *{command}(  |$)", overview, re.MULTILINE)) == 1, overview
    assert ", ".join(MODE_KEYS) in overview
    helps = {}
    for command in ("demo", "report", "summary", "compare", "register-chart"):
        assert _cli.main([command, "--help"]) == 0
        helps[command] = capsys.readouterr().out
        assert "exit status: see `wandb-modprof --help`" in helps[command]
        if command in ("report", "summary", "compare"):  # the commands that take --mode
            assert f"analysis modes (--mode): {', '.join(MODE_KEYS)}" in helps[command]
        else:  # no --mode: no list of modes
            assert "--mode" not in helps[command] and "analysis modes" not in helps[command]
    everything = "\n".join([overview, *helps.values()])
    assert everything.count("\nexit status:\n") == 1 and "\nexit status:\n" in overview
    for row in EXIT_STATUS_ROWS:
        assert everything.count(row) == 1 and row in overview, row


# ---- as a user runs it ----------------------------------------------------------------------
def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wandb_modprof", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=dict(os.environ, PYTHONIOENCODING="utf-8"),
    )


def test_commands_in_a_subprocess(files, tmp_path):
    proc = _run("summary", str(files["resnet"]), "--mode", "act", "--top", "3")
    assert proc.returncode == 0, proc.stderr
    assert "mode act (Activations), model total " in proc.stdout
    assert len(_table_lines(proc.stdout, "#  module")) == 3
    report = tmp_path / "r.html"
    proc = _run("report", str(files["resnet"]), "-o", str(report))
    assert (proc.returncode, proc.stdout) == (0, f"{report}\n"), proc.stderr
    assert report.read_text(encoding="utf-8").startswith("<!doctype html>")
    proc = _run("compare", str(files["gpt2"]), str(files["gpt3"]), "--top", "2")
    assert proc.returncode == 0, proc.stderr
    assert "only in B (10 module calls):" in proc.stdout
    proc = _run("summary", str(tmp_path / "missing.modprof.json"))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("wandb-modprof: error: cannot load ")
    proc = _run("summary", str(files["resnet"]), "--mode", "speed")
    assert proc.returncode == 2 and "invalid choice: 'speed'" in proc.stderr


def test_the_console_script(files):
    script = Path(sys.executable).with_name("wandb-modprof")
    if not script.exists():
        pytest.skip("the wandb-modprof console script is not installed beside this Python")
    proc = subprocess.run(
        [str(script), "summary", str(files["gpt2"]), "--top", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "top 1 of " in proc.stdout
