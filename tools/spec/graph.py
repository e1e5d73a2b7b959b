"""The graph area's marks: background (drag to pan, wheel to zoom), edges, node boxes with
their labels and the messages (the hover card is drawn above everything: `card.py`)."""

from __future__ import annotations

from typing import Any

from tools.spec.expressions import IN_PLAN
from tools.spec.marks import encode, text, text_mark
from tools.spec.theme import (
    GX0,
    GY0,
    MIN_TEXT_PX,
    NODE_FONT_PX,
    NODE_SUBLABEL_FONT_PX,
    TEXT_FONT_PX,
    TITLE_FONT_PX,
)
from wandb_modprof.view.geometry import BLOCK_HEAD_PX, BLOCK_PAD_PX

Mark = dict[str, Any]
PORT = "datum.node_kind === 'input' || datum.node_kind === 'output'"
BLOCK = "(datum.node_kind === 'block')"
BLOCK_FILL = "#f3f5f9"
LABEL_PX = f"max({MIN_TEXT_PX}, {NODE_FONT_PX} * k)"
# Below the zoom that shows every label (`show_text`), a node still shows its label where the
# whole label fits its box at 9 px (0.6 em a character, the layout's estimate): a fitted view of
# a deep model keeps the names of its wider boxes.
LABEL_FITS = (
    f"(k * datum.h_px >= {LABEL_PX} + 2 && "
    f"length(datum.label) * 0.6 * {LABEL_PX} <= k * datum.w_px - 4)"
)


def graph() -> Mark:
    area = {
        "x": {"value": GX0},
        "y": {"value": GY0},
        "width": {"signal": "gw"},
        "height": {"signal": "gh"},
        "clip": {"value": True},
        "stroke": {"value": "#e6e6e6"},
    }
    background = {
        "x": {"value": 0},
        "y": {"value": 0},
        "width": {"signal": "gw"},
        "height": {"signal": "gh"},
        "fill": {"value": "#fbfbfb"},
        "cursor": {"value": "move"},
    }
    edges = {
        "x": {"signal": "ox + px_eff"},
        "y": {"signal": "oy + py_eff"},
        "scaleX": {"signal": "k"},
        "scaleY": {"signal": "k"},
        "path": {"field": "edge_path"},
        "stroke": {"value": "#8c8c8c"},
        "strokeWidth": {"value": 1.3},
    }
    return {
        "type": "group",
        "name": "graph",
        "encode": encode(area),
        "marks": [
            {"type": "rect", "name": "graph_bg", "encode": encode(background)},
            {
                "type": "path",
                "name": "edge_path",
                "from": {"data": "vedges"},
                "interactive": False,
                "encode": encode(edges),
            },
            *_nodes(),
            *_message(),
        ],
    }


def _node_box() -> dict[str, Any]:
    return {
        "x": {"field": "sx"},
        "y": {"field": "sy"},
        "width": {"signal": "k * datum.w_px"},
        "height": {"signal": "k * datum.h_px"},
        "cornerRadius": {"signal": f"{PORT} ? k * 18 : k * 4"},
        # a grid's frame (`view/blocks.py`) is a pale panel behind its members, never coloured
        "fill": {"signal": f"{BLOCK} ? '{BLOCK_FILL}' : datum.fill"},
        "zindex": {"signal": f"{BLOCK} ? 0 : 1"},
        "stroke": {
            "signal": "datum.node_key === card_key ? '#000000' : "
            "(datum.has_view ? '#333333' : '#999999')"
        },
        "strokeWidth": {"signal": "datum.node_key === card_key ? 2.5 : (datum.has_view ? 1.6 : 1)"},
        "strokeDash": {
            "signal": "datum.node_kind === 'self' || datum.node_kind === 'group' ? [4, 3] : [1, 0]"
        },
        "cursor": {"signal": "datum.has_view ? 'pointer' : 'default'"},
    }


def _nodes() -> list[Mark]:
    centre = {"x": {"signal": "datum.sx + k * datum.w_px / 2"}, "align": {"value": "center"}}
    inside = {"baseline": {"value": "middle"}, "fill": {"field": "ink"}}
    fit = {"limit": {"signal": "k * datum.w_px - 4"}}
    # A frame's title is one line in its head, left-aligned above the grid: "128 MLP modules ·
    # hottest first (fwd + bwd)".
    label = text(
        x={"signal": f"{BLOCK} ? datum.sx + k * {BLOCK_PAD_PX} : datum.sx + k * datum.w_px / 2"},
        align={"signal": f"{BLOCK} ? 'left' : 'center'"},
        y={
            "signal": f"{BLOCK} ? datum.sy + k * {BLOCK_HEAD_PX / 2} : "
            "datum.sy + k * datum.h_px * 0.42"
        },
        text={
            "signal": f"show_text || (!{BLOCK} && {LABEL_FITS}) ? "
            f"({BLOCK} ? datum.label + ' · ' + datum.sublabel : datum.label) : ''"
        },
        fontSize={"signal": LABEL_PX},
        **inside,
        **fit,
    )
    sub = text(
        **centre,
        y={"signal": "datum.sy + k * datum.h_px * 0.76"},
        text={
            # only where the box has room for two lines of readable text
            "signal": f"show_text && !{BLOCK} && k * datum.h_px * 0.34 >= {MIN_TEXT_PX + 1} "
            "? datum.sublabel : ''"
        },
        fontSize={"signal": f"max({MIN_TEXT_PX}, {NODE_SUBLABEL_FONT_PX} * k)"},
        **inside,
        fillOpacity={"value": 0.85},
        **fit,
    )
    plus = text(
        x={"signal": "datum.sx + k * datum.w_px - 3 * k"},
        y={"signal": "datum.sy + 9 * k"},
        align={"value": "right"},
        # (where it would be under 9 px it is left out, `plus_on`: the hint then names the box's
        # dark edge, and the hover card says "Click to open")
        text={"signal": "datum.has_view && plus_on ? '+' : ''"},
        fontSize={"signal": f"{TEXT_FONT_PX} * k"},
        **inside,
    )
    return [
        {
            "type": kind,
            "name": name,
            "from": {"data": "vdraw"},
            "interactive": name == "node_rect",  # labels let events reach the box
            "encode": encode(props),
        }
        for kind, name, props in (
            ("rect", "node_rect", _node_box()),
            ("text", "node_label", label),
            ("text", "node_sublabel", sub),
            ("text", "node_open", plus),
            ("symbol", "node_planned", _planned_mark()),
        )
    ]


def _planned_mark() -> dict[str, Any]:
    """The "Checkpoint value" mode's mark on a module in the plan (`ckpt_state` 1): a white
    dot edged black on the box's top-left corner (clear of its centred label), the same size
    at every zoom (the sidebar's plan heading and the ranked list name it "○")."""
    return {
        "shape": {"value": "circle"},
        "x": {"field": "sx"},
        "y": {"field": "sy"},
        "size": {"signal": f"{IN_PLAN} ? 50 : 0"},
        "fill": {"value": "#ffffff"},
        "stroke": {"value": "#000000"},
        "strokeWidth": {"value": 1.5},
        "zindex": {"value": 2},
    }


def _message() -> list[Mark]:
    message = {
        "x": {"signal": "gw / 2"},
        "y": {"signal": "gh / 2"},
        "align": {"value": "center"},
        "text": {"field": "text"},
        "fontSize": {"value": TITLE_FONT_PX},
        "fill": {"value": "#555555"},
        "limit": {"signal": "gw - 20"},
    }
    return [text_mark("message", message, "messages")]
