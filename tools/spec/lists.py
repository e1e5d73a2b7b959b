"""The spec's data, second half: every text shown around the graph, computed once here (one
formatter expression per use, dispatching on a unit) so the marks only place it: the hover
card (its lines: `card_lines`), breadcrumbs, ranked list (`ranked`), legends, totals, colour
bar labels and messages. `lists()` returns them all, in the order the spec lists them."""

from __future__ import annotations

from typing import Any

from tools.spec.card_lines import card
from tools.spec.data import _filter, _formula
from tools.spec.expressions import CKPT_ON, fmt, fmt_ratio, mode_cell
from tools.spec.ranked import top
from tools.spec.theme import CRUMB_CHAR_W_PX, CRUMB_ELLIPSIS_PX, MAX_RUNS
from tools.spec.transforms import numbered, sequence
from wandb_modprof.records.modes import MODES, SCALES, Unit
from wandb_modprof.sinks.spec import SPEC_VERSION

Data = dict[str, Any]
N = len(MODES)


def lists() -> list[Data]:
    return [
        card(),
        *_crumbs(),
        top(),
        *_legends(),
        *_totals(),
        _bar_ticks(),
        *_messages(),
        *_controls(),
    ]


def _crumbs() -> list[Data]:
    """`crumbs_all`: the current view and its ancestors, each with its width; `crumbs`: those
    drawn. Where they are wider than the room left of the Fit button (`crumb_room`), the root
    stays and the views after it give way from the left, the first one kept starting with an
    ellipsis."""
    keep = (
        "datum.i === 0 || crumbs_w <= crumb_room || "
        f"datum.from_end <= crumb_room - crumb_w0 - {CRUMB_ELLIPSIS_PX}"
    )
    cut = "crumbs_w > crumb_room && datum.i > 0 && datum.n === 2"
    return [
        {
            "name": "crumbs_all",
            # the current view and its ancestors: views are numbered depth first, so they are
            # the views whose interval [view_id, view_last] holds the current view's id
            "source": "cur_views",
            "transform": [
                _filter("datum.view_id <= view_now_id && view_now_id <= datum.view_last"),
                _formula("key", "datum.view_key"),
                _formula("text", "datum.label"),
                {
                    "type": "window",
                    "sort": {"field": "view_id"},
                    "ops": ["row_number"],
                    "as": ["n"],
                },
                _formula("i", "datum.n - 1"),
                _formula("w", f"length(datum.text) * {CRUMB_CHAR_W_PX} + 22"),
                {
                    "type": "window",
                    "sort": {"field": "i", "order": "descending"},
                    "ops": ["sum"],
                    "fields": ["w"],
                    "as": ["from_end"],
                },
            ],
        },
        {
            "name": "crumbs",
            "source": "crumbs_all",
            "transform": [
                _filter(keep),
                {
                    "type": "window",
                    "sort": {"field": "i"},
                    "ops": ["row_number"],
                    "as": ["n"],
                },
                _formula("w", f"datum.w + ({cut} ? {CRUMB_ELLIPSIS_PX} : 0)"),
                {
                    "type": "window",
                    "sort": {"field": "i"},
                    "ops": ["sum"],
                    "fields": ["w"],
                    "as": ["x_end"],
                },
                _formula("last", "datum.key === view_now"),
                _formula(
                    "label",
                    f"({cut} ? '› … ' : '') + (datum.i > 0 ? '› ' : '') + datum.text",
                ),
            ],
        },
    ]


def _legends() -> list[Data]:
    cells = [mode_cell(m) for m in MODES]
    return [
        {
            "name": "modes",
            "transform": [
                sequence(N),
                _formula("key", "mode_keys[datum.i]"),
                _formula("label", "mode_labels[datum.i]"),
                _formula("col", f"{[c for c, _ in cells]}[datum.i]"),
                _formula("row", f"{[r for _, r in cells]}[datum.i]"),
                _formula("avail", "avail['v_' + datum.key] > 0"),
            ],
        },
        {
            "name": "scales_list",
            "transform": [
                sequence(len(SCALES)),
                _formula("key", f"{list(SCALES)}[datum.i]"),
                _formula("label", f"{[s.capitalize() for s in SCALES]}[datum.i]"),
            ],
        },
    ]


TOTALS: list[tuple[int, str, str, Unit]] = [  # (line, label, meta key, unit)
    (0, "Forward", "total_fwd_ms", Unit.MS),
    (0, "Backward", "total_bwd_ms", Unit.MS),
    (1, "Activations", "total_act_bytes", Unit.BYTES),
    (2, "Params", "total_param_bytes", Unit.BYTES),
    (2, "Grads", "total_grad_bytes", Unit.BYTES),
    (3, "Optimizer", "total_optim_bytes", Unit.BYTES),
    (3, "FLOPs", "total_fwd_flops", Unit.FLOPS),
]


def _totals() -> list[Data]:
    """`totals_items`: one formatted total each, in `TOTALS` order (read back by index in
    the signal `total_parts`); `totals`: the lines, items of a line joined by ' · '."""
    table = {
        "label": [t[1] for t in TOTALS],
        "key": [t[2] for t in TOTALS],
        "unit": [t[3].value for t in TOTALS],
    }
    item = (
        "isValid(tot[datum.key]) ? datum.label + ' ' + ("
        + fmt("datum.unit", "tot[datum.key]")
        + ") : ''"
    )
    by_line: dict[int, list[int]] = {}
    for i, (line, *_) in enumerate(TOTALS):
        by_line.setdefault(line, []).append(i)
    joined = []
    for items in by_line.values():
        a, *rest = (f"total_parts[{i}]" for i in items)
        for b in rest:
            a = f"({a}) + (({a}) !== '' && {b} !== '' ? '  ·  ' : '') + {b}"
        joined.append(a)
    joined.append(
        "isValid(tot.num_samples) ? format(tot.num_samples, 'd') + (tot.num_samples === 1 ? "
        "' sample  ·  ' : ' samples  ·  ') + format(tot.invocations, 'd') + "
        "(tot.invocations === 1 ? ' call' : ' calls') + (isValid(tot.overhead_pct) ? '  ·  ' + "
        "format(tot.overhead_pct, '.2~f') + ' % overhead' : '') : ''"
    )  # (overhead_pct: a watched run's measured cost of watching so far, `api.overhead`)
    # what a long run sampled every 100 steps pays, its one-time cost aside: a line of its own
    # (it does not fit beside the sample count in the sidebar's width)
    joined.append(
        "isValid(tot.overhead_long_pct) ? 'a long run at log_freq=100: ' + "
        "format(tot.overhead_long_pct, '.2~f') + ' % overhead' : ''"
    )
    joined.append("cold_text")  # the model's first step: left out, or the only sample
    # compiled regions (meta `compiled_region`): the calls inside have FLOPs only, so they are
    # absent from the time and memory top lists; this line says where they went
    joined.append(
        "regions_tot.n > 0 ? format(regions_tot.fused, 'd') + (regions_tot.fused === 1 ? "
        "' call' : ' calls') + ' fused in ' + regions_tot.n + ' compiled region' + "
        "(regions_tot.n === 1 ? '' : 's') : ''"
    )
    return [
        {
            "name": "totals_items",
            "transform": [
                sequence(len(TOTALS)),
                *(_formula(k, f"{v}[datum.i]".replace('"', "'")) for k, v in table.items()),
                _formula("text", item),
            ],
        },
        {
            "name": "totals",
            "transform": [
                sequence(len(joined)),
                # the "Checkpoint value" mode: the plan's lines in place of the totals
                _formula(
                    "line",
                    f"{CKPT_ON} ? (split(ckpt_text, '\\n')[datum.i] || '') : "
                    "[" + ", ".join(joined) + "][datum.i]",
                ),
                _filter("datum.line !== ''"),
                numbered(),
            ],
        },
    ]


def _bar_ticks() -> Data:
    """The colour bar's three labels (read back by index in the signal `bar_text`)."""
    ratios = f"[{fmt_ratio('pow(2, -rspan)')}, '1×', {fmt_ratio('pow(2, rspan)')}]"
    return {
        "name": "bar_ticks",
        "transform": [
            sequence(3),
            _formula("v", "[bar_lo, bar_mid, bar_hi][datum.i]"),
            _formula("text", f"cmp ? ({ratios})[datum.i] : ({fmt('mode_unit', 'datum.v')})"),
        ],
    }


def _message() -> str:
    return (
        "length(data('wandb')) === 0 ? 'Loading the profile… (if this stays, the table of this "
        "chart holds no rows)' : "
        "format_version === 0 ? 'These rows are not a wandb_modprof table (no table_format row)' : "
        f"format_version > {SPEC_VERSION} ? 'This table was written by a newer wandb_modprof "
        f"(table format v' + format_version + '); this panel reads v{SPEC_VERSION}' : "
        f"format_version < {SPEC_VERSION} ? 'This table was written by an older wandb_modprof "
        f"(table format v' + format_version + '); this panel reads v{SPEC_VERSION}: log the "
        "profile again with this version' : "
        "length(data('vnodes')) === 0 ? "
        "'No module graph in this profile (no structure pass ran)' : "
        "!(avail['v_' + mode] > 0) ? mode_label + ' was not measured in this run' : ''"
    )


def _messages() -> list[Data]:
    return [
        {
            "name": "messages",
            "transform": [sequence(1), _formula("text", _message()), _filter("datum.text !== ''")],
        },
        {
            "name": "banner",
            "transform": [
                sequence(1),
                _filter(
                    "reduced_text !== '' || unseen_text !== '' || flops_note !== '' || "
                    "ckpt_note !== '' || load_note !== ''"
                ),
                _formula(
                    "text",
                    "(reduced_text ? 'Reduced to fit the table: ' + reduced_text : '')"
                    " + (reduced_text && unseen_text ? ' · ' : '')"
                    " + (unseen_text ? 'Graph: ' + unseen_text : '')"
                    " + ((reduced_text || unseen_text) && flops_note ? ' · ' : '')"
                    " + (flops_note ? 'FLOPs: ' + flops_note : '')"
                    " + ((reduced_text || unseen_text) && ckpt_note ? ' · ' : '')"
                    " + (ckpt_note ? ckpt_note + ' (○ marked)' : '')"
                    " + ((reduced_text || unseen_text) && load_note ? ' · ' : '')"
                    " + (load_note ? 'Load: ' + load_note : '')",
                ),
            ],
        },
    ]


def _controls() -> list[Data]:
    return [
        {
            "name": "runs_shown",
            "source": "runs",
            "transform": [_filter(f"n_runs >= 2 && datum.i <= {MAX_RUNS}")],
        },
        {"name": "baselines_shown", "source": "runs_shown", "transform": [_filter("compare")]},
        {"name": "compare_toggle", "transform": [sequence(1), _filter("n_runs >= 2")]},
        {
            "name": "card_box",
            "source": "card",
            "transform": [
                {"type": "aggregate", "ops": ["count"], "as": ["lines"]},
                _filter("datum.lines > 0"),
            ],
        },
    ]
