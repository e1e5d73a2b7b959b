"""The docs build's hook `tools/site_links.py` finds every relative link and picture of a built
site that does not resolve (raw HTML included), and nothing else."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site_links() -> ModuleType:
    spec = importlib.util.spec_from_file_location("site_links", ROOT / "tools" / "site_links.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["site_links"] = module
    spec.loader.exec_module(module)
    return module


def write(path: Path, html: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<html><body>{html}</body></html>", encoding="utf-8")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site as MkDocs writes it: pages as folders, pictures at the root's images/."""
    site = tmp_path / "site"
    (site / "images").mkdir(parents=True)
    (site / "images" / "a.png").write_bytes(b"\x89PNG")
    write(site / "index.html", '<img src="images/a.png"><a href="panel/">panel</a>')
    write(
        site / "panel" / "index.html",
        '<h2 id="modes">Modes</h2>'
        '<img src="../images/a.png">'  # as MkDocs rewrites a Markdown image: resolves
        '<img src="images/a.png">'  # raw HTML written for the Markdown file's folder: broken
        '<a href="../measurement/#accuracy">x</a>'  # no such id there
        '<a href="../measurement/#limits">x</a>'
        '<a href="#modes">x</a><a href="https://wandb.ai/x">x</a><a href="mailto:a@b.c">x</a>'
        '<img src="data:image/png;base64,AAAA"><a href="../../outside.html">x</a>',
    )
    write(site / "measurement" / "index.html", '<h2 id="limits">Limits</h2>')
    return site


def test_it_finds_what_does_not_resolve_and_nothing_else(site_links: ModuleType, site: Path):
    assert site_links.broken_links(site) == [
        "panel/index.html: <img> images/a.png (no file panel/images/a.png)",
        "panel/index.html: <a> ../measurement/#accuracy (no id 'accuracy' on "
        "measurement/index.html)",
        "panel/index.html: <a> ../../outside.html (outside the site)",
    ]


def test_the_hook_warns_on_the_mkdocs_logger(
    site_links: ModuleType, site: Path, caplog: pytest.LogCaptureFixture
):
    """`mkdocs build --strict` counts warnings of the `mkdocs` loggers: one per problem."""
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        site_links.on_post_build({"site_dir": str(site)})
    warned = [r for r in caplog.records if r.name.startswith("mkdocs.")]
    assert len(warned) == 3 and all(r.levelno == logging.WARNING for r in warned)
    assert "panel/images/a.png" in warned[0].getMessage()


def test_the_docs_build_runs_the_hook() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "hooks:\n  - tools/site_links.py\n" in config and "\nstrict: true\n" in config
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    (docs_line,) = [line for line in makefile.splitlines() if "mkdocs build" in line]
    assert "--strict" in docs_line and "--quiet" not in docs_line and " -q" not in docs_line
