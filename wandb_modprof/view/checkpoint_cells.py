"""The checkpoint plan the table carries: per module call its "Checkpoint value" (the bytes
checkpointing it would free per ms of forward it would recompute), the bytes, and where it
stands in the plan at the table's budget; and one meta row with the plan's totals.

Takes the merged call tree's calls and the statistics (`view.table.build_table`); gives the
cells of the columns `CHECKPOINT_COLUMNS` per call key and the `ckpt_plan` meta row. The plan
is `view.checkpoint_plan`'s (a knapsack at the budget); the panel's "Checkpoint value" mode
colours by the value, marks the planned modules and shows the meta row's lines beside its
legend. A call left out of every plan (the root, a module called from several modules, one
inside such a module, or one without measurements) has its state only: no value, no colour.

The meta row: text one line per `\\n` ("Plan at 50 %: 4 modules" / "frees 3.1 MiB of 7.3
MiB" / "+4.2 ms recompute (+12 %)"), number the budget in bytes; where no plan reaches the
budget, the text says so and the best share reachable, and no call is marked planned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wandb_modprof._errors import ModProfError
from wandb_modprof.capture.backward.checkpoint_cost import known_call_ms
from wandb_modprof.records.calls import CallInfo
from wandb_modprof.records.checkpoint import STATES, CheckpointPlan
from wandb_modprof.records.sample import ModuleStats
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.view.checkpoint_knapsack import max_freed
from wandb_modprof.view.checkpoint_plan import Candidates, candidates, parse_budget, plan_from
from wandb_modprof.view.units import format_value

if TYPE_CHECKING:
    from wandb_modprof.view.rows import MetaRow

# What the table plans for unless told otherwise (`Profile.table(checkpoint_budget=...)`):
# half of today's activation memory, the usual first question ("what halves it?").
DEFAULT_BUDGET = "50%"
STATE_CODES = {state: code for code, state in enumerate(STATES, start=1)}


@dataclass(frozen=True)
class CheckpointCells:
    """`values`: call key -> the checkpoint columns measured for it; `meta`: the plan's row."""

    values: Mapping[str, dict[str, float]]
    meta: tuple[MetaRow, ...]


NO_CELLS = CheckpointCells({}, ())


def checkpoint_cells(
    data: ProfileData,
    calls: Sequence[CallInfo],
    stats: Mapping[str, ModuleStats],
    budget: int | float | str | None = DEFAULT_BUDGET,
    call_ms: float | None = None,
) -> CheckpointCells:
    """The cells of `calls` (the merged tree's, forward order) and the plan's meta row at
    `budget` (see `Profile.checkpoint_plan`; None: no plan, no cells). A profile without
    activation bytes has none either. `call_ms`: what checkpointing costs per call beyond the
    recompute (None: this process's measurement where it took one already,
    `capture.backward.checkpoint_cost.known_call_ms`, else the plan leaves it out and its last
    line says so)."""
    if budget is None or not calls:
        return NO_CELLS
    found = candidates(calls, stats)
    root = next((e for e in found.estimates if e.call.parent_key is None), None)
    if root is None or not root.act_bytes:
        return NO_CELLS
    parse_budget(budget, root.act_bytes, f"checkpoint_budget={budget!r}")  # bad input: raise
    planned: set[str] = set()
    meta: tuple[MetaRow, ...]
    priced = call_ms if call_ms is not None else known_call_ms()
    try:
        plan = plan_from(found, data, budget, 0.0 if priced is None else priced)
    except ModProfError:  # no plan reaches the budget: say so, mark nothing
        meta = (("ckpt_plan", _unreached(found, budget, root.act_bytes), None),)
    else:
        meta = _plan_lines(plan, priced is not None)
        planned = set(plan.module_names)
    values: dict[str, dict[str, float]] = {}
    for e in found.estimates:
        if e.act_bytes is None and e.fwd_ms is None:
            continue  # nothing measured (a call inside compiled code): no cell at all
        name = e.call.module_name
        state = "planned" if name in planned else found.states.get(name, "unmeasured")
        cells = {"ckpt_state": float(STATE_CODES[state])}
        if state in ("planned", "candidate"):
            cells["ckpt_freed_bytes"] = float(e.freed_bytes)
            if e.fwd_ms is not None and e.fwd_ms > 0:
                cells["ckpt_value"] = e.freed_bytes / e.fwd_ms
        values[e.call.key] = cells
    return CheckpointCells(values, meta)


def check_budget(budget: object, where: str) -> int | float | str | None:
    """`budget` as given where it is a checkpoint budget the table takes (None: no plan);
    anything else raises `ModProfError` naming `where`."""
    if budget is not None:
        parse_budget(budget, 1, where)
    return budget  # type: ignore[return-value]


def _plan_lines(plan: CheckpointPlan, priced: bool) -> tuple[MetaRow, ...]:
    share = _percent(plan.budget_bytes, plan.activation_bytes_now)
    n = len(plan.calls)
    freed = plan.activation_bytes_now - plan.predicted_activation_bytes
    extra = plan.predicted_step_ms - plan.step_ms_now
    step = f" (+{_percent(extra, plan.step_ms_now)})" if plan.step_ms_now > 0 else ""
    lines = (
        f"Plan at {share}: {n} module{'' if n == 1 else 's'}",
        f"frees {_size(freed)} of {_size(plan.activation_bytes_now)}"
        + (f" (±{_size(plan.margin_bytes)})" if plan.margin_bytes else ""),
        f"+{_ms(extra)} step time{step}" + ("" if priced else ", checkpointing not priced"),
    )
    return (("ckpt_plan", "\n".join(lines), float(plan.budget_bytes)),)


def _unreached(found: Candidates, budget: int | float | str, now: int) -> str:
    """Two lines: the budget no plan reaches, and the least share one reaches."""
    share = _percent(parse_budget(budget, now, ""), now)
    reachable, _ = max_freed(
        [it.parent for it in found.items],
        [it.freed for it in found.items],
        [it.excluded is None for it in found.items],
    )
    return (
        f"No plan reaches {share}\nof {_size(now)}: the least is {_percent(now - reachable, now)}"
    )


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.3g} %" if whole else "-"


def _size(n: float) -> str:
    return format_value("bytes", n)


def _ms(ms: float) -> str:
    return format_value("ms", ms)
