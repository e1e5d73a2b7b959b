"""The analysis modes of the panel: what a node is coloured by, read from the flat table.

One list serves the Vega spec (generated from it by `tools/build_spec.py`), the Python API
(validating a default mode) and the tests (computing the colour a node must get).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class _StrEnum(str, enum.Enum):
    """A string enum whose members compare, hash, format and serialise as their values
    (`enum.StrEnum` is Python 3.11+; this package supports 3.10)."""

    def __str__(self) -> str:
        # (str, Enum) formats as "Unit.MS" in f-strings from Python 3.12 on: keep the value
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Unit(_StrEnum):
    """How a mode's values are written (`wandb_modprof.view.units.format_value`)."""

    MS = "ms"
    """Milliseconds: s at 1000 ms and above, µs below 1 ms."""
    BYTES = "bytes"
    """Bytes, with binary prefixes (KiB, MiB, GiB, TiB); whole bytes below 1 KiB."""
    FLOPS = "flops"
    """Floating-point operations, with decimal prefixes (kFLOP ... PFLOP)."""
    FLOP_S = "flop_s"
    """Floating-point operations per second, with decimal prefixes (kFLOP/s ... PFLOP/s)."""
    RATIO = "ratio"
    """A dimensionless ratio, written with a multiplication sign after it (e.g. 1.8 times)."""
    NORM = "norm"
    """An L2 norm: 4 significant digits, no unit."""
    PERCENT = "percent"
    """A share in percent: 3 significant digits and a percent sign (76%, 7.6%, 0.35%)."""
    BYTES_PER_MS = "bytes_per_ms"
    """Bytes per millisecond, written as bytes with "/ms" after them (1.5 MiB/ms)."""


class Combine(_StrEnum):
    """How a mode folds the table columns it reads into one value."""

    SUM = "sum"
    """The sum of the columns (e.g. forward + backward time)."""
    MAX = "max"
    """The largest of the columns (e.g. the forward or backward device peak)."""


class Group(_StrEnum):
    """The legend heading a mode is listed under."""

    TIME = "Time"
    """Forward / backward wall time."""
    MEMORY = "Memory"
    """Activations, parameters, gradients, optimizer state, peaks of live memory."""
    HEALTH = "Health"
    """Parameter and gradient norms, and the load on a module list's members (a
    mixture-of-experts' experts: a collapsing router shows there first)."""
    COMPUTE = "Compute"
    """FLOPs and FLOP/s."""
    RANKS = "Ranks"
    """Distributed runs: imbalance between ranks."""
    PLAN = "Checkpoint"
    """What activation checkpointing would free per ms of recompute, and the plan."""


@dataclass(frozen=True)
class Mode:
    key: str  # the value of the spec's `mode` signal and of `default_mode=`
    label: str  # legend entry
    group: Group  # legend column heading
    unit: Unit  # how values are written
    columns: tuple[str, ...]  # table columns the value reads; missing if any of them is
    combine: Combine  # how `columns` fold into one value
    total: str  # meta row whose meta_number is the model total ("" = no share shown)
    # The ranked list's order where it is not the value's: the sum of these columns, shown in
    # `rank_unit` and named by `rank_label` ("" = ranked by the value itself). The nodes are
    # coloured by it too (`colour_value`), so the hottest node is the list's first, and the
    # colour bar's title says what it is: `colour_label`.
    rank_by: tuple[str, ...] = ()
    rank_unit: Unit = Unit.MS
    rank_label: str = ""
    bound_by: str = ""  # the column of the roofline class (`records.roofline`), for the list
    colour_label: str = ""  # the colour bar's title where the colour is `rank_by`'s

    def value(self, row: Mapping[str, object]) -> float | None:
        """The node's value in this mode (its card line, its ranked list entry), or None where
        the table says it was not measured."""
        found = _read(row, self.columns)
        if found is None:
            return None
        return sum(found) if self.combine is Combine.SUM else max(found)

    def rank_value(self, row: Mapping[str, object]) -> float | None:
        """What the ranked list orders the node by: the sum of `rank_by` (None where one is not
        measured), or its value where the mode has no `rank_by`."""
        if not self.rank_by:
            return self.value(row)
        found = _read(row, self.rank_by)
        return None if found is None else sum(found)

    def colour_value(self, row: Mapping[str, object]) -> float | None:
        """What the node is coloured by (None: not measured, drawn grey; the spec's
        `tools/spec/expressions.colour_field`): what the ranked list orders by, so the hottest
        node is the one it lists first (the efficiency modes: the time lost to the roofline,
        not the share reached, which would make the calls with nothing to win the hottest)."""
        return self.rank_value(row)


def _read(row: Mapping[str, object], columns: tuple[str, ...]) -> list[float] | None:
    """The row's `columns` as floats, None where the table says one was not measured."""
    missing = str(row.get("missing", ""))
    if missing == "*" or any(c in missing.split(",") or c not in row for c in columns):
        return None  # (a table from before a column existed has no such cell)
    return [float(row[c]) for c in columns]  # type: ignore[arg-type]


_T, _M, _H, _C, _R = Group.TIME, Group.MEMORY, Group.HEALTH, Group.COMPUTE, Group.RANKS
_P = Group.PLAN
# The mode whose panel marks the modules of the table's checkpoint plan and shows its lines
CHECKPOINT_MODE = "ckpt"
_SUM, _MAX = Combine.SUM, Combine.MAX
MODES: tuple[Mode, ...] = (
    Mode("fwd", "Forward", _T, Unit.MS, ("fwd_ms",), _SUM, "total_fwd_ms"),
    Mode("bwd", "Backward", _T, Unit.MS, ("bwd_ms",), _SUM, "total_bwd_ms"),
    Mode("fwd_bwd", "Fwd + bwd", _T, Unit.MS, ("fwd_ms", "bwd_ms"), _SUM, "total_fwd_bwd_ms"),
    Mode(
        "self",
        "Self (fwd + bwd)",
        _T,
        Unit.MS,
        ("fwd_self_ms", "bwd_self_ms"),
        _SUM,
        "total_fwd_bwd_ms",
    ),
    Mode("act", "Activations", _M, Unit.BYTES, ("act_bytes",), _SUM, "total_act_bytes"),
    Mode("param", "Parameters", _M, Unit.BYTES, ("param_bytes",), _SUM, "total_param_bytes"),
    Mode("grad", "Gradients", _M, Unit.BYTES, ("grad_bytes",), _SUM, "total_grad_bytes"),
    Mode("optim", "Optimizer state", _M, Unit.BYTES, ("optim_bytes",), _SUM, "total_optim_bytes"),
    # On accelerators the allocator's peak; on CPU the peak of the saved-tensor memory curve
    # (`capture/memory_curve.py`): above what was live as the call started, either way.
    Mode(
        "peak",
        "Peak memory",
        _M,
        Unit.BYTES,
        ("fwd_mem_peak_bytes", "bwd_mem_peak_bytes"),
        _MAX,
        "",
    ),
    Mode("param_norm", "Parameter norm", _H, Unit.NORM, ("param_norm",), _SUM, ""),
    Mode("grad_norm", "Gradient norm", _H, Unit.NORM, ("grad_norm",), _SUM, ""),
    Mode("flops", "FLOPs (fwd)", _C, Unit.FLOPS, ("fwd_flops",), _SUM, "total_fwd_flops"),
    Mode("flop_s", "FLOP/s (fwd)", _C, Unit.FLOP_S, ("fwd_flop_per_s",), _SUM, ""),
    # The forward's / backward's share of the machine's roofline (`records.roofline`); ranked
    # and coloured by the time lost against it, so the list and the hottest colour answer
    # "where is most time wasted", not "what is best". Calls without work (no FLOPs, no bytes)
    # have neither: grey, unlisted.
    Mode(
        "eff",
        "Efficiency (fwd)",
        _C,
        Unit.PERCENT,
        ("fwd_roofline_pct",),
        _SUM,
        "",
        rank_by=("fwd_lost_ms",),
        rank_label="time lost (fwd)",
        bound_by="fwd_bound",
        colour_label="Time lost vs roofline (fwd)",
    ),
    Mode(
        "eff_bwd",
        "Efficiency (bwd)",
        _C,
        Unit.PERCENT,
        ("bwd_roofline_pct",),
        _SUM,
        "",
        rank_by=("bwd_lost_ms",),
        rank_label="time lost (bwd)",
        bound_by="bwd_bound",
        colour_label="Time lost vs roofline (bwd)",
    ),
    # max / mean over ranks of the call's fwd + bwd time (distributed runs only): stragglers
    Mode("imbalance", "Rank imbalance", _R, Unit.RATIO, ("rank_imbalance",), _SUM, ""),
    # The bytes checkpointing the call would free per ms of forward its backward would run
    # again (`view.checkpoint_cells`): the hottest are the best buys; the modules in the plan
    # at the table's budget are marked, its totals beside the legend.
    Mode(
        CHECKPOINT_MODE,
        "Checkpoint value",
        _P,
        Unit.BYTES_PER_MS,
        ("ckpt_value",),
        _SUM,
        "",
    ),
)
MODES += (
    # The rows each member of a module list took per sampled step, as its share of the list's
    # (`view.load`): an expert router's load; the card gives the list's imbalance (max / mean).
    # Listed under Health (one more legend row, no heading: the legend keeps its height).
    Mode("load", "Load (rows)", _H, Unit.PERCENT, ("load_share",), _SUM, ""),
)
MODE_KEYS: tuple[str, ...] = tuple(m.key for m in MODES)
DEFAULT_MODE = "fwd_bwd"
"""The mode the panel, the report and the pictures open at unless given one: forward +
backward time of each call (one of `MODE_KEYS`)."""
SCALES = ("linear", "log")
DEFAULT_SCALE = "linear"
"""The colour scale they open with unless given one ("linear" or "log", `SCALES`)."""


def mode(key: str) -> Mode:
    for m in MODES:
        if m.key == key:
            return m
    raise KeyError(key)
