"""The phase bar between the graph and the detail strip: where a sampled step's time goes
around the modules (meta rows `phase_<name>`, `view.meta.phase_meta`), as one horizontal
stacked bar of the measured phases in step order (`records.phases.PHASES`), under a heading
with the step's total (the sum of the phases' medians).

* Each measured phase is a segment as wide as its share of the step, labelled inside with its
  name and milliseconds where that fits; the labels that do not fit follow the heading, each
  after a swatch of its colour, in step order, or where they do not fit there, go under the bar
  (on a second line where one is too short).
* A phase no sample measured is not drawn: a note line names it with the reason (phases with
  the same reason share a line).
* Notes wrap at a word to a second line in a narrow panel (W&B's default 640 x 400), and end
  in an ellipsis past that.

Without phase rows (a table written before they existed, a profile whose samples recorded
none) the band takes no room and draws nothing: the panel is as it was.
"""

from __future__ import annotations

from typing import Any

from tools.spec.expressions import fmt_ms, missing
from tools.spec.marks import encode, text_mark
from tools.spec.theme import GX0, GY0, INK, MUTED, SMALL_FONT_PX, TEXT_FONT_PX
from wandb_modprof.records.phases import PHASE_LABELS, PHASES

Mark = dict[str, Any]
Data = dict[str, Any]
PHASE_GAP = 6  # between the graph and the band, and between the band and the strip
HEAD_H = 15  # the heading line
BAR_H = 16  # the bar
NOTE_H = 12  # a note line under the bar
MAX_NOTE_LINES = 4
SWATCH_PX = 12  # a tight label's colour swatch and the space after it
TIGHT_GAP_PX = 14  # between two tight labels
HEAD_CHAR_W_PX = 6.2  # an 11 px character's width (the heading's)
CHAR_W_PX = 5.6  # a 10 px character's width, to tell whether a label fits (as `HINT_CHAR_W_PX`)
# Paul Tol's muted scheme, as the strip's forward / backward shading; the ink each label needs
COLOURS = {
    "between": ("#bbbbbb", INK),
    "forward": ("#4477aa", "#ffffff"),
    "loss": ("#ddcc77", INK),
    "backward": ("#cc6677", INK),
    "optimizer": ("#117733", "#ffffff"),
}


def _list(values: list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def phase_signals() -> list[dict[str, Any]]:
    """`phase_h`: the band's height (0 without phase rows), read by the graph's height `gh`
    and the strip's place; `phase_ms`: the step's total; `phase_w`: the bar's width."""
    lines = f"min({MAX_NOTE_LINES}, tight_rows + length(data('phase_lines')))"
    return [
        {
            "name": "tight_rows",
            "update": "length(data('phase_tight')) ? "
            "max(0, extent(pluck(data('phase_tight'), 'row'))[1] + 1) : 0",
        },
        {
            "name": "phase_head_text",
            "update": f"phase_ms > 0 ? 'Step ' + ({fmt_ms('phase_ms')}) + "
            "' (median of each phase)' : 'Step phases: none was measured'",
        },
        {
            "name": "phase_head_w",
            "update": f"length(phase_head_text) * {HEAD_CHAR_W_PX} + {TIGHT_GAP_PX}",
        },
        {"name": "has_phases", "update": "length(data('phase_rows')) > 0"},
        {
            "name": "phase_h",
            "update": f"has_phases ? {HEAD_H + BAR_H + 6} + {lines} * {NOTE_H} : 0",
        },
        {"name": "phase_y", "update": f"{GY0} + gh + {PHASE_GAP}"},
        {"name": "phase_w", "update": "max(40, gw - 8)"},
        {"name": "phase_chars", "update": f"max(10, floor(phase_w / {CHAR_W_PX}))"},
        {
            "name": "phase_ms",
            "update": "length(data('phase_sum')) ? data('phase_sum')[0].ms : 0",
        },
    ]


def _in_order(values: str, text: str, sep: str) -> str:
    """The `text` field of the tuples in the array `values`, joined by `sep` in step order
    (their field `i`), whatever order the aggregate collected them in."""
    at = f"indexof(pluck({values}, 'i'), {{}})"
    parts = [
        f"({at.format(i)} >= 0 ? {values}[{at.format(i)}].{text} : '')" for i in range(len(PHASES))
    ]
    a, *rest = parts
    for b in rest:
        a = f"({a}) + (({a}) !== '' && {b} !== '' ? '{sep}' : '') + {b}"
    return a


def phase_data() -> list[Data]:
    colours = [COLOURS[p] for p in PHASES]
    fits = f"datum.ms / phase_ms * phase_w >= length(datum.text) * {CHAR_W_PX} + 8"
    cut = "lastindexof(substring(datum.note, 0, phase_chars + 1), ' ')"
    wrapped = (
        "length(datum.note) <= phase_chars ? [datum.note] : "
        f"[substring(datum.note, 0, {cut} > 0 ? {cut} : phase_chars), "
        f"substring(datum.note, {cut} > 0 ? {cut} + 1 : phase_chars)]"
    )
    return [
        {
            "name": "phase_rows",
            "source": "meta",
            "transform": [
                _filter("indexof(datum.meta_key, 'phase_') === 0"),
                _formula("i", f"indexof({_list(list(PHASES))}, substring(datum.meta_key, 6))"),
                _filter("datum.i >= 0"),  # a phase this panel does not know: left out
                _formula("label", f"{_list([PHASE_LABELS[p] for p in PHASES])}[datum.i]"),
                _formula("measured", f"!{missing('meta_number')}"),
                _formula("ms", "datum.measured ? max(0, datum.meta_number) : 0"),
            ],
        },
        {
            "name": "phase_sum",
            "source": "phase_rows",
            "transform": [{"type": "aggregate", "fields": ["ms"], "ops": ["sum"], "as": ["ms"]}],
        },
        {
            "name": "phase_segs",
            "source": "phase_rows",
            "transform": [
                _filter("datum.measured && datum.ms > 0"),
                {
                    "type": "window",
                    "sort": {"field": "i"},
                    "ops": ["sum"],
                    "fields": ["ms"],
                    "as": ["t1"],
                },
                _formula("t0", "datum.t1 - datum.ms"),
                _formula("text", f"datum.label + ' ' + ({fmt_ms('datum.ms')})"),
                _formula("fill", f"{_list([c for c, _ in colours])}[datum.i]"),
                _formula("ink", f"{_list([k for _, k in colours])}[datum.i]"),
                _formula("fits", fits),
            ],
        },
        {"name": "phase_labels", "source": "phase_segs", "transform": [_filter("datum.fits")]},
        {
            # the labels that do not fit their segment, each after a swatch of its colour, in
            # step order along the first note line, the rest on a second one where needed
            "name": "phase_tight",
            "source": "phase_segs",
            "transform": [
                _filter("!datum.fits"),
                _formula("w", f"length(datum.text) * {CHAR_W_PX} + {SWATCH_PX + TIGHT_GAP_PX}"),
                {
                    "type": "window",
                    "sort": {"field": "i"},
                    "ops": ["sum"],
                    "fields": ["w"],
                    "as": ["e"],
                },
                _formula("s", "datum.e - datum.w"),
                {"type": "joinaggregate", "fields": ["w"], "ops": ["sum"], "as": ["all_w"]},
                # after the heading where they all fit there (row -1), else under the bar
                _formula("inline", f"phase_head_w + datum.all_w - {TIGHT_GAP_PX} <= phase_w"),
                _formula(
                    "row",
                    f"datum.inline ? -1 : datum.e - {TIGHT_GAP_PX} > phase_w ? 1 : 0",
                ),
                {
                    "type": "joinaggregate",
                    "groupby": ["row"],
                    "fields": ["s"],
                    "ops": ["min"],
                    "as": ["s0"],
                },
                _formula("x", "(datum.inline ? phase_head_w : 0) + datum.s - datum.s0"),
            ],
        },
        {
            "name": "phase_missing",
            "source": "phase_rows",
            "transform": [
                _filter("!datum.measured"),
                {
                    "type": "aggregate",
                    "groupby": ["meta_value"],
                    "fields": ["i", "i"],
                    "ops": ["values", "min"],
                    "as": ["v", "order"],
                },
                _formula(
                    "note",
                    f"({_in_order('datum.v', 'label', ', ')}) + ' not measured: ' + "
                    "(datum.meta_value || 'no reason given')",
                ),
            ],
        },
        {
            "name": "phase_lines",
            "source": "phase_missing",
            "transform": [
                _formula("parts", wrapped),
                {"type": "flatten", "fields": ["parts"], "as": ["line"], "index": "part"},
                {
                    "type": "window",
                    "sort": {"field": ["order", "part"]},
                    "ops": ["row_number"],
                    "as": ["k"],
                },
                _formula("n", "datum.k + tight_rows"),
                _filter(f"datum.n <= {MAX_NOTE_LINES}"),
            ],
        },
        {"name": "phase_head", "source": "phase_sum", "transform": [_filter("has_phases")]},
    ]


def _filter(expr: str) -> dict[str, str]:
    return {"type": "filter", "expr": expr}


def _formula(as_: str, expr: str) -> dict[str, str]:
    return {"type": "formula", "as": as_, "expr": expr}


def phase_bar() -> Mark:
    x = "4 + datum.t0 / max(phase_ms, 1e-9) * phase_w"
    x2 = "4 + datum.t1 / max(phase_ms, 1e-9) * phase_w"
    area = {
        "x": {"value": GX0},
        "y": {"signal": "phase_y"},
        "width": {"signal": "gw"},
        "height": {"signal": "max(0, phase_h - 1)"},  # (as the strip: its stroke stays inside)
        "fill": {"signal": "has_phases ? '#ffffff' : 'transparent'"},
        "stroke": {"signal": "has_phases ? '#e6e6e6' : 'transparent'"},
    }
    segment = {
        "x": {"signal": x},
        "x2": {"signal": f"max({x2}, {x} + 1)"},
        "y": {"value": HEAD_H},
        "height": {"value": BAR_H},
        "fill": {"field": "fill"},
        "stroke": {"value": "#ffffff"},
        "strokeWidth": {"value": 1},
    }
    label = {
        "x": {"signal": f"({x} + {x2}) / 2"},
        "y": {"value": HEAD_H + BAR_H / 2},
        "align": {"value": "center"},
        "baseline": {"value": "middle"},
        "text": {"field": "text"},
        "fill": {"field": "ink"},
        "fontSize": {"value": SMALL_FONT_PX},
        "limit": {"signal": f"max(1, {x2} - {x} - 4)"},
    }
    head = {
        "x": {"value": 4},
        "y": {"value": 11},
        "text": {"signal": "phase_head_text"},
        "fontSize": {"value": TEXT_FONT_PX},
        "limit": {"signal": "phase_w"},
    }
    note = {
        "x": {"value": 4},
        "y": {"signal": f"{HEAD_H + BAR_H + 2} + datum.n * {NOTE_H} - 2"},
        "text": {"field": "line"},
        "fontSize": {"value": SMALL_FONT_PX},
        "fill": {"value": MUTED},
        "limit": {"signal": "phase_w"},
    }
    line_y = f"datum.row < 0 ? 11 : {HEAD_H + BAR_H + 2} + (datum.row + 1) * {NOTE_H} - 2"
    swatch = {
        "x": {"signal": "4 + datum.x"},
        "y": {"signal": f"({line_y}) - 8"},
        "width": {"value": 8},
        "height": {"value": 8},
        "fill": {"field": "fill"},
    }
    tight = {
        "x": {"signal": f"4 + datum.x + {SWATCH_PX}"},
        "y": {"signal": line_y},
        "text": {"field": "text"},
        "fontSize": {"value": SMALL_FONT_PX},
        "limit": {"signal": f"max(1, phase_w - datum.x - {SWATCH_PX})"},
    }
    return {
        "type": "group",
        "name": "phases",
        "encode": encode(area),
        "marks": [
            {
                "type": "rect",
                "name": "phase_seg",
                "from": {"data": "phase_segs"},
                "interactive": False,
                "encode": encode(segment),
            },
            text_mark("phase_label", label, "phase_labels"),
            text_mark("phase_head", head, "phase_head"),
            {
                "type": "rect",
                "name": "phase_swatch",
                "from": {"data": "phase_tight"},
                "interactive": False,
                "encode": encode(swatch),
            },
            text_mark("phase_tight_label", tight, "phase_tight"),
            text_mark("phase_note", note, "phase_lines"),
        ],
    }
