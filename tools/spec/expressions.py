"""Vega expressions shared by the sections: a mode's value and missing cells, and the unit
formatters. The formatters write numbers exactly as `wandb_modprof.view.units.format_value`
does (tests/sinks/test_spec_units.py evaluates them in Vega and compares)."""

from __future__ import annotations

from collections.abc import Callable

from wandb_modprof.records.modes import CHECKPOINT_MODE, MODES, Combine, Group, Mode, Unit
from wandb_modprof.view.checkpoint_cells import STATE_CODES

SIG = "'.3~r'"  # 3 significant digits, no exponent, no trailing zeros (units._sig)


def missing(column: str, d: str = "datum") -> str:
    # a table from before a column existed has no such cell: missing too
    return (
        f"({d}.missing === '*' || indexof(',' + {d}.missing + ',', ',{column},') >= 0 "
        f"|| !isValid({d}.{column}))"
    )


def value_expr(m: Mode, d: str = "datum") -> str:
    """The node's value in mode `m`, NaN where the table says a column was not measured."""
    gone = " || ".join(missing(c, d) for c in m.columns)
    cols = [f"{d}.{c}" for c in m.columns]
    value = " + ".join(cols) if m.combine is Combine.SUM else f"max({', '.join(cols)})"
    return f"({gone}) ? NaN : ({value})"


def rank_expr(m: Mode, d: str = "datum") -> str:
    """What the ranked list orders mode `m` by where not its value (`Mode.rank_by`): the sum
    of those columns, NaN where one was not measured."""
    gone = " || ".join(missing(c, d) for c in m.rank_by)
    return f"({gone}) ? NaN : ({' + '.join(f'{d}.{c}' for c in m.rank_by)})"


def colour_field(d: str = "datum") -> str:
    """What a node row of `nodes_every` is coloured by in the current mode (`Mode.colour_value`):
    the `r_` field of a mode ranked by something else (`Mode.rank_by`: the efficiency modes'
    time lost), the `v_` field of the others."""
    ranked = [m.key for m in MODES if m.rank_by]
    return f"(indexof({ranked}, mode) >= 0 ? {d}['r_' + mode] : {d}['v_' + mode])"


# ---- unit formatters (one per Unit; `fmt` dispatches on a unit expression) -------------------
def fmt_ms(v: str) -> str:
    return (
        f"abs({v}) >= 1000 ? format({v} / 1000, {SIG}) + ' s' : "
        f"abs({v}) >= 1 ? format({v}, {SIG}) + ' ms' : format({v} * 1000, {SIG}) + ' µs'"
    )


def fmt_bytes(v: str) -> str:
    out = f"format({v}, ',d') + ' B'"
    for power, prefix in ((1, "KiB"), (2, "MiB"), (3, "GiB"), (4, "TiB")):
        size = 1024**power
        out = f"abs({v}) >= {size} ? format({v} / {size}, {SIG}) + ' {prefix}' : ({out})"
    return out


def fmt_decimal(v: str, suffix: str) -> str:
    """Decimal prefixes; `suffix` is an expression ('FLOP' or 'FLOP/s')."""
    out = f"format({v}, {SIG}) + ' ' + {suffix}"
    for size, prefix in ((1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T"), (1e15, "P")):
        scaled = f"format({v} / {size:g}, {SIG}) + ' {prefix}' + {suffix}"
        out = f"abs({v}) >= {size:g} ? {scaled} : ({out})"
    return out


def fmt_ratio(v: str) -> str:
    return f"format({v}, {SIG}) + '×'"


def fmt_percent(v: str) -> str:
    return f"format({v}, {SIG}) + '%'"


def fmt_norm(v: str) -> str:
    return f"format({v}, '.4~g')"


# The "Checkpoint value" mode is on; and the node's module is in the table's checkpoint plan
# (`view.checkpoint_cells`) with that mode on: the graph's mark and the ranked list's "○".
CKPT_ON = f"mode === '{CHECKPOINT_MODE}'"
IN_PLAN = f"{CKPT_ON} && datum.ckpt_state === {STATE_CODES['planned']}"


def fmt(unit: str, v: str) -> str:
    """The number `v` written in the unit named by the expression `unit` ('' for no unit)."""
    decimal = fmt_decimal(v, f"({unit} === 'flops' ? 'FLOP' : 'FLOP/s')")
    branches: list[tuple[tuple[Unit, ...], str]] = [
        ((Unit.MS,), fmt_ms(v)),
        ((Unit.BYTES,), fmt_bytes(v)),
        ((Unit.BYTES_PER_MS,), f"({fmt_bytes(v)}) + '/ms'"),
        ((Unit.FLOPS, Unit.FLOP_S), decimal),
        ((Unit.RATIO,), fmt_ratio(v)),
        ((Unit.NORM,), fmt_norm(v)),
        ((Unit.PERCENT,), fmt_percent(v)),
    ]
    assert {u for units, _ in branches for u in units} == set(Unit), "a unit has no formatter"
    out = "''"
    for units, expr in reversed(branches):
        test = " || ".join(f"{unit} === '{u.value}'" for u in units)
        out = f"{test} ? ({expr}) : ({out})"
    return out


FORMATTERS: dict[Unit, Callable[[str], str]] = {
    Unit.MS: fmt_ms,
    Unit.BYTES: fmt_bytes,
    Unit.BYTES_PER_MS: lambda v: f"({fmt_bytes(v)}) + '/ms'",
    Unit.FLOPS: lambda v: fmt_decimal(v, "'FLOP'"),
    Unit.FLOP_S: lambda v: fmt_decimal(v, "'FLOP/s'"),
    Unit.RATIO: fmt_ratio,
    Unit.NORM: fmt_norm,
}


def share(total_key: str, v: str) -> str:
    """' (12.3%)' of the meta total named by the expression `total_key`, '' without one."""
    total = f"tot[{total_key}]"
    return f"isValid({total}) && {total} > 0 ? ' (' + format({v} / {total}, '.1%') + ')' : ''"


# ---- the legend's layout ---------------------------------------------------------------------
LEGEND_COLUMNS = {
    0: [Group.TIME, Group.COMPUTE, Group.RANKS],
    1: [Group.MEMORY, Group.HEALTH, Group.PLAN],
}


def mode_cell(m: Mode) -> tuple[int, int]:
    """(column, row) of a mode's legend entry: Time + Compute left, Memory + Health right."""
    for col, groups in LEGEND_COLUMNS.items():
        row = 0
        for group in groups:
            row += 1  # the heading
            for other in MODES:
                if other.group == group:
                    if other is m:
                        return col, row
                    row += 1
    raise ValueError(m.key)


def heading_rows() -> list[tuple[str, int, int]]:
    out = []
    for col, groups in LEGEND_COLUMNS.items():
        row = 0
        for group in groups:
            out.append((group.value, col, row))
            row += 1 + sum(1 for m in MODES if m.group == group)
    return out


def legend_rows() -> int:
    return 1 + max(mode_cell(m)[1] for m in MODES)


# ---- refs (the table's keys and names relative to their view, `wandb_modprof/view/refs.py`) --
def resolve_ref(ref: str, vk: str = "datum.vk", vn: str = "datum.vn") -> str:
    """The string the ref `ref` stands for, in the view with key `vk` and module name `vn`."""
    head = f"slice({ref}, 0, 1)"
    return (
        f"({ref} === '=' ? {vn} : {head} === '|' ? {vk} + {ref} : {head} === '.' ? {vn} + {ref} "
        f": {head} === '~' ? slice({ref}, 1) : {ref})"
    )
