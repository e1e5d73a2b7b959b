"""vega-embed + Vega as one script with no imports, for the HTML report page.

vl-convert's bundler takes ~1.5 s per process, and every fresh worker process and CLI call
used to pay it. The text depends only on vl-convert's version and our snippet, so it is kept
once per version in the user's cache folder (`$XDG_CACHE_HOME/wandb_modprof/vega/`, default
`~/.cache/...`) and read back in milliseconds; a folder that cannot be written only costs the
bundling again.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path

from wandb_modprof._errors import ModProfError

_BUNDLE_SNIPPET = "window.vegaEmbed = vegaEmbed;"
_SCRIPT_BREAKS = re.compile(r"<(?=/script|!--|script)", re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def vega_bundle() -> str:
    """vega-embed + Vega 6 as one script with no imports (vl-convert's bundler), cached in the
    process and on disk."""
    try:
        import vl_convert
    except ImportError:
        raise ModProfError(
            "the HTML report needs vl-convert-python (it bundles Vega into the page): "
            "pip install vl-convert-python"
        ) from None
    cached = _cache_file(str(getattr(vl_convert, "__version__", "unknown")))
    try:
        text = cached.read_text(encoding="utf-8")
    except (OSError, UnicodeError):
        text = ""
    if "vegaEmbed" not in text:
        text = _safe(vl_convert.javascript_bundle(_BUNDLE_SNIPPET))
        _store(cached, text)
    return text


def _safe(text: str) -> str:
    # Inside <script> only `</script`, `<!--` and `<script` change how HTML parses the text;
    # the bundle has none today. If a future one does, they can only be in string, template or
    # regex literals, where `\x3c` means `<` too.
    return _SCRIPT_BREAKS.sub(r"\\x3c", text)


def _cache_file(version: str) -> Path:
    key = hashlib.sha256(f"{version}|{_BUNDLE_SNIPPET}|{_SCRIPT_BREAKS.pattern}".encode())
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wandb_modprof" / "vega" / f"bundle-{key.hexdigest()[:16]}.js"


def _store(path: Path, text: str) -> None:
    """Written aside and renamed: a process reading it never sees half a bundle."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_name(f"{path.name}.{os.getpid()}.part")
        aside.write_text(text, encoding="utf-8")
        os.replace(aside, path)
    except OSError:
        pass  # a read-only home: bundled again next time
