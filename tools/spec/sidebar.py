"""The sidebar's marks: title, the analysis-mode and colour-scale legends (clickable, as radio
buttons: W&B hides bound inputs), the colour bar, the run list, totals and the ranked list."""

from __future__ import annotations

from typing import Any

from tools.spec.expressions import fmt, heading_rows, legend_rows
from tools.spec.marks import HEADING, encode, text_mark
from tools.spec.sidebar_lists import totals_and_top
from tools.spec.theme import (
    ACTIVE_FILL,
    DISABLED,
    INK,
    MAX_RUNS,
    MUTED,
    ROW,
    SIDE_W,
    SMALL_FONT_PX,
    TITLE_FONT_PX,
)
from wandb_modprof.records.modes import MODES

Mark = dict[str, Any]
MODES_Y = 40
SCALE_Y = MODES_Y + legend_rows() * ROW + 8
BAR_Y = SCALE_Y + ROW + 16
RUNS_Y = BAR_Y + 38


def sidebar() -> Mark:
    return {
        "type": "group",
        "name": "sidebar",
        "encode": encode(
            {
                "x": {"value": 0},
                "y": {"value": 0},
                "width": {"value": SIDE_W},
                "height": {"signal": "height"},
                "clip": {"value": True},
            }
        ),
        "marks": [*_legends(), *_colorbar(BAR_Y), *_runs(RUNS_Y), *totals_and_top()],
    }


def _legends() -> list[Mark]:
    title = {
        "x": {"value": 0},
        "y": {"value": 12},
        "text": {"signal": "model_name ? model_name : 'wandb_modprof'"},
        "fontSize": {"value": TITLE_FONT_PX},
        "fontWeight": {"value": "bold"},
        "limit": {"value": SIDE_W - 4},
    }
    marks = [text_mark("title", title), heading("ANALYSIS MODE (click)", 0, MODES_Y - 14)]
    normal = {"fontWeight": {"value": "normal"}}
    for group, col, row in heading_rows():
        marks.append(heading(group, col * 112, MODES_Y + row * ROW, normal))
    marks += radio(
        "mode",
        "modes",
        x="datum.col * 112",
        y=f"{MODES_Y} + datum.row * {ROW}",
        active="datum.key === mode",
        label="datum.label",
        enabled="datum.avail",
        width=110,
    )
    marks.append(heading("COLOUR SCALE", 0, SCALE_Y))
    marks += radio(
        "scale",
        "scales_list",
        x="90 + datum.i * 60",
        y=f"{SCALE_Y}",
        active="datum.key === scale_type",
        label="datum.label",
        enabled="!cmp",
        width=58,
    )
    return marks


def heading(label: str, x: float, y: float, style: dict[str, Any] | None = None) -> Mark:
    props = {"x": {"value": x}, "y": {"value": y + 10}, "text": {"value": label}}
    return text_mark(None, props | HEADING | (style or {}))


def radio(
    stem: str, source: str, *, x: str, y: str, active: str, label: str, enabled: str, width: int
) -> list[Mark]:
    """A legend entry that acts as a radio button: a click target, a dot and a label."""
    target = {
        "x": {"signal": x},
        "y": {"signal": y},
        "width": {"value": width},
        "height": {"value": ROW - 1},
        "cornerRadius": {"value": 3},
        "fill": {"signal": f"{active} ? '{ACTIVE_FILL}' : '#ffffff'"},
        "fillOpacity": {"value": 1},
        "cursor": {"signal": f"{enabled} ? 'pointer' : 'default'"},
    }
    dot = {
        "x": {"signal": f"{x} + 7"},
        "y": {"signal": f"{y} + 7"},
        "size": {"value": 50},
        "shape": {"value": "circle"},
        "stroke": {"signal": f"{enabled} ? '#3b5bdb' : '#bbbbbb'"},
        "strokeWidth": {"value": 1.2},
        "fill": {"signal": f"{active} ? '#3b5bdb' : '#ffffff'"},
    }
    text = {
        "x": {"signal": f"{x} + 16"},
        "y": {"signal": f"{y} + 11"},
        "text": {"signal": label},
        "fontWeight": {"signal": f"{active} ? 'bold' : 'normal'"},
        "fill": {"signal": f"{enabled} ? '{INK}' : '{DISABLED}'"},
        "limit": {"value": width - 17},
    }
    return [
        {
            "type": "rect",
            "name": f"{stem}_entry",
            "from": {"data": source},
            "encode": encode(target),
        },
        {
            "type": "symbol",
            "name": f"{stem}_dot",
            "from": {"data": source},
            "interactive": False,
            "encode": encode(dot),
        },
        text_mark(f"{stem}_label", text, source),
    ]


def _colorbar(y: int) -> list[Mark]:
    # What the colours stand for: the mode's value, or what a mode ranked by something else
    # is coloured by (`Mode.colour_value`, `colour_label`: the efficiency modes' time lost),
    # whose unit the labels then take (`bar_text` is in the mode's unit)
    labels = [(m.colour_label or m.rank_label) if m.rank_by else "" for m in MODES]
    coloured = f"(mode_i >= 0 && {labels}[mode_i] !== '')"
    title = (
        f"cmp ? 'Ratio to baseline, ' + ({coloured} ? mode_rank_label : mode_label) : "
        f"({coloured} ? {labels}[mode_i] : mode_label) + (scale_type === 'log' ? ' (log)' : '')"
    )
    bar = {
        "x": {"value": 0},
        "y": {"value": y},
        "width": {"value": SIDE_W - 8},
        "height": {"value": 10},
        "fill": {
            "signal": "cmp ? gradient('diverge', [0, 0], [1, 0]) : "
            "gradient('turbo', [0, 0], [1, 0])"
        },
        "stroke": {"value": "#cccccc"},
    }
    anchors = {"lo": (0, "left"), "mid": (SIDE_W / 2 - 4, "center"), "hi": (SIDE_W - 8, "right")}
    marks = [
        text_mark(
            "colorbar_title",
            {
                "x": {"value": 0},
                "y": {"value": y - 4},
                "text": {"signal": title},
                "fontSize": {"value": SMALL_FONT_PX},
                "fill": {"value": MUTED},
                "limit": {"value": SIDE_W - 4},
            },
        ),
        {"type": "rect", "name": "colorbar", "interactive": False, "encode": encode(bar)},
    ]
    for i, (key, (x, align)) in enumerate(anchors.items()):
        text = f"!cmp && {coloured} ? ({fmt('mode_rank_unit', f'bar_{key}')}) : bar_text[{i}]"
        props = {
            "x": {"value": x},
            "y": {"value": y + 22},
            "align": {"value": align},
            "text": {"signal": f"has_range || cmp ? ({text}) : ''"},
            "fontSize": {"value": SMALL_FONT_PX},
        }
        marks.append(text_mark(f"colorbar_{key}", props))
    return marks


def _runs(y: int) -> list[Mark]:
    entries_y = f"{y} + 14 + (datum.i - 1) * {ROW}"
    compare_y = f"{y} + 16 + min(n_runs, {MAX_RUNS}) * {ROW}"
    runs_heading = {
        "x": {"value": 0},
        "y": {"value": y + 10},
        "text": {
            "signal": f"n_runs >= 2 ? 'RUNS (' + n_runs + '): click to show one' + "
            f"(n_runs > {MAX_RUNS} ? ', first {MAX_RUNS} listed' : '') : ''"
        },
    }
    swatch = {
        "x": {"value": SIDE_W - 20},
        "y": {"signal": f"{entries_y} + 3"},
        "width": {"value": 9},
        "height": {"value": 9},
        "fill": {"field": "run_color"},
    }
    return [
        text_mark("runs_heading", runs_heading | HEADING),
        *radio(
            "run",
            "runs_shown",
            x="0",
            y=entries_y,
            active="datum.run === run_now",
            label="datum.run_label",
            enabled="true",
            width=SIDE_W - 8,
        ),
        {
            "type": "rect",
            "name": "run_swatch",
            "from": {"data": "runs_shown"},
            "interactive": False,
            "encode": encode(swatch),
        },
        *radio(
            "compare",
            "compare_toggle",
            x="0",
            y=compare_y,
            active="compare",
            label="'Colour by ratio to a baseline run'",
            enabled="true",
            width=SIDE_W - 8,
        ),
        *radio(
            "baseline",
            "baselines_shown",
            x="12",
            y=f"{compare_y} + {ROW} + (datum.i - 1) * {ROW}",
            active="datum.run === baseline",
            label="'baseline: ' + datum.run_label",
            enabled="datum.run !== run_now",
            width=SIDE_W - 20,
        ),
    ]
