"""The hover card: drawn above everything else (graph, detail strip, top bar) and kept inside
the panel at any size. It sits at the top of the graph area on the side away from the node it
describes (a card over its own node would hide what it explains), and its line height gives way
down to `CARD_MIN_LINE_PX` so that all its lines fit the panel's height; lines that still do not
fit are left out, the last one shown saying how many."""

from __future__ import annotations

from typing import Any

from tools.spec.data import _filter
from tools.spec.marks import encode, text_mark
from tools.spec.theme import CARD_LINE_PX, CARD_W, GX0, GY0, TEXT_FONT_PX

Mark = dict[str, Any]
CARD_MIN_LINE_PX = 11  # 10 px text at the least (`MIN_TEXT_PX` is 9)
CARD_PAD_PX = 10  # the box's height beyond its lines


def card_data() -> list[dict[str, Any]]:
    """`card_at`: the drawn node the card describes (none while it is off this view)."""
    return [
        {
            "name": "card_at",
            "source": "vdraw",
            "transform": [_filter("card_key !== '' && datum.node_key === card_key")],
        }
    ]


def card_signals() -> list[dict[str, Any]]:
    lines = "length(data('card_box')) ? data('card_box')[0].lines : 0"
    node_x = (
        "length(data('card_at')) ? data('card_at')[0].sx + k * data('card_at')[0].w_px / 2 : gw"
    )
    room = f"height - {GY0} - 8 - {CARD_PAD_PX}"
    return [
        {"name": "card_lines", "update": lines},
        # a node in the right half of the graph area gets the card on the left, and the other
        # way round
        {
            "name": "card_x",
            "update": f"{GX0} + (({node_x}) > gw / 2 ? 8 : max(8, gw - {CARD_W + 8}))",
        },
        {"name": "card_y", "update": f"{GY0} + 8"},
        {
            "name": "card_lh",
            "update": f"clamp(floor(({room}) / max(1, card_lines)), {CARD_MIN_LINE_PX}, "
            f"{CARD_LINE_PX})",
        },
        # how many lines are shown: all where they fit at `card_lh`
        {"name": "card_shown", "update": f"min(card_lines, floor(({room}) / card_lh))"},
    ]


def card() -> Mark:
    box = {
        "x": {"signal": "card_x"},
        "y": {"signal": "card_y"},
        "width": {"value": CARD_W},
        "height": {"signal": f"card_shown * card_lh + {CARD_PAD_PX}"},
        "fill": {"value": "#ffffff"},
        "fillOpacity": {"value": 0.97},
        "stroke": {"value": "#999999"},
        "cornerRadius": {"value": 4},
    }
    cut = "datum.n === card_shown && card_shown < card_lines"
    lines = {
        "x": {"signal": "card_x + 8"},
        "y": {"signal": "card_y + datum.n * card_lh"},
        "text": {
            "signal": f"datum.n > card_shown ? '' : {cut} ? "
            "'… ' + (card_lines - card_shown + 1) + ' more lines (the panel is too low)' "
            ": datum.line"
        },
        "fontSize": {"signal": f"card_lh >= {CARD_LINE_PX - 1} ? {TEXT_FONT_PX} : 10"},
        "fontWeight": {"signal": "datum.n === 1 ? 'bold' : 'normal'"},
        "limit": {"value": CARD_W - 12},
    }
    return {
        "type": "group",
        "name": "card_layer",
        "interactive": False,
        "encode": encode({"x": {"value": 0}, "y": {"value": 0}}),
        "marks": [
            {
                "type": "rect",
                "name": "card_bg",
                "from": {"data": "card_box"},
                "interactive": False,
                "encode": encode(box),
            },
            text_mark("card_text", lines, "card"),
        ],
    }
