"""Which modules to checkpoint so that activation memory fits a budget at the least recompute.

>>> plan = checkpoint_plan(prof.snapshot(), "50%")                  # doctest: +SKIP
>>> plan.module_names, plan.predicted_activation_bytes              # doctest: +SKIP
(('blocks.0', 'blocks.1.mlp'), 531456)

What the profile says about each module call (`docs/measurement.md`): `act_bytes`, the bytes
its subtree saves for backward (storage-deduplicated, charged to the first call that saves a
storage), and `fwd_ms`, its inclusive forward time: what a recompute costs. Checkpointing a
call drops what its subtree saved, except what stays saved anyway:

* **its inputs**, which the checkpoint keeps to run the forward again. Their sizes are not in
  the profile. They are taken to be what the call's *first leaf call* (forward order) saved
  (`act_self_bytes`): the first op to read an input usually saves it (Linear, Conv,
  LayerNorm, GELU do). This overestimates by what that leaf saves besides (LayerNorm's mean
  and inverse deviation: 1/dim of the input) and misses inputs the subtree never saved (a
  mask used in an addition): the checkpoint keeps those too.
* **an output that a later call saves again**: the storage is charged to this call, which
  saved it first (a ReLU's result, then the next Linear's input). When the first leaf after
  the call's subtree saved nothing of its own (`act_self_bytes` 0) while the call's last leaf
  did, the last leaf's bytes are taken to be that shared output.

So bytes freed by checkpointing call c = `act_bytes(c)` less those two estimates, and a leaf
call is taken to free nothing (all it saves is counted as its input). The estimates' sum over
the planned calls is the plan's `margin_bytes`.

A module, not a call, is wrapped: a module called k times per step is planned as one item
whose bytes and recompute are the sums over its k calls (their parent calls must belong to one
module, so that the items still form a tree). Chosen modules form an antichain of that tree
(`view.checkpoint_knapsack`). Left out, each with its reason in `CheckpointPlan.excluded`: the
root call; a module called from several parent modules or inside itself; a call with no
`act_bytes` or `fwd_ms` measured. A subtree that writes state in its forward (BatchNorm's
running statistics, spectral norm's vectors) or modifies its input in place may be planned:
`apply_checkpoint_plan` runs its recompute from the buffers and inputs its forward found
(`api.checkpoint_forward`). Each planned call records its module's class (`module_type`), which
`apply_checkpoint_plan` checks against the model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from wandb_modprof._errors import ModProfError
from wandb_modprof.capture.backward.checkpoint_cost import checkpoint_call_ms
from wandb_modprof.records.calls import CallInfo
from wandb_modprof.records.checkpoint import CheckpointPlan, PlannedCall
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.view.checkpoint_calls import CallEstimate, Saved, estimate_calls, memory_peaks
from wandb_modprof.view.checkpoint_knapsack import max_freed, plan_antichain
from wandb_modprof.view.graphs import merge
from wandb_modprof.view.units import format_value

# The knapsack's resolution (`view.checkpoint_knapsack`): 256 steps of the bytes to free; 1024
# only when 256 missed a need that the exact `max_freed` says is reachable (items smaller than
# a step count for nothing).
BUCKETS = (256, 1024)


@dataclass(frozen=True)
class _Item:
    """One module: its calls, its parent module's item (-1: the root's children)."""

    module_name: str
    calls: tuple[CallEstimate, ...]
    parent: int
    excluded: str | None

    @property
    def freed(self) -> int:
        return sum(c.freed_bytes for c in self.calls)

    @property
    def kept(self) -> int:
        return sum(c.kept_bytes for c in self.calls)

    @property
    def recompute_ms(self) -> float:
        return sum(c.fwd_ms or 0.0 for c in self.calls)


@dataclass(frozen=True)
class Candidates:
    """What a plan chooses from, whatever the budget: every call's estimate, the modules as
    items of a tree, the calls left out with their reason, and the state each module is in
    (`STATES`: the table's `ckpt_state`, before a plan marks the chosen)."""

    estimates: tuple[CallEstimate, ...]
    items: tuple[_Item, ...]
    excluded: tuple[tuple[str, str], ...]
    states: dict[str, str]  # module name -> "candidate", "root", "shared", "inside", ...


def candidates(calls: Sequence[CallInfo], stats: Saved) -> Candidates:
    """The modules a plan may choose from `calls` (a merged call tree, forward order)."""
    estimates = estimate_calls(calls, stats)
    items, excluded, states = _items(estimates)
    return Candidates(tuple(estimates), tuple(items), tuple(excluded), states)


def checkpoint_plan(
    data: ProfileData, budget: int | float | str, call_ms: float | None = None
) -> CheckpointPlan:
    """The modules to checkpoint so that the predicted activation bytes fit `budget`: bytes
    (int), a fraction of today's activation memory (float in (0, 1]) or a percentage string
    ("50%"), at the least predicted recompute time. Raises `ModProfError` for a bad budget,
    a profile without activation bytes, or a budget no plan reaches (naming the best one).
    """
    tree = merge(data.structures, data.stats.values())
    return plan_from(candidates(tree.calls, data.stats), data, budget, call_ms)


def plan_from(
    found: Candidates, data: ProfileData, budget: int | float | str, call_ms: float | None = None
) -> CheckpointPlan:
    """`checkpoint_plan` from the candidates of `data`'s merged call tree. `call_ms`: what
    checkpointing costs per call beyond the recompute (None: measured on this host,
    `capture.backward.checkpoint_cost`); every planned call is priced with it."""
    per_call = checkpoint_call_ms() if call_ms is None else call_ms
    where = f"checkpoint_plan(budget={budget!r})"
    root = next((e for e in found.estimates if e.call.parent_key is None), None)
    if root is None or root.act_bytes is None:
        raise ModProfError(
            f"{where}: expected a profile with activation bytes measured (a sampled step with "
            "a backward); got none for the root call"
        )
    now = root.act_bytes
    budget_bytes = parse_budget(budget, now, where)
    items, excluded = found.items, found.excluded
    parents = [it.parent for it in items]
    freed = [it.freed for it in items]
    selectable = [it.excluded is None for it in items]
    need = now - budget_bytes
    cost = [it.recompute_ms + per_call * len(it.calls) for it in items]
    chosen = plan_antichain(parents, freed, cost, selectable, need, BUCKETS[0])
    if chosen is None:
        reachable, widest = max_freed(parents, freed, selectable)
        if reachable < need:
            names = ", ".join(items[i].module_name for i in widest[:6]) or "nothing"
            raise ModProfError(
                f"{where}: expected a budget a checkpoint plan can reach; got {budget_bytes} "
                f"bytes of {now} now. The best reachable is {now - reachable} bytes "
                f"({(now - reachable) / now:.0%}), checkpointing {names}; "
                f"{len(excluded)} call(s) were excluded (CheckpointPlan reasons: "
                f"{_reasons(excluded)})"
            )
        # reachable, but not at that resolution: finer, else the widest antichain (it fits)
        chosen = plan_antichain(parents, freed, cost, selectable, need, BUCKETS[1]) or widest
    planned = tuple(_planned(items[i], per_call) for i in chosen)
    step_ms = (root.fwd_ms or 0.0) + (root.bwd_ms or 0.0)
    freed_bytes = sum(p.bytes_freed for p in planned)
    fwd_peak, bwd_peak = memory_peaks(data.stats.get(root.call.key))
    return CheckpointPlan(
        budget_bytes=budget_bytes,
        activation_bytes_now=now,
        predicted_activation_bytes=now - freed_bytes,
        predicted_step_ms=step_ms + sum(p.recompute_ms + per_call * p.calls for p in planned),
        step_ms_now=step_ms,
        margin_bytes=sum(items[i].kept for i in chosen),
        calls=planned,
        excluded=excluded,
        model_name=data.model_name,
        peak_bytes_now=_larger(fwd_peak, bwd_peak),
        predicted_peak_bytes=(
            None if fwd_peak is None else _larger(max(fwd_peak - freed_bytes, 0), bwd_peak)
        ),
        checkpoint_call_ms=per_call,
    )


def _larger(a: int | None, b: int | None) -> int | None:
    """The larger of two peaks, either of which may be unmeasured (None)."""
    known = [v for v in (a, b) if v is not None]
    return max(known) if known else None


def parse_budget(budget: object, now: int, where: str) -> int:
    """`budget` in bytes: an int as is, a float in (0, 1] or "NN%" as that share of `now`."""
    expected = (
        "bytes (an int > 0), a fraction of today's activation memory (a float in (0, 1]) or "
        "a percentage string such as '50%'"
    )
    share: float | None = None
    if isinstance(budget, bool):
        pass
    elif isinstance(budget, int):
        if budget > 0:
            return budget
    elif isinstance(budget, float):
        share = budget if 0.0 < budget <= 1.0 else None
    elif isinstance(budget, str) and budget.strip().endswith("%"):
        try:
            percent = float(budget.strip()[:-1])
        except ValueError:
            percent = math.nan
        share = percent / 100 if 0.0 < percent <= 100.0 else None
    if share is None:
        raise ModProfError(f"{where}: expected {expected}; got {budget!r}")
    return int(now * share)


def _items(
    estimates: list[CallEstimate],
) -> tuple[list[_Item], list[tuple[str, str]], dict[str, str]]:
    """One item per module in the tree (forward order of its first call), the excluded calls,
    and each module's state (`STATES`). A module whose calls have parents in several modules
    (or in itself) is left out of the tree with its descendants: its bytes stay inside its
    parent calls' `act_bytes`."""
    by_key = {e.call.key: e for e in estimates}
    roots = {e.call.module_name for e in estimates if e.call.parent_key is None}
    by_module: dict[str, list[CallEstimate]] = {}
    for e in estimates:
        if e.call.parent_key is not None:
            by_module.setdefault(e.call.module_name, []).append(e)
    index: dict[str, int] = {}
    outside: set[str] = set()
    items: list[_Item] = []
    excluded = [
        (e.call.key, "the root call: checkpoint modules inside the model, not the model itself")
        for e in estimates
        if e.call.parent_key is None
    ]
    states = dict.fromkeys(roots, "root")
    for name, calls in by_module.items():
        parents = [by_key.get(c.call.parent_key or "") for c in calls]
        owners = {p.call.module_name for p in parents if p is not None}
        owner = next(iter(owners)) if len(owners) == 1 and None not in parents else None
        if owner is None or owner == name:
            outside.add(name)
            states[name] = "shared"
            what = "itself" if name in owners else f"{len(owners)} modules"
            reason: str | None = (
                f"called from {what} ({', '.join(sorted(owners)[:3])}): wrapping the module "
                "checkpoints every call, which a tree plan cannot price"
            )
        elif owner in outside:
            outside.add(name)
            states[name] = "inside"
            reason = f"inside {owner}, which is left out of the plan"
        else:
            reason = _unselectable(calls)
            states[name] = "candidate" if reason is None else "unmeasured"
            parent = -1 if owner in roots else index[owner]
            index[name] = len(items)
            items.append(_Item(name, tuple(calls), parent, reason))
        if reason is not None:
            excluded.append((calls[0].call.key, reason + _more(calls)))
    return items, excluded, states


def _unselectable(calls: list[CallEstimate]) -> str | None:
    for c in calls:
        if c.act_bytes is None or c.fwd_ms is None:
            return "no act_bytes or fwd_ms measured"
    return None


def _more(calls: list[CallEstimate]) -> str:
    return f" (and its {len(calls) - 1} other call(s))" if len(calls) > 1 else ""


def _planned(item: _Item, per_call: float) -> PlannedCall:
    first = item.calls[0]
    act = sum(c.act_bytes or 0 for c in item.calls)
    calls = f" over {len(item.calls)} calls" if len(item.calls) > 1 else ""
    why = (
        f"frees {_size(item.freed)} of {_size(act)} saved{calls} (keeps ~{_size(item.kept)} "
        f"of inputs and shared outputs) for {item.recompute_ms:.3g} ms of recompute"
        f" (+{per_call * len(item.calls):.2g} ms of checkpointing)"
    )
    return PlannedCall(
        key=first.call.key,
        module_name=item.module_name,
        module_type=first.call.module_type,
        bytes_freed=item.freed,
        recompute_ms=item.recompute_ms,
        why=why,
        calls=len(item.calls),
    )


def _reasons(excluded: Iterable[tuple[str, str]]) -> str:
    seen: dict[str, int] = {}
    for _, reason in excluded:
        head = reason.split(":")[0].split(" (")[0]
        seen[head] = seen.get(head, 0) + 1
    return "; ".join(f"{n} x {head}" for head, n in seen.items())


def _size(n: int) -> str:
    return format_value("bytes", n)
