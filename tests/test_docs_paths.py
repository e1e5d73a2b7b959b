"""Docs that stay true: every repository path a markdown file names exists, and no file of the
repository carries an absolute path of the machine it was written on.

A path is named either as a relative link or image (`[text](docs/panel.md)`, `<img src=...>`,
resolved from the markdown file's folder, as a browser and MkDocs resolve them) or as a code
span that looks like a file of this repository (`tests/models.py`, `view/table.py`), resolved
from the repository root, then from the package (the docs name package modules both ways).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Folders a fresh clone does not have until a command makes them: named in the docs as such.
GENERATED = ("tests/.vendor/", "site/", "out/", ".venv/", ".venv-compat/")
SUFFIXES = (".py", ".md", ".json", ".toml", ".yml", ".ipynb", ".sh", ".png", ".txt")
LINK = re.compile(r"\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")
CODE_SPAN = re.compile(r"`([^`\s]+)`")


def tracked(pattern: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]


def markdown_files() -> list[Path]:
    return tracked("*.md")


def looks_like_a_path(text: str) -> bool:
    if any(c in text for c in "*<>{}$|:=(),'\"") or text.startswith(("-", ".", "/", "~")):
        return False
    if "/" not in text and not text.endswith(SUFFIXES):
        return False
    if text.startswith(GENERATED) or text.startswith("torch/"):  # torch's own sources
        return False
    first = text.split("/", maxsplit=1)[0]
    top = {p.name for p in ROOT.iterdir()} | {"capture", "view", "sinks", "stats", "records"}
    return first in top or (text.endswith(SUFFIXES) and "/" in text)


def exists(text: str) -> bool:
    """`view/table.py`, a module named without `.py` (`capture/hooks`), or one of its names
    (`sinks/spec.read_columns`)."""
    text = text.split("#", maxsplit=1)[0].rstrip("/")
    folder, _, last = text.rpartition("/")
    module = f"{folder}/{last.split('.')[0]}.py" if folder else f"{last.split('.')[0]}.py"
    bases = (ROOT, ROOT / "wandb_modprof", ROOT / "tests")
    return any((b / text).exists() or (b / module).exists() for b in bases)


def missing_paths(page: Path) -> list[str]:
    text = page.read_text("utf-8")
    missing = []
    for match in LINK.finditer(text):
        target = (match.group(1) or match.group(2)).split("#")[0]
        if not target or re.match(r"[a-z]+:", target):  # anchors, https:, mailto:
            continue
        if not (page.parent / target).exists():
            missing.append(f"link {target}")
    for match in CODE_SPAN.finditer(text):
        span = match.group(1)
        if looks_like_a_path(span) and not exists(span):
            missing.append(f"`{span}`")
    return missing


def test_the_finder_sees_paths_and_reports_a_missing_one(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See `tests/models.py`, `view/table.py`, `capture/hooks`, `sinks/spec.read_columns`, "
        "`tests/nope.py` and [gone](nope.md); `torch/_inductor/config.py` is torch's; "
        "`out/demo.html` is made by `make demo`; `x = 1` is code.",
        encoding="utf-8",
    )
    assert missing_paths(page) == ["link nope.md", "`tests/nope.py`"]


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_markdown_file_names_exists(page: Path) -> None:
    assert missing_paths(page) == []


def test_no_absolute_path_of_this_machine_anywhere() -> None:
    """Commands, docstrings and pages say paths relative to the repository root."""
    home = "/" + "work" + "/"  # spelled apart so this file does not match itself
    offenders = []
    for path in tracked("*"):
        if path.suffix not in (*SUFFIXES, ".cfg", ".ini", "") or path.name == "Makefile":
            continue
        try:
            text = path.read_text("utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if home in line or re.search(r"\bcd /\w", line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert offenders == []
