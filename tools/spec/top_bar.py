"""The marks above and below the graph: breadcrumbs (click to go back up), the Fit button, the
hint, and the banner of a table reduced to fit W&B's row limit."""

from __future__ import annotations

from typing import Any

from tools.spec.marks import encode, text_mark
from tools.spec.theme import CRUMB_FONT_PX, GX0, SMALL_FONT_PX

Mark = dict[str, Any]


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
    hint = "width > 760 ? 'drag to pan · wheel to zoom · click + to open' : ''"
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
                "text": {"signal": hint},
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
