"""The sidebar's lower half: model totals and the ranked list of the most expensive modules
(click one to jump to it)."""

from __future__ import annotations

from typing import Any

from tools.spec.expressions import CKPT_ON
from tools.spec.marks import HEADING, encode, text_mark
from tools.spec.theme import ACTIVE_FILL, MUTED, ROW, SIDE_W
from wandb_modprof.records.modes import MODES

Mark = dict[str, Any]
VALUE_RIGHT = SIDE_W - 44  # the ranked list's value column ends here (right-aligned)
NAME_HEAD_W = 76  # "TOP MODULES", the name column's heading
# The third column's heading where the list ranks by something else than the mode's value:
# there it holds the value, and only the efficiency modes rank so (`Mode.rank_by`).
RANKED_VALUE_HEADING = "EFF."
assert all(m.key.startswith("eff") for m in MODES if m.rank_by), "name the third column"


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
                    "signal": f"!totals_on ? '' : {CKPT_ON} ? "
                    "'CHECKPOINT PLAN (○ checkpointed)' : statistic === 'median' ? "
                    "'PER STEP (median over samples)' : 'PER STEP (mean: no medians kept)'"
                },
            }
            | HEADING,
        ),
        text_mark(
            "total_text",
            {
                "x": {"value": 0},
                "y": {"signal": f"totals_y + 12 + datum.n * {ROW - 1}"},
                "text": {"signal": "totals_on ? datum.line : ''"},
                "limit": {"value": SIDE_W - 4},
            },
            "totals",
        ),
        text_mark(
            "top_heading",
            {
                "x": {"value": 0},
                "y": {"signal": "top_y + 10"},
                "text": {"signal": "top_n > 0 ? 'TOP MODULES' : ''"},
                "limit": {"value": NAME_HEAD_W},
            }
            | HEADING,
        ),
        # Every column headed, on the heading's line (drawn with the first entry: none without
        # one): the value column by the mode, or by what a mode ranked by something else than
        # its value ranks by (`Mode.rank_by`: "TIME LOST (FWD)"); the third by what it holds,
        # the share of the model's total or, in those modes, the mode's value (efficiency)
        text_mark(
            "top_value_heading",
            {
                "x": {"value": VALUE_RIGHT},
                "y": {"signal": "top_y + 10"},
                "align": {"value": "right"},
                "text": {
                    "signal": "datum.rank === 1 ? "
                    "upper(mode_rank_label ? mode_rank_label : mode_label) : ''"
                },
                "limit": {"value": VALUE_RIGHT - NAME_HEAD_W - 6},
            }
            | HEADING,
            "top",
        ),
        text_mark(
            "top_share_heading",
            {
                "x": {"value": SIDE_W - 4},
                "y": {"signal": "top_y + 10"},
                "align": {"value": "right"},
                "text": {
                    "signal": "datum.rank === 1 && datum.share_text !== '' ? "
                    f"(mode_rank_label ? '{RANKED_VALUE_HEADING}' : 'SHARE') : ''"
                },
                "limit": {"value": SIDE_W - 4 - VALUE_RIGHT - 3},
            }
            | HEADING,
            "top",
        ),
        # the entry's full module name on hover (the list shows what tells it apart)
        {
            "type": "rect",
            "name": "top_entry",
            "from": {"data": "top"},
            "encode": encode(entry | {"tooltip": {"field": "who"}}),
        },
        # name, value and share in three columns that never meet (640 px wide panels
        # included): the name takes what the value leaves (at least 100 px; a value is at
        # most 7 px a character), then gives way, ending in an ellipsis
        text_mark(
            "top_label",
            texts
            | {
                "x": {"value": 2},
                "text": {"field": "rank_text"},
                "limit": {
                    "signal": f"max(100, {VALUE_RIGHT - 8} - min(72, length(datum.value_text) * 7))"
                },
            },
            "top",
        ),
        text_mark(
            "top_value",
            texts
            | {
                "x": {"value": VALUE_RIGHT},
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
