"""The spec's data, second half: every text shown around the graph, computed once here (one
formatter expression per use, dispatching on a unit) so the marks only place it: the hover
card, breadcrumbs, ranked list, legends, totals, colour bar labels and messages."""

from __future__ import annotations

from typing import Any

from tools.spec.data import _filter, _formula
from tools.spec.expressions import (
    fmt,
    fmt_bytes,
    fmt_decimal,
    fmt_ms,
    fmt_ratio,
    missing,
    mode_cell,
    share,
)
from tools.spec.theme import CRUMB_CHAR_W_PX, CRUMB_ELLIPSIS_PX, MAX_RUNS
from wandb_modprof.records.modes import MODES, SCALES, Unit
from wandb_modprof.records.roofline import BOUND_TEXT, BOUNDS
from wandb_modprof.sinks.spec import SPEC_VERSION
from wandb_modprof.view.columns import BOUND_CODES

Data = dict[str, Any]
N = len(MODES)


def _sequence(n: int) -> dict[str, Any]:
    return {"type": "sequence", "start": 0, "stop": n, "as": "i"}


def _numbered() -> dict[str, Any]:
    return {"type": "window", "ops": ["row_number"], "as": ["n"]}


def lists() -> list[Data]:
    return [
        _card(),
        *_crumbs(),
        _top(),
        *_legends(),
        *_totals(),
        _bar_ticks(),
        *_messages(),
        *_controls(),
    ]


def _card_line() -> str:
    """Line `datum.line_i` of the hover card: the node, its value in every mode, then notes."""
    v = "datum.mv"
    value = (
        f"isValid({v}) ? datum.ml + ': ' + ({fmt('datum.mu', v)}) + ({share('datum.mt', v)}) : ''"
    )
    notes = _card_notes()
    out = "''"
    for i, note in reversed(list(enumerate(notes, start=N + 1))):
        out = f"datum.line_i === {i} ? ({note}) : ({out})"
    header = "datum.module_name ? datum.module_name + ' (' + datum.module_type + ')' : datum.label"
    return f"datum.line_i === 0 ? ({header}) : datum.line_i <= {N} ? ({value}) : ({out})"


BYTES_PER_S, FLOP = "'B/s'", "'FLOP'"  # `fmt_decimal` suffixes (expressions)


def _card_notes() -> list[str]:
    """The hover card's notes after the modes' values, one line each (empty: not shown)."""
    spread = "datum.samples > 0 && isValid(datum.fwd_ms_std) && datum.node_kind === 'module'"
    return [
        # Compare mode: the ratio of what the node is coloured by (`vnodes`: the efficiency
        # modes' time lost, which the mode's rank label names), where both are > 0
        "cmp ? (isValid(datum.bv) && datum.bv > 0 && isValid(datum.v) && datum.v > 0 ? "
        f"'vs baseline: ' + ({fmt_ratio('datum.v / datum.bv')}) + "
        "(mode_rank_label ? ' ' + mode_rank_label : '') : "
        "indata('base_nodes', 'node_key', datum.node_key) ? "
        "'vs baseline: no ratio (0 or not measured)' : 'not in the baseline run') : ''",
        # The spread, split over two short lines: one line of it ("Forward spread: ... over 3
        # samples") did not fit the card and was cut. The values above are the medians
        # (`statistic`), so the mean is said here, beside the range.
        f"{spread} ? 'Forward range: ' + ({fmt_ms('datum.fwd_ms_min')}) + ' – ' + "
        f"({fmt_ms('datum.fwd_ms_max')}) : ''",
        f"{spread} ? (statistic === 'median' ? 'mean ' + ({fmt_ms('datum.fwd_ms_mean')}) + ', ' "
        ": '') + datum.samples + (datum.samples === 1 ? ' sample' : ' samples') : ''",
        # A sample that held a garbage collection (`capture/step/gc_watch.py`): its values include
        # the pause, which the median leaves out while the other samples outnumber it.
        f"!{missing('gc_samples')} && datum.gc_samples > 0 ? 'GC in ' + datum.gc_samples + "
        f"' of ' + datum.samples + ' samples (' + ({fmt_ms('datum.gc_ms_max')}) + ')' : ''",
        f"!{missing('rank_slowest')} && datum.rank_count > 1 ? 'Slowest rank: ' + "
        "datum.rank_slowest + ' of ' + datum.rank_count : ''",
        # (its line 2: the slowest rank's fwd + bwd beside the mean over ranks)
        f"!{missing('rank_slowest')} && datum.rank_count > 1 ? 'fwd+bwd ' + "
        f"({fmt_ms('datum.rank_fwd_bwd_max_ms')}) + ', mean ' + "
        f"({fmt_ms('datum.rank_fwd_bwd_mean_ms')}) : ''",
        # Compiled regions (meta `compiled_region`): a region's root was measured as one call;
        # the calls inside ran fused (drawn from the graph traced on fake tensors, grey in the
        # time and memory modes), and the root's own view gives its `self` node the whole time.
        *_region_lines(),
        # The efficiency modes' class (`records.roofline`): what bounds the call's forward and
        # backward, and its numbers: bytes moved and at what rate, intensity
        *_bound_lines("fwd", "Fwd"),
        *_bound_lines("bwd", "Bwd"),
        # the backward's FLOPs where its bytes were not counted (no backward in the pass's step)
        f"{missing('bwd_bound')} && !{missing('bwd_flops')} && datum.bwd_flops > 0 ? "
        f"'Backward: ' + ({fmt_decimal('datum.bwd_flops', FLOP)}) + ' (counted)' : ''",
        "datum.has_view ? 'Click to open' : ''",
        "datum.node_kind === 'group' ? datum.group_count + ' modules merged to fit the table' : ''",
        # the first members by name (all of them are in the table's `group_members`)
        "datum.node_kind === 'group' && datum.group_members ? truncate('e.g. ' + "
        "join(slice(split(datum.group_members, '\\n'), 0, 3), ', '), 46) : ''",
        # Calls no captured graph holds (meta `unseen_calls`) are the module nodes drawn without
        # an edge; the note stays off in tables where every call was seen.
        "unseen_text && datum.node_kind === 'module' && !indata('vedges', 'src_key', "
        "datum.node_key) && !indata('vedges', 'dst_key', datum.node_key) && "
        "!indata('vframed', 'member', datum.node_key) ? "
        "'No edges: appeared after the graph was drawn' : ''",
        # a module call no structure pass ran has no FLOP count (meta `flops_unknown`)
        "flops_text && datum.node_kind === 'module' && "
        "indexof(split(datum.missing, ','), 'fwd_flops') >= 0 ? "
        "'FLOPs not counted: no structure pass ran this call' : ''",
    ]


def _bound_lines(way: str, name: str) -> tuple[str, str, str]:
    """Three card lines of the forward's or backward's place under the roofline (classes:
    `records.roofline.BOUNDS`): "Fwd: memory-bound, 1.2 ms lost", then "4 MiB at 9 GB/s,
    0.25 FLOP/B"; a call faster than its roofline: "Fwd: above the roofline, capped at 100%",
    its numbers, and why it can be ("reason: ..."); a call without work: "Fwd: no work: no
    FLOPs, no bytes moved" alone."""
    bound, ms, nbytes, flops = (f"datum.{way}_{c}" for c in ("bound", "ms", "bytes", "flops"))
    none, over_c, over_m = (BOUND_CODES[b] for b in ("none", "above_compute", "above_memory"))
    known = f"!{missing(f'{way}_bound')} && {bound} >= 1 && {bound} <= {len(BOUNDS)}"
    above = f"({bound} === {over_c} || {bound} === {over_m})"
    classes = str([BOUND_TEXT[b] for b in BOUNDS])
    # why a call can beat its roofline: the bytes are logical (cache-resident data moves faster
    # than the memory's peak), or the peak FLOP/s is below the machine's real one
    reasons = {
        over_m: "reason: cached data beat the memory peak",
        over_c: "reason: peak FLOP/s below the real one",
    }
    lost = (
        f"isValid(datum.{way}_lost_ms) ? ', ' + ({fmt_ms(f'datum.{way}_lost_ms')}) + ' lost' : ''"
    )
    return (
        f"{known} ? '{name}: ' + ({bound} === {none} ? 'no work: no FLOPs, no bytes moved' : "
        f"{above} ? 'above the roofline, capped at 100%' : {classes}[{bound} - 1] + ({lost})) "
        ": ''",
        f"{known} && {bound} !== {none} && {ms} > 0 ? ({fmt_bytes(nbytes)}) + ' at ' + "
        f"({fmt_decimal(f'{nbytes} / {ms} * 1000', BYTES_PER_S)}) + ({nbytes} > 0 ? ', ' + "
        f"format({flops} / {nbytes}, '.3~r') + ' FLOP/B' : '') : ''",
        f"{known} && {bound} === {over_m} ? '{reasons[over_m]}' : "
        f"{known} && {bound} === {over_c} ? '{reasons[over_c]}' : ''",
    )


# The card's kinds of node in a compiled region, each with its three lines.
_INSIDE = (
    "region_key !== '' && (datum.node_kind === 'module' || datum.node_kind === 'group' || "
    "(datum.node_kind === 'self' && view_now !== region_key))"
)
_ROOT_SELF = "region_key !== '' && datum.node_kind === 'self' && view_now === region_key"
_ROOT = "datum.region_n >= 0 && datum.node_kind === 'module'"
_REGION_LINES = (
    (
        _INSIDE,
        "'Inside compiled region ' + region_label + ':'",
        "'fused by torch.compile, its own time'",
        "'and memory are not measured'",
    ),
    (
        _ROOT_SELF,
        "'Compiled region ' + region_label + ': the calls'",
        "'inside ran fused, so its whole time'",
        "'and memory are here'",
    ),
    (
        _ROOT,
        "'Compiled region (torch.compile),'",
        "'measured as one call' + (datum.region_n > 0 ? ': its ' + datum.region_n + "
        "(datum.region_n === 1 ? ' call' : ' calls') + ' inside' : '')",
        "datum.region_n > 0 ? 'ran fused, not measured on their own' : ''",
    ),
)


def _region_lines() -> list[str]:
    """Three card lines, each saying the line of whichever kind the node is (they exclude
    each other: a region's root lies outside every region)."""
    out = []
    for i in range(3):
        line = "''"
        for when, *texts in reversed(_REGION_LINES):
            line = f"({when}) ? ({texts[i]}) : ({line})"
        out.append(line)
    return out


def _card() -> Data:
    lines = N + 1 + len(_card_notes())  # the header, one per mode, the notes
    per_mode = [
        _formula(
            f"m{field}",
            f"datum.line_i >= 1 && datum.line_i <= {N} ? {table}[datum.line_i - 1] : ''",
        )
        for field, table in (
            ("k", "mode_keys"),
            ("l", "mode_labels"),
            ("u", "mode_units"),
            ("t", "mode_totals"),
        )
    ]
    return {
        "name": "card",
        "source": "vnodes",
        "transform": [
            _filter("card_key !== '' && datum.node_key === card_key"),
            _formula("line_i", str(list(range(lines)))),
            {"type": "flatten", "fields": ["line_i"], "as": ["line_i"]},
            *per_mode,
            # a compiled region's root: how many calls ran fused inside it (-1: not a root)
            {
                "type": "lookup",
                "from": "m_regions",
                "key": "meta_value",
                "fields": ["node_key"],
                "values": ["meta_number"],
                "as": ["region_n"],
                "default": -1,
            },
            _formula("mv", "datum['v_' + datum.mk]"),
            _formula("line", _card_line()),
            _filter("datum.line !== ''"),
            _numbered(),
        ],
    }


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


TOP_NAME_CHARS = 16  # a ranked entry's name, at most (its column is 100 px)


def _top() -> Data:
    most = TOP_NAME_CHARS + 4  # a name made longer to tell it apart (the label gives way)

    def _cut_at_dot(tail: str) -> str:
        """`tail` from after its first dot (a whole dotted suffix), or whole if it has none."""
        dot = f"indexof({tail}, '.')"
        return f"({dot} >= 0 && {dot} < length({tail}) - 1 ? substring({tail}, {dot} + 1) : {tail})"

    return {
        "name": "top",
        "source": "nodes_all",
        "transform": [
            # modules only: a group node ("7804 more modules") holds the sum of many and would
            # rank first, above the modules it is not
            _filter("datum.node_kind === 'module'"),
            _formula("v", "datum['v_' + mode]"),
            _filter("isValid(datum.v)"),
            # the order: the value, or what the mode ranks by (`Mode.rank_by`: the efficiency
            # mode by the time lost to the roofline), which the value column then shows
            _formula("r", "mode_rank_label ? datum['r_' + mode] : datum.v"),
            _filter("isValid(datum.r)"),
            {
                "type": "window",
                "sort": {"field": ["r", "node_key"], "order": ["descending", "ascending"]},
                "ops": ["row_number"],
                "as": ["rank"],
            },
            _filter("datum.rank <= top_n"),
            _formula(
                "value_text",
                f"mode_rank_label ? ({fmt('mode_rank_unit', 'datum.r')}) : "
                f"({fmt('mode_unit', 'datum.v')})",
            ),
            # the share in its own narrow column: "86%" from 10 % up, "7.1%" below; a mode
            # ranked by something else shows its value there ("23%" of the roofline)
            _formula(
                "share_text",
                # (an efficiency under 1 % in a column 34 px wide: "<1%", the card has it exact)
                f"mode_rank_label ? (mode_unit === 'percent' && datum.v < 1 ? '<1%' : "
                f"({fmt('mode_unit', 'datum.v')})) : "
                "isValid(tot[mode_total]) && tot[mode_total] > 0 ? format(datum.v / "
                "tot[mode_total], datum.v >= 0.1 * tot[mode_total] ? '.0%' : '.1%') : ''",
            ),
            _formula("who", "datum.module_name || datum.label"),
            # The name shown: what tells this entry apart from the others listed. Each listed
            # entry is crossed with the depths of its dotted suffixes ("experts.1", then
            # "0.experts.1", ...); a suffix no other entry has is unique, and the entry's
            # shortest unique one (`uniq_d` parts) must show. Within `TOP_NAME_CHARS` the
            # name keeps its end as before, cut at a dot ("transformer.h.0.mlp.c_fc" ->
            # "…h.0.mlp.c_fc"); where that tail is not unique (MoE: "…experts.1" of every
            # layer) the unique suffix shows, up to `most` characters, longer ones keeping the
            # part that differs and the name's end: "layers.0…experts.1". The full name:
            # the entry's tooltip (`sidebar_lists.py`) and, clicked, the card.
            _formula("parts", "split(datum.who, '.')"),
            _formula("np", "length(datum.parts)"),
            _formula("depth", "sequence(1, datum.np + 1)"),
            {"type": "flatten", "fields": ["depth"]},
            _formula("suffix", "join(slice(datum.parts, -datum.depth), '.')"),
            {"type": "joinaggregate", "groupby": ["suffix"], "ops": ["count"], "as": ["n_same"]},
            # (the tail kept within TOP_NAME_CHARS: the whole name, or a suffix of at most
            # one character less, for the "…" before it)
            _formula(
                "fit",
                f"length(datum.suffix) <= {TOP_NAME_CHARS - 1} || (datum.depth === datum.np "
                f"&& length(datum.who) <= {TOP_NAME_CHARS}) ? datum.depth : 0",
            ),
            _formula("uniq", "datum.n_same === 1 ? datum.depth : datum.np"),
            {
                "type": "joinaggregate",
                "groupby": ["rank"],
                "ops": ["max", "min"],
                "fields": ["fit", "uniq"],
                "as": ["fit_d", "uniq_d"],
            },
            _filter("datum.depth === datum.np"),  # one row per entry again: the whole name's
            # a unique part that is an index ("0" of "layers.0.experts.1") says more with the
            # name of its container before it: "layers.0"
            _formula(
                "need",
                "datum.uniq_d < datum.np && test(regexp('^[0-9]+$'), "
                "datum.parts[datum.np - datum.uniq_d]) ? datum.uniq_d + 1 : datum.uniq_d",
            ),
            _formula("tail", f"slice(datum.who, -{TOP_NAME_CHARS})"),
            _formula("kept", f"'…' + {_cut_at_dot('datum.tail')}"),
            _formula("lead", "datum.need < datum.np ? '…' : ''"),
            _formula("need_s", "join(slice(datum.parts, -datum.need), '.')"),
            # the part that differs (with its container's name), and what follows it
            _formula(
                "head",
                "join(slice(datum.parts, datum.np - datum.need, datum.np - datum.uniq_d + 1), '.')",
            ),
            _formula("rest", "join(slice(datum.parts, datum.np - datum.uniq_d + 1), '.')"),
            _formula("room", f"{most} - length(datum.head) - 1"),
            _formula("rest_tail", "slice(datum.rest, -max(1, datum.room))"),
            # its end: whole parts, unless they leave most of the room unused (a long last
            # part: its last characters then)
            _formula("rest_cut", _cut_at_dot("datum.rest_tail")),
            _formula(
                "end",
                "length(datum.rest) <= datum.room ? datum.rest : "
                "2 * length(datum.rest_cut) >= datum.room ? datum.rest_cut : datum.rest_tail",
            ),
            _formula(
                "short_who",
                # the name fits, or its tail tells it apart (a last part too long for the
                # column, unique: its end, as before)
                f"length(datum.who) <= {TOP_NAME_CHARS} ? datum.who : "
                "datum.need <= datum.fit_d || (datum.fit_d === 0 && datum.need === 1) ? "
                "datum.kept : "
                f"length(datum.need_s) <= {most} ? datum.lead + datum.need_s : "
                "datum.rest === '' ? '…' + slice(datum.head, -" + str(most - 1) + ") : "
                "datum.room >= 3 ? datum.lead + datum.head + '…' + datum.end : "
                f"'…' + slice(datum.head, -{most - 2}) + '…'",
            ),
            # the same module called more than once: its entries differ by their call
            # ("enc #1"; the node key ends in "#<call>")
            _formula(
                "short_who",
                "datum.n_same > 1 ? datum.short_who + ' ' + "
                "replace(datum.node_key, regexp('^.*#'), '#') : datum.short_who",
            ),
            _formula("rank_text", "datum.rank + '. ' + datum.short_who"),
        ],
    }


def _legends() -> list[Data]:
    cells = [mode_cell(m) for m in MODES]
    return [
        {
            "name": "modes",
            "transform": [
                _sequence(N),
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
                _sequence(len(SCALES)),
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
                _sequence(len(TOTALS)),
                *(_formula(k, f"{v}[datum.i]".replace('"', "'")) for k, v in table.items()),
                _formula("text", item),
            ],
        },
        {
            "name": "totals",
            "transform": [
                _sequence(len(joined)),
                _formula("line", "[" + ", ".join(joined) + "][datum.i]"),
                _filter("datum.line !== ''"),
                _numbered(),
            ],
        },
    ]


def _bar_ticks() -> Data:
    """The colour bar's three labels (read back by index in the signal `bar_text`)."""
    ratios = f"[{fmt_ratio('pow(2, -rspan)')}, '1×', {fmt_ratio('pow(2, rspan)')}]"
    return {
        "name": "bar_ticks",
        "transform": [
            _sequence(3),
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
            "transform": [_sequence(1), _formula("text", _message()), _filter("datum.text !== ''")],
        },
        {
            "name": "banner",
            "transform": [
                _sequence(1),
                _filter("reduced_text !== '' || unseen_text !== '' || flops_note !== ''"),
                _formula(
                    "text",
                    "(reduced_text ? 'Reduced to fit the table: ' + reduced_text : '')"
                    " + (reduced_text && unseen_text ? ' · ' : '')"
                    " + (unseen_text ? 'Graph: ' + unseen_text : '')"
                    " + ((reduced_text || unseen_text) && flops_note ? ' · ' : '')"
                    " + (flops_note ? 'FLOPs: ' + flops_note : '')",
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
        {"name": "compare_toggle", "transform": [_sequence(1), _filter("n_runs >= 2")]},
        {
            "name": "card_box",
            "source": "card",
            "transform": [
                {"type": "aggregate", "ops": ["count"], "as": ["lines"]},
                _filter("datum.lines > 0"),
            ],
        },
    ]
