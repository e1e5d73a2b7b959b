"""MkDocs hook: every relative link and picture of the built site resolves on the site.

MkDocs checks the links and images written in Markdown, and rewrites their paths for pages
served as folders (`panel.md` becomes `panel/index.html`), but leaves raw HTML alone: an
`<img src="images/x.png">` on `panel.md` resolves to `panel/images/x.png` on the site and shows
nothing. So after the build this walks the written HTML (`src` and `href` of every tag), resolves
each relative address from its page as a browser would, and warns for each one that names no
file (or no `id` on the page it names); under `mkdocs build --strict` a warning fails the build.

Wired in `mkdocs.yml` (`hooks:`); `tests/test_site_links.py` checks that it finds what it should.
"""

from __future__ import annotations

import logging
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

log = logging.getLogger("mkdocs.hooks.site_links")

# Attributes that load or link a file of the site.
URL_ATTRIBUTES = {"src", "href"}


class _Page(HTMLParser):
    """The addresses a page links or loads, and the ids it defines."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.urls: list[tuple[str, str]] = []  # (tag, address)
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in URL_ATTRIBUTES:
                self.urls.append((tag, value))
            elif name in ("id", "name"):
                self.ids.add(value)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text("utf-8"))
    return page


def _target(site: Path, page: Path, address: str) -> tuple[Path, str] | None:
    """The file a relative address of `page` names, and its fragment; None: not a relative
    address of this site (a scheme, `//host`, an address of the page itself, a data URL)."""
    parts = urlsplit(address)
    if parts.scheme or parts.netloc or address.startswith(("#", "/")) or not parts.path:
        return None
    path = (page.parent / unquote(parts.path)).resolve()
    if path.is_dir() or parts.path.endswith("/"):
        path = path / "index.html"
    return path, parts.fragment


def broken_links(site: Path) -> list[str]:
    """`<page>: <tag> <address> (<why>)` for every relative address that does not resolve."""
    site = site.resolve()
    pages = {p: _parse(p) for p in sorted(site.rglob("*.html"))}
    found = []
    for page, parsed in pages.items():
        for tag, address in parsed.urls:
            target = _target(site, page, address)
            if target is None:
                continue
            path, fragment = target
            where = f"{page.relative_to(site)}: <{tag}> {address}"
            if not path.is_relative_to(site):
                found.append(f"{where} (outside the site)")
            elif not path.is_file():
                found.append(f"{where} (no file {path.relative_to(site)})")
            elif fragment and path.suffix == ".html":
                ids = (pages.get(path) or _parse(path)).ids
                if unquote(fragment) not in ids:
                    found.append(f"{where} (no id {fragment!r} on {path.relative_to(site)})")
    return found


def on_post_build(config: Any, **kwargs: Any) -> None:
    for problem in broken_links(Path(config["site_dir"])):
        log.warning("A link or picture of the built site does not resolve: %s", problem)
