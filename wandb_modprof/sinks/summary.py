"""Terminal rendering of a profile: `Profile.summary()` (totals, then the top modules by forward,
backward and memory), and the top module calls of one analysis mode (`wandb-modprof summary`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wandb_modprof._validate import check_choice
from wandb_modprof.records.modes import MODE_KEYS, Mode, mode
from wandb_modprof.records.sample import ModuleStats, Sample
from wandb_modprof.records.snapshot import ProfileData, as_data
from wandb_modprof.sinks.units import format_value

if TYPE_CHECKING:
    from wandb_modprof.records.snapshot import SupportsSnapshot


def _section(
    title: str, rows: list[ModuleStats], self_metric: str, incl_metric: str, unit: str
) -> list[str]:
    """One top list: module, type, self and incl values (right-aligned, written by units)."""
    cells = [
        [
            r.key,
            r.module_type[:18],
            format_value(unit, r.mean(self_metric)),
            format_value(unit, r.mean(incl_metric)),
        ]
        for r in rows
    ]
    return [title, *render_columns(["module", "type", "self", "incl"], cells, {2, 3})]


def format_summary(
    model_name: str,
    num_samples: int,
    stats: Mapping[str, ModuleStats],
    last: Sample | None,
    n: int,
) -> str:
    if last is None or not stats:
        return f"wandb_modprof profile of {model_name}: no sampled steps yet."
    totals = last.totals
    head = (
        f"wandb_modprof profile of {model_name}: {num_samples} sampled step(s), "
        f"{len(last.invocations)} module invocations in the last one"
    )
    totals_line = (
        f"last step: forward {format_value('ms', totals.fwd_ms)}, backward "
        f"{format_value('ms', totals.bwd_ms)}, "
        f"activations {format_value('bytes', totals.act_bytes)}"
    )
    children = [s for s in stats.values() if s.parent_key is not None]

    def top(metric: str) -> list[ModuleStats]:
        rows = [s for s in children if s.mean(metric) is not None]
        rows.sort(key=lambda s: s.mean(metric) or 0.0, reverse=True)
        return rows[:n]

    lines = [head, totals_line, "(means over samples; self = excluding child modules)", ""]
    lines += _section(
        "Top modules by forward time", top("fwd_self_ms"), "fwd_self_ms", "fwd_ms", "ms"
    )
    lines.append("")
    if any(s.mean("bwd_ms") is not None for s in children):
        lines += _section(
            "Top modules by backward time", top("bwd_self_ms"), "bwd_self_ms", "bwd_ms", "ms"
        )
        lines.append("")
    if any(s.mean("act_bytes") is not None for s in children):
        lines += _section(
            "Top modules by activation memory (saved for backward)",
            top("act_self_bytes"),
            "act_self_bytes",
            "act_bytes",
            "bytes",
        )
    return "\n".join(lines).rstrip() + "\n"


# ---- one analysis mode: `wandb-modprof summary` and `compare` ------------------------------
# `Profile.table` reduces a large profile (deep views not drawn) to fit W&B; a terminal table
# wants every call, so it asks for a table with room for all of them.
_ALL_ROWS = 1 << 40


@dataclass(frozen=True)
class ModuleValue:
    """One module call's value in one analysis mode (None: not measured)."""

    key: str  # call key, "<qualified name>#<call index>"
    module_name: str
    module_type: str
    calls: int  # calls of this module in a step (a module called 3 times has 3 keys)
    value: float | None


@dataclass(frozen=True)
class ModeValues:
    """Every module call of a profile in one analysis mode (root excluded; in the table's
    order: view by view, parents' views first), and the model total of that mode (None where
    the mode has none or it was not measured)."""

    model_name: str
    num_samples: int
    mode: Mode
    modules: tuple[ModuleValue, ...]
    total: float | None

    def share(self, value: float | None) -> float | None:
        """`value` as a fraction of the model total, where the mode has one."""
        if value is None or self.total is None or self.total <= 0:
            return None
        return value / self.total


def check_mode(key: str) -> Mode:
    """The analysis mode named `key`; ModProfError listing the valid ones otherwise."""
    check_choice("mode", key, MODE_KEYS)
    return mode(key)


def mode_values(prof: ProfileData | SupportsSnapshot, mode_key: str) -> ModeValues:
    """The values the panel colours nodes by, read from the profile's flat table.

    >>> vals = mode_values(prof, "bwd")                          # doctest: +SKIP
    >>> max(vals.modules, key=lambda m: m.value or 0).key       # doctest: +SKIP
    'layer3.0.conv1#0'

    Every module call is one `node` row of kind `module` in its parent's view (the root is
    the view of the top level and has no node row: its value is the model `total`), so the
    rows hold each call exactly once. Values are means over the sampled steps, as drawn.
    """
    m = check_mode(mode_key)
    from wandb_modprof.view.table import build_table  # with the layout (igraph): lazily

    prof = as_data(prof, "mode_values()")
    records = build_table(prof, _ALL_ROWS).records()
    meta = {str(r["meta_key"]): r for r in records if r["row_kind"] == "meta"}
    nodes = [r for r in records if r["row_kind"] == "node" and r["node_kind"] == "module"]
    calls = Counter(str(r["module_name"]) for r in nodes)
    modules = tuple(
        ModuleValue(
            key=str(r["node_key"]),
            module_name=str(r["module_name"]),
            module_type=str(r["module_type"]),
            calls=calls[str(r["module_name"])],
            value=m.value(r),
        )
        for r in nodes
    )
    total: float | None = None
    row = meta.get(m.total) if m.total else None
    if row is not None and row["missing"] != "meta_number":
        total = float(row["meta_number"])
    return ModeValues(prof.model_name, prof.num_samples, m, modules, total)


def format_percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def render_columns(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]
) -> list[str]:
    """Rows of text cells as aligned lines (columns in `right` right-aligned)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  " + "  ".join(parts).rstrip()

    return [line(header)] + [line(r) for r in rows]


def format_mode_summary(values: ModeValues, n: int) -> str:
    """The top `n` module calls of one analysis mode as a terminal table.

    >>> print(format_mode_summary(mode_values(prof, "act"), 5))  # doctest: +SKIP
    """
    m = values.mode
    head = (
        f"wandb_modprof profile of {values.model_name}: {values.num_samples} sampled step(s); "
        f"mode {m.key} ({m.label})"
    )
    if values.total is not None:
        head += f", model total {format_value(m.unit, values.total)}"
    measured = [v for v in values.modules if v.value is not None]
    if not measured:
        why = "no sampled steps" if values.num_samples == 0 else "not measured in this profile"
        return f"{head}\nno module has a value in mode {m.key} ({why}).\n"
    measured.sort(key=lambda v: v.value or 0.0, reverse=True)
    shown = measured[:n]
    header = ["#", "module", "type", "calls", m.label]
    right = {0, 3, 4}
    if m.total:
        header.append("share")
        right.add(5)
    # Parameters, gradients and optimizer state belong to the module, not to one call: a module
    # called twice has two rows with the same bytes, but its share is counted once.
    per_module = set(m.columns) <= {"param_bytes", "grad_bytes", "optim_bytes"}
    counted: set[str] = set()
    rows = []
    for rank, v in enumerate(shown, 1):
        cells = [str(rank), v.key, v.module_type, str(v.calls), format_value(m.unit, v.value)]
        if m.total:
            repeat = per_module and v.module_name in counted
            counted.add(v.module_name)
            cells.append("(same)" if repeat else format_percent(values.share(v.value)))
        rows.append(cells)
    lines = [head, f"top {len(shown)} of {len(measured)} module calls (means over samples)"]
    lines += render_columns(header, rows, right)
    if m.total and m.key != "self":
        lines.append("(share: of the model total; a module's value includes its children)")
    if per_module and m.total:
        lines.append("(same: another call of a module above; its memory is counted once)")
    return "\n".join(lines) + "\n"
