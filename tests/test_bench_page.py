"""tools/bench_page.py assembles docs/performance.md from stored benchmark results.

Runs the generator on fixture results in a temporary folder (no benchmark is run: running one
is replaced by a stub), and checks that the benchmarks and tools print and document commands
relative to the repository root.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench_page() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_page", ROOT / "tools" / "bench_page.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_page"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def result(name: str, output: list[str], command: str) -> dict[str, Any]:
    return {
        "name": name,
        "command": command,
        "date": "2026-01-02 03:04 UTC",
        "cpu": "Test CPU 9000",
        "cores": 2,
        "load_start": [1.25, 0.5, 0.25],
        "load_end": [1.5, 0.75, 0.25],
        "torch": "2.13.0+cpu",
        "python": "3.11.7",
        "commit": "abc1234",
        "local_changes": [],
        "wall_s": 42,
        "output": output,
    }


OVERHEAD_OUTPUT = [
    "## Step-time overhead of `watch`",
    "Command: `.venv/bin/python benchmarks/overhead.py --rounds 40`",
    "",
    "## A heading the script prints",
    "Per model: 5 warm-up rounds.",
    "| model | config | ratio | target | met |",
    "|---|---|---|---|---|",
    "| transformer | plain (no hooks) | 1.000x |  |  |",
    "| transformer | watched, sampled (log_freq=1) | 1.234x | <= 1.15x | **no** |",
    "| transformer | watched, unsampled | 1.004x | <= 1.01x | yes |",
    "",
    "| model | thread x floor | target |",
    "|---|---|---|",
    "| nested-100 | 28.9x | <= 2.5x **no** |",
]
FLOOR_OUTPUT = ["torch 2.13.0+cpu, 10000 modules", "floor: 103 us per module call"]


def write_fixtures(bench_page: ModuleType, folder: Path) -> None:
    folder.mkdir()
    for name, output in (("overhead", OVERHEAD_OUTPUT), ("hook_floor", FLOOR_OUTPUT)):
        fixture = result(name, output, bench_page.BY_NAME[name].command)
        (folder / f"{name}.json").write_text(json.dumps(fixture), encoding="utf-8")


def sections(page: str) -> dict[str, str]:
    """The page's `## ` sections by title."""
    parts = re.split(r"^## (.+?)(?: \{#[\w-]+\})?$", page, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_page_assembled_from_stored_results(bench_page: ModuleType, tmp_path: Path) -> None:
    write_fixtures(bench_page, tmp_path / "bench")
    page_path = tmp_path / "performance.md"
    argv = ["--assemble", "--bench-dir", str(tmp_path / "bench"), "--page", str(page_path)]
    assert bench_page.main(argv) == 0
    page = page_path.read_text(encoding="utf-8")
    assert page.startswith("---\nhide:\n") and "\n# Performance { .wide-tables }\n" in page
    assert "make bench" in page and "A/A" in page
    found = sections(page)
    assert list(found) == [b.title for b in bench_page.BENCHMARKS]

    overhead = found[bench_page.BY_NAME["overhead"].title]
    assert "| transformer | watched, sampled (log_freq=1) | 1.234x |" in overhead
    assert (
        page.count("{#overhead}") == 1 and "## The floor: torch's own hooks {#hook-floor}" in page
    )
    head = page.split("\n## ", 1)[0]
    assert "**Measured at** git abc1234, every section" in head
    # the rows marked not met, each once, linked to its section; the met one is not listed
    assert "**Unmet targets** (2;" in head
    assert (
        "- [Step-time overhead of `watch`](#overhead): transformer / watched, sampled "
        "(log_freq=1): ratio 1.234x, target <= 1.15x"
    ) in head
    assert "(#overhead): nested-100: thread x floor 28.9x, target <= 2.5x" in head
    assert "unsampled" not in head
    assert "Command:" not in overhead  # said once, in the metadata line
    assert "overhead of `watch`" not in overhead  # nor the title twice
    assert "#### A heading the script prints" in overhead  # under the section's level
    assert "rounds.\n\n| model |" in overhead  # a blank line before the table
    metadata = (
        "*Run 2026-01-02 03:04 UTC on Test CPU 9000, 2 cores, load average 1.25 at start "
        "(1 / 5 / 15 min: 1.25, 0.5, 0.25); torch 2.13.0+cpu, Python 3.11.7, git abc1234; "
        f"42 s; command: `{bench_page.BY_NAME['overhead'].command}`.*"
    )
    assert metadata in overhead
    assert "make bench BENCH=overhead" in overhead

    floor = found[bench_page.BY_NAME["hook_floor"].title]
    assert "```text\ntorch 2.13.0+cpu, 10000 modules\nfloor: 103 us per module call\n```" in floor

    for bench in bench_page.BENCHMARKS:
        text = found[bench.title]
        assert bench.method.split("\n")[0] in text
        if bench.name in ("overhead", "hook_floor"):
            assert "*Run " in text
        elif bench.needs_cuda:
            assert "Not run on a GPU yet" in text and f"`{bench.command}`" in text
            assert "*Run " not in text and "|" not in text  # never a GPU figure
        else:
            assert f"Not measured yet: run `{bench.command}`" in text
            assert "*Run " not in text


def at_commit(bench_page: ModuleType, monkeypatch: pytest.MonkeyPatch, commit: str) -> None:
    """The tree at `commit`, with no uncommitted change."""
    monkeypatch.setattr(bench_page, "uncommitted", list)
    monkeypatch.setattr(bench_page, "_git", lambda *args: commit)


def test_rerun_of_one_section_keeps_the_others(
    bench_page: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_fixtures(bench_page, tmp_path / "bench")
    at_commit(bench_page, monkeypatch, "abc1234")
    ran: list[str] = []

    def fake_run(bench: Any) -> dict[str, Any]:
        ran.append(bench.name)
        return result(bench.name, ["| case | ms |", "|---|---|", "| fan | 12.5 |"], bench.command)

    monkeypatch.setattr(bench_page, "run_one", fake_run)
    page_path = tmp_path / "performance.md"
    argv = ["--only", "layout", "--bench-dir", str(tmp_path / "bench"), "--page", str(page_path)]
    assert bench_page.main(argv) == 0
    assert ran == ["layout"]
    assert sorted(p.name for p in (tmp_path / "bench").iterdir()) == [
        "hook_floor.json",
        "layout.json",
        "overhead.json",
    ]
    found = sections(page_path.read_text(encoding="utf-8"))
    assert "| fan | 12.5 |" in found[bench_page.BY_NAME["layout"].title]
    overhead = found[bench_page.BY_NAME["overhead"].title]
    assert "| transformer | plain (no hooks) | 1.000x |" in overhead


def test_failed_benchmark_keeps_its_previous_result(
    bench_page: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_fixtures(bench_page, tmp_path / "bench")
    before = (tmp_path / "bench" / "overhead.json").read_text(encoding="utf-8")
    at_commit(bench_page, monkeypatch, "abc1234")
    monkeypatch.setattr(bench_page, "run_one", lambda bench: None)
    page_path = tmp_path / "performance.md"
    argv = ["--only", "overhead", "--bench-dir", str(tmp_path / "bench"), "--page", str(page_path)]
    assert bench_page.main(argv) == 1
    assert (tmp_path / "bench" / "overhead.json").read_text(encoding="utf-8") == before
    assert "1.234x" in page_path.read_text(encoding="utf-8")


def test_a_dirty_tree_is_refused_unless_asked(
    bench_page: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    write_fixtures(bench_page, tmp_path / "bench")
    monkeypatch.setattr(bench_page, "uncommitted", lambda: ["wandb_modprof/api/watch.py"])
    ran: list[str] = []

    def fake_run(bench: Any) -> dict[str, Any]:
        ran.append(bench.name)
        fixture = result(bench.name, ["| case | ms |", "|---|---|"], bench.command)
        return {**fixture, "local_changes": ["wandb_modprof/api/watch.py"]}

    monkeypatch.setattr(bench_page, "run_one", fake_run)
    page_path = tmp_path / "performance.md"
    argv = ["--bench-dir", str(tmp_path / "bench"), "--page", str(page_path)]
    assert bench_page.main(argv) == 2
    assert ran == [] and not page_path.exists()
    assert "uncommitted changes (wandb_modprof/api/watch.py)" in capsys.readouterr().err
    monkeypatch.setattr(bench_page, "_has_cuda", lambda: False)
    assert bench_page.main([*argv, "--allow-dirty"]) == 0
    page = page_path.read_text(encoding="utf-8")
    assert "git abc1234-dirty" in page.split("\n## ", 1)[0]
    assert "git abc1234 (uncommitted: wandb_modprof/api/watch.py)" in page


def test_results_of_several_commits_are_refused_unless_asked(
    bench_page: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    write_fixtures(bench_page, tmp_path / "bench")
    floor = tmp_path / "bench" / "hook_floor.json"
    floor.write_text(floor.read_text("utf-8").replace("abc1234", "def5678"), encoding="utf-8")
    with pytest.raises(bench_page.MixedCommitsError, match=r"overhead abc1234, .*def5678"):
        bench_page.assemble(tmp_path / "bench")
    page = bench_page.assemble(tmp_path / "bench", allow_mixed=True)
    assert "**Measured at 2 different commits**" in page
    assert "[The floor: torch's own hooks](#hook-floor) def5678" in page
    # one section rerun at a new HEAD while the others are older: refused before running
    at_commit(bench_page, monkeypatch, "fff0000")
    monkeypatch.setattr(bench_page, "run_one", lambda bench: pytest.fail("ran"))
    argv = ["--only", "layout", "--bench-dir", str(tmp_path / "bench")]
    assert bench_page.main([*argv, "--page", str(tmp_path / "p.md")]) == 2
    assert "measured at abc1234, def5678, not at HEAD fff0000" in capsys.readouterr().err


def test_committed_page_is_the_generated_one(bench_page: ModuleType) -> None:
    """No figure on docs/performance.md is edited by hand: it is what `--assemble` writes
    (sections rerun alone after a commit keep their own commit, which the page then lists:
    `--allow-mixed`; the refusal without it is tested above)."""
    page = ROOT / "docs" / "performance.md"
    expected = bench_page.assemble(ROOT / "docs" / "bench", allow_mixed=True)
    assert page.read_text(encoding="utf-8") == expected, "run tools/bench_page.py --assemble"


def test_unknown_benchmark_is_refused(bench_page: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench_page.main(["--only", "overhed", "--page", str(tmp_path / "p.md")])
    assert stopped.value.code == 2
    assert not (tmp_path / "p.md").exists()


def test_every_benchmark_has_a_section(bench_page: ModuleType) -> None:
    scripts = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(bench_page.BY_NAME)


def test_page_text_has_no_history(bench_page: ModuleType) -> None:
    """The page's fixed text describes the method, not how it came to be."""
    text = bench_page.INTRO + "".join(b.method + b.title for b in bench_page.BENCHMARKS)
    assert not re.search(r"\bissue \d|\bsession \d|\bbefore / after\b", text, re.IGNORECASE)
