"""Static pictures of the panel (SVG, PNG) for papers, READMEs and `wandb.Image`.

>>> prof.to_svg("layer2.svg", mode="bwd", view="layer2#0")          # doctest: +SKIP
>>> png = prof.to_png(mode="act", scale="log")                       # doctest: +SKIP
>>> run.log({"modprof/picture": prof.to_wandb_image(mode="bwd")})     # doctest: +SKIP

`wandb.Image` takes a path, a PIL image or an array, not PNG bytes (`wandb.Image(png)` and
`wandb.Image(io.BytesIO(png))` raise): `to_wandb_image` opens the PNG with Pillow (a
dependency, which `wandb.Image` itself needs for any picture) and hands W&B the PIL image.

The picture is the panel itself, rendered by vl-convert (Vega in Deno, no browser): the same
spec with the profile's rows inline, opened in the chosen mode, scale and view, at
`width` x `height` CSS pixels (`scale_factor` more device pixels for PNG). No timestamps;
SVG text stays text (its clip-path and gradient ids count up per process, so two SVGs of one
profile differ in those ids only).

Names are drawn escaped (`sinks/escape.py`): vl-convert parses the SVG it renders as XML and
aborts the whole process (a non-unwinding Rust panic, exit 134, no exception) on a character
XML 1.0 forbids (U+0000-U+001F but tab and newlines, lone surrogates, U+FFFE, U+FFFF), so no
string cell reaches it raw: a module registered as `"a\x1bb"` is drawn as the text `a\x1bb`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from wandb_modprof._errors import ModProfError
from wandb_modprof._validate import check_choice
from wandb_modprof.records.modes import MODE_KEYS, SCALES
from wandb_modprof.records.snapshot import SupportsSnapshot, as_data
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.escape import escape_text
from wandb_modprof.sinks.report.html import report_spec, write_file

if TYPE_CHECKING:
    from wandb_modprof.records.snapshot import ProfileData

_MAX_PX = 20_000  # Deno/resvg refuse or run out of memory well before absurd sizes


def _converter() -> ModuleType:
    try:
        import vl_convert
    except ImportError:
        raise ModProfError(
            "pictures of the panel need vl-convert-python: pip install vl-convert-python"
        ) from None
    return vl_convert


def _check_size(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 100 <= value <= _MAX_PX:
        raise ModProfError(f"{name} expected an int from 100 to {_MAX_PX} pixels; got {value!r}")
    return value


def _resolve_view(prof: ProfileData, view: str | None, rows: Sequence[Mapping[str, object]]) -> str:
    """The view key to open ("" = the root view): a view key such as `layer2#0`, or a module's
    qualified name for its first call (`layer2` = `layer2#0`)."""
    if view is None or view == "":
        return ""
    if not isinstance(view, str):
        raise ModProfError(f"view expected a view key str such as 'layer2#0'; got {view!r}")
    keys = [str(r["view_key"]) for r in rows if r["row_kind"] == "view"]
    for candidate in (view, f"{view}#0"):
        if candidate in keys:
            return candidate
    shown = ", ".join(repr(k) for k in keys[:8]) + (" ..." if len(keys) > 8 else "")
    raise ModProfError(
        f"view expected one of the drawn views of {escape_text(prof.model_name)} ({len(keys)}: "
        f"{shown or 'none: the profile has no graph'}); got {view!r}"
    )


# Marks that only mean something to a pointer (the Fit button, its label, the pan / zoom hint):
# a static picture hides them; headings lose their "(click)".
_CONTROL_MARKS = frozenset({"fit_button", "hint"})
_CONTROL_TEXTS = frozenset({"Fit"})
_CLICK_SUFFIX = " (click)"


def _static(marks: list[Any]) -> None:
    """Hide the interactive hints in `marks` (nested groups too), in place. The marks stay
    (the spec's event streams name them), fully transparent and without text."""
    for mark in marks:
        encode = mark.setdefault("encode", {})
        text = encode.get("enter", {}).get("text", {}).get("value")
        if mark.get("name") in _CONTROL_MARKS or text in _CONTROL_TEXTS:
            for stage in ("enter", "update"):
                encode.setdefault(stage, {})["opacity"] = {"value": 0}
            if mark.get("type") == "text":  # no hidden text in the SVG either
                encode["update"].pop("text", None)
                encode["enter"]["text"] = {"value": ""}
        elif isinstance(text, str) and text.endswith(_CLICK_SUFFIX):
            encode["enter"]["text"] = {"value": text.removesuffix(_CLICK_SUFFIX)}
        _static(mark.get("marks", []))


def picture_spec(
    prof: ProfileData | SupportsSnapshot,
    *,
    mode: str,
    scale: str,
    view: str | None,
    width: int,
    height: int,
) -> dict[str, object]:
    """The panel's spec with `prof`'s rows inline, opened at `mode` / `scale` / `view`."""
    mode = check_choice("mode", mode, MODE_KEYS)
    scale = check_choice("scale", scale, SCALES)
    width = _check_size("width", width)
    height = _check_size("height", height)
    from wandb_modprof.view.table import build_table  # with the layout (igraph): lazily

    prof = as_data(prof, "picture_spec()")
    table = build_table(prof)
    view_key = escape_text(_resolve_view(prof, view, table.records()))
    spec = report_spec(mode, scale, view=view_key)
    spec["width"], spec["height"] = width, height
    _static(spec["marks"])
    # every string cell escaped the same way, so keys still join (node to parent, edge ends)
    rows = [[escape_text(c) if isinstance(c, str) else c for c in row] for row in table.rows]
    return _spec.with_rows(spec, table.columns, rows)


def to_svg(
    prof: ProfileData | SupportsSnapshot,
    path: str | os.PathLike[str] | None = None,
    *,
    mode: str,
    scale: str,
    view: str | None = None,
    width: int = 1100,
    height: int = 640,
) -> str:
    spec = picture_spec(prof, mode=mode, scale=scale, view=view, width=width, height=height)
    vlc = _converter()
    svg: str = vlc.vega_to_svg(spec)
    if path is not None:
        write_file(path, svg, "to_svg()")
    return svg


def to_png(
    prof: ProfileData | SupportsSnapshot,
    path: str | os.PathLike[str] | None = None,
    *,
    mode: str,
    scale: str,
    view: str | None = None,
    width: int = 1100,
    height: int = 640,
    scale_factor: float = 2.0,
) -> bytes:
    ok = isinstance(scale_factor, (int, float)) and not isinstance(scale_factor, bool)
    if not ok or not 0.25 <= float(scale_factor) <= 8:
        raise ModProfError(f"scale_factor expected a number from 0.25 to 8; got {scale_factor!r}")
    spec = picture_spec(prof, mode=mode, scale=scale, view=view, width=width, height=height)
    vlc = _converter()
    png: bytes = vlc.vega_to_png(spec, scale=float(scale_factor))
    if path is not None:
        write_file(path, png, "to_png()")
    return png


def to_wandb_image(png: bytes, caption: str | None = None) -> object:
    """`wandb.Image` of the PNG bytes `png` (from `to_png`), for `run.log`."""
    if caption is not None and not isinstance(caption, str):
        raise ModProfError(f"caption expected a str or None; got {caption!r}")
    try:
        import io

        import wandb
        from PIL import Image
    except ImportError as error:
        raise ModProfError(
            f"to_wandb_image() needs wandb and Pillow ({error}): pip install wandb pillow"
        ) from None
    picture = Image.open(io.BytesIO(png))
    picture.load()  # decode now: W&B reads the pixels later, after the bytes are gone
    return wandb.Image(picture, caption=caption)
