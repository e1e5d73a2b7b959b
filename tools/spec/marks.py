"""Encode helpers shared by the mark sections."""

from __future__ import annotations

from typing import Any

from tools.spec.theme import FONT, INK, MUTED, SMALL_FONT_PX, TEXT_FONT_PX

HEADING = {  # section headings of the sidebar
    "fontWeight": {"value": "bold"},
    "fill": {"value": MUTED},
    "fontSize": {"value": SMALL_FONT_PX},
}


def encode(props: dict[str, Any]) -> dict[str, Any]:
    """`{"enter": fixed, "update": live}`: constant properties are set once when an item is
    created, the ones reading signals or data on every update."""
    fixed = {k: v for k, v in props.items() if set(v) == {"value"}}
    live = {k: v for k, v in props.items() if k not in fixed}
    out: dict[str, Any] = {}
    if fixed:
        out["enter"] = fixed
    if live:
        out["update"] = live
    return out


def text(**props: Any) -> dict[str, Any]:
    """A text mark's properties: the panel's font, size and ink unless `props` say otherwise."""
    base = {"font": {"value": FONT}, "fontSize": {"value": TEXT_FONT_PX}, "fill": {"value": INK}}
    base.update(props)
    return base


def text_mark(name: str | None, props: dict[str, Any], source: str = "") -> dict[str, Any]:
    """A non-interactive text mark (`name` None: anonymous), from the dataset `source` if any."""
    mark: dict[str, Any] = {"type": "text"}
    if name:
        mark["name"] = name
    if source:
        mark["from"] = {"data": source}
    mark["interactive"] = False
    mark["encode"] = encode(text(**props))
    return mark
