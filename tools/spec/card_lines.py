"""The hover card's data (dataset `card`): one row per line shown, each with its text: the
node's name, its value in every mode, then the notes (spread, GC, ranks, compiled regions,
roofline bounds, groups, ...), a note's line dropped where it is empty. The card's marks and
signals are in `card`; `lists` puts this dataset with the other lists."""

from __future__ import annotations

from tools.spec.data import Data, _filter, _formula
from tools.spec.expressions import (
    CKPT_ON,
    fmt,
    fmt_bytes,
    fmt_decimal,
    fmt_ms,
    fmt_ratio,
    missing,
    share,
)
from tools.spec.transforms import numbered
from wandb_modprof.records.checkpoint import STATE_TEXT, STATES
from wandb_modprof.records.modes import MODES
from wandb_modprof.records.roofline import BOUND_TEXT, BOUNDS
from wandb_modprof.view.columns import BOUND_CODES

N = len(MODES)


def card() -> Data:
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
            numbered(),
        ],
    }


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
        # The "Checkpoint value" mode (`view.checkpoint_cells`): where the call's module stands in
        # the plan, and what checkpointing the call would free for what recompute
        f"{CKPT_ON} && !{missing('ckpt_state')} && datum.ckpt_state >= 1 && "
        f"datum.ckpt_state <= {len(STATES)} ? 'Plan: ' + {_state_texts()}[datum.ckpt_state - 1] "
        ": ''",
        f"{CKPT_ON} && !{missing('ckpt_freed_bytes')} ? 'Frees ~' + "
        f"({fmt_bytes('datum.ckpt_freed_bytes')}) + (isValid(datum.fwd_ms) ? ' for ' + "
        f"({fmt_ms('datum.fwd_ms')}) + ' recompute' : '') : ''",
        # The "Load" mode (`view.load`): the list's imbalance beside the call's share, and a
        # member no sample called
        f"mode === 'load' && !{missing('load_imbalance')} ? 'List imbalance: ' + "
        f"({fmt_ratio('datum.load_imbalance')}) + ' (max / mean rows)' : ''",
        f"mode === 'load' && !{missing('load_rows')} ? 'Rows per step: ' + "
        "format(datum.load_rows, '.3~s') : ''",
        f"mode === 'load' && !{missing('load_idle_samples')} ? 'Never called in ' + "
        "datum.load_idle_samples + ' samples' : ''",
        # a module call no structure pass ran has no FLOP count (meta `flops_unknown`)
        "flops_text && datum.node_kind === 'module' && "
        "indexof(split(datum.missing, ','), 'fwd_flops') >= 0 ? "
        "'FLOPs not counted: no structure pass ran this call' : ''",
    ]


def _state_texts() -> str:
    """The plan states' words (`records.checkpoint.STATE_TEXT`) as a Vega array literal."""
    return "[" + ", ".join(f"'{STATE_TEXT[s]}'" for s in STATES) + "]"


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
