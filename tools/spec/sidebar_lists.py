"""The sidebar's lower half: model totals and the ranked list of the most expensive modules
(click one to jump to it)."""

from __future__ import annotations

from typing import Any

from tools.spec.marks import HEADING, encode, text_mark
from tools.spec.theme import ACTIVE_FILL, MUTED, ROW, SIDE_W

Mark = dict[str, Any]


def totals_and_top() -> list[Mark]:
    row_y = f"(datum.rank - 1) * {ROW}"
    entry = {
        "x": {"value": 0},
        "y": {"signal": f"top_y + 14 + {row_y}"},
        "width": {"value": SIDE_W - 8},
        "height": {"value": ROW - 1},
        "fill": {"signal": f"datum.node_key === focus_key ? '{ACTIVE_FILL}' : '#ffffff'"},
        "cursor": {"value": "pointer"},
    }
    texts = {"x": {"value": 0}, "y": {"signal": f"top_y + 25 + {row_y}"}}
    return [
        text_mark(
            "totals_heading",
            {
                "x": {"value": 0},
                "y": {"signal": "totals_y + 10"},
                "text": {
                    "signal": "statistic === 'median' ? 'PER STEP (median over samples)' : "
                    "'PER STEP (mean: no medians kept)'"
                },
            }
            | HEADING,
        ),
        text_mark(
            "total_text",
            {
                "x": {"value": 0},
                "y": {"signal": f"totals_y + 12 + datum.n * {ROW - 1}"},
                "text": {"field": "line"},
                "limit": {"value": SIDE_W - 4},
            },
            "totals",
        ),
        text_mark(
            "top_heading",
            {
                "x": {"value": 0},
                "y": {"signal": "top_y + 10"},
                # a mode ranked by something else than its value says by what (`Mode.rank_by`)
                "text": {
                    "signal": "top_n > 0 ? 'TOP MODULES: ' + "
                    "upper(mode_rank_label ? mode_rank_label : mode_label) : ''"
                },
                "limit": {"value": SIDE_W - 4},
            }
            | HEADING,
        ),
        {"type": "rect", "name": "top_entry", "from": {"data": "top"}, "encode": encode(entry)},
        # name, value and share in three columns that never meet (640 px wide panels
        # included): the name gives way, ending in an ellipsis
        text_mark(
            "top_label",
            texts | {"x": {"value": 2}, "text": {"field": "rank_text"}, "limit": {"value": 100}},
            "top",
        ),
        text_mark(
            "top_value",
            texts
            | {
                "x": {"value": SIDE_W - 44},
                "align": {"value": "right"},
                "text": {"field": "value_text"},
                "limit": {"value": 72},
            },
            "top",
        ),
        text_mark(
            "top_share",
            texts
            | {
                "x": {"value": SIDE_W - 8},
                "align": {"value": "right"},
                "text": {"field": "share_text"},
                "limit": {"value": 34},
                "fill": {"value": MUTED},
            },
            "top",
        ),
    ]
