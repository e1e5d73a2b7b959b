"""The marks above and below the graph: breadcrumbs (click to go back up), the Fit button, the
hint, and the banner of a table reduced to fit W&B's row limit."""

from __future__ import annotations

from typing import Any

from tools.spec.marks import encode, text_mark
from tools.spec.theme import (
    CRUMB_FONT_PX,
    GX0,
    HINT_CHAR_W_PX,
    MIN_TEXT_PX,
    SMALL_FONT_PX,
    TEXT_FONT_PX,
)

Mark = dict[str, Any]
FIT_BUTTON_PX = 54  # the Fit button and the gap before it, at the panel's right edge
HINT_PAN = "drag to pan · wheel to zoom · "


def top_bar_signals() -> list[dict[str, Any]]:
    """The hint names what a user can click to open a module: the "+" where it is drawn
    (`graph.py`: from the zoom at which it is 9 px), else the box's dark edge. The breadcrumbs
    get the room left of the Fit button, and of the hint where both fit (`lists.py`'s
    `crumbs` shorten themselves to it)."""
    hint = f"'{HINT_PAN}' + (plus_on ? 'click + to open' : 'click a dark-edged box to open')"
    return [
        {"name": "plus_on", "update": f"k * {TEXT_FONT_PX} >= {MIN_TEXT_PX}"},
        {
            "name": "crumbs_w",
            "update": "length(data('crumbs_all')) ? data('crumbs_all')[0].from_end : 0",
        },
        {
            "name": "crumb_w0",
            "update": "length(data('crumbs_all')) ? data('crumbs_all')[0].w : 0",
        },
        {"name": "hint_full", "update": hint},
        {"name": "hint_w", "update": f"length(hint_full) * {HINT_CHAR_W_PX} + 8"},
        {
            "name": "hint_text",
            "update": f"width - {GX0 + FIT_BUTTON_PX} - crumbs_w >= hint_w ? hint_full : ''",
        },
        {
            "name": "crumb_room",
            "update": f"width - {GX0 + FIT_BUTTON_PX} - (hint_text ? hint_w : 0)",
        },
    ]


def top_bar() -> list[Mark]:
    crumb = {
        "x": {"signal": f"{GX0} + datum.x_end - datum.w"},
        "y": {"value": 4},
        "width": {"signal": "datum.w - 4"},
        "height": {"value": 20},
        "cornerRadius": {"value": 3},
        "fill": {"signal": "datum.last ? '#e8eefc' : '#f1f3f5'"},
        "cursor": {"signal": "datum.last ? 'default' : 'pointer'"},
    }
    button = {
        "x": {"signal": "width - 46"},
        "y": {"value": 4},
        "width": {"value": 44},
        "height": {"value": 20},
        "cornerRadius": {"value": 3},
        "fill": {"value": "#f1f3f5"},
        "cursor": {"value": "pointer"},
    }
    return [
        {"type": "rect", "name": "crumb", "from": {"data": "crumbs"}, "encode": encode(crumb)},
        text_mark(
            "crumb_label",
            {
                "x": {"signal": f"{GX0} + datum.x_end - datum.w + 8"},
                "y": {"value": 18},
                "text": {"field": "label"},
                "fontWeight": {"signal": "datum.last ? 'bold' : 'normal'"},
                "fontSize": {"value": CRUMB_FONT_PX},
                # a last breadcrumb longer than the whole room ends in an ellipsis
                "limit": {"signal": "max(30, crumb_room - datum.x_end + datum.w - 12)"},
            },
            "crumbs",
        ),
        {"type": "rect", "name": "fit_button", "encode": encode(button)},
        text_mark(
            None,
            {
                "x": {"signal": "width - 24"},
                "y": {"value": 18},
                "align": {"value": "center"},
                "text": {"value": "Fit"},
            },
        ),
        text_mark(
            "hint",
            {
                "x": {"signal": "width - 54"},
                "y": {"value": 18},
                "align": {"value": "right"},
                "text": {"signal": "hint_text"},
                "fontSize": {"value": SMALL_FONT_PX},
                "fill": {"value": "#999999"},
            },
        ),
        *_banner(),
    ]


def _banner() -> list[Mark]:
    box = {
        "x": {"value": GX0},
        "y": {"signal": "height - 20"},
        "width": {"signal": "gw"},
        "height": {"value": 20},
        "fill": {"value": "#fff4cc"},
    }
    return [
        {
            "type": "rect",
            "name": "banner_bg",
            "from": {"data": "banner"},
            "interactive": False,
            "encode": encode(box),
        },
        text_mark(
            "message",
            {
                "x": {"value": GX0 + 6},
                "y": {"signal": "height - 6"},
                "text": {"field": "text"},
                "limit": {"signal": "gw - 12"},
            },
            "banner",
        ),
    ]
