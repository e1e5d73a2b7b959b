"""Per call: what checkpointing it would free, and what it would keep (an estimate).

The profile measures what each call's subtree saved for backward (`act_bytes`), not the sizes
of its inputs and outputs, which a checkpoint keeps. They are estimated from the saves around
the call (`view.checkpoint_plan` explains the rule and its limits):

* kept inputs: what the call's first leaf call (forward order) saved;
* a shared output: what its last leaf saved, when the first leaf after its subtree saved
  nothing of its own (that leaf saves the same storage, charged to this call first).

>>> from wandb_modprof.records.calls import CallInfo
>>> def call(key, parent, kind="Linear"):
...     return CallInfo(key, key[:-2], kind, 0, parent, 0, 0, (), (), 0, 0, True)
>>> calls = [call("<root>#0", None, "Net"), call("a#0", "<root>#0", "Seq"),
...          call("a.fc#0", "a#0"), call("a.relu#0", "a#0", "ReLU"), call("b#0", "<root>#0")]
>>> saved = {"a#0": (300, 0), "a.fc#0": (100, 100), "a.relu#0": (200, 200), "b#0": (0, 0)}
>>> [(e.call.key, e.kept_bytes, e.freed_bytes) for e in estimate_calls(calls, saved)][1:]
[('a#0', 300, 0), ('a.fc#0', 100, 0), ('a.relu#0', 200, 0), ('b#0', 0, 0)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wandb_modprof.records.calls import CallInfo
from wandb_modprof.records.sample import ModuleStats
from wandb_modprof.view.values import finite


@dataclass(frozen=True)
class CallEstimate:
    """One call, measured (`act_bytes`, `act_self_bytes`, `fwd_ms`, `bwd_ms`: medians; None
    where not measured) and estimated (`kept_bytes`: inputs and shared outputs a checkpoint
    keeps; `freed_bytes`: `act_bytes` less that, never below 0)."""

    call: CallInfo
    act_bytes: int | None
    act_self_bytes: int
    fwd_ms: float | None
    bwd_ms: float | None
    kept_bytes: int
    freed_bytes: int


# What a call's statistics are read from: `ModuleStats`, or (act_bytes, act_self_bytes) pairs
# in tests and examples.
Saved = Mapping[str, ModuleStats] | Mapping[str, tuple[int, int]]


def estimate_calls(calls: Sequence[CallInfo], stats: Saved) -> list[CallEstimate]:
    """Every call in preorder (children in the order of the last sample, `stats`' order),
    with its estimates."""
    order = _preorder(calls, list(stats))
    n = len(order)
    ends = _subtree_ends(order)
    leaves = [ends[p] == p + 1 for p in range(n)]
    measured = [_measured(stats.get(c.key)) for c in order]
    own = [m[1] or 0 for m in measured]
    next_leaf = [n] * (n + 1)  # the first leaf at or after position p
    for p in range(n - 1, -1, -1):
        next_leaf[p] = p if leaves[p] else next_leaf[p + 1]
    last_leaf = [-1] * n  # the last leaf at or before position p
    for p in range(n):
        last_leaf[p] = p if leaves[p] else (last_leaf[p - 1] if p else -1)
    out: list[CallEstimate] = []
    for p, call in enumerate(order):
        act, _, fwd_ms, bwd_ms = measured[p]
        first, last = next_leaf[p], last_leaf[ends[p] - 1]  # p itself for a leaf
        after = next_leaf[ends[p]]  # n: none
        shared = last != first and after < n and own[after] == 0
        kept = min(act or 0, own[first] + (own[last] if shared else 0))
        out.append(
            CallEstimate(
                call=call,
                act_bytes=act,
                act_self_bytes=own[p],
                fwd_ms=fwd_ms,
                bwd_ms=bwd_ms,
                kept_bytes=kept,
                freed_bytes=max((act or 0) - kept, 0),
            )
        )
    return out


def _measured(
    stat: ModuleStats | tuple[int, int] | None,
) -> tuple[int | None, int | None, float | None, float | None]:
    if stat is None:
        return None, None, None, None
    if isinstance(stat, tuple):
        return stat[0], stat[1], 0.0, 0.0
    # (a loaded file may hold values that are no finite float: not measured, as in the table)
    act, own = finite(stat.typical("act_bytes")), finite(stat.typical("act_self_bytes"))
    return (
        None if act is None else round(act),
        None if own is None else round(own),
        finite(stat.typical("fwd_ms")),
        finite(stat.typical("bwd_ms")),
    )


def _preorder(calls: Sequence[CallInfo], keys: list[str]) -> list[CallInfo]:
    """Depth-first, children in the order of `keys` (the last sample's forward order), calls
    it lacks after them in `calls`' order. A call whose parent is unknown is a root."""
    rank = {k: i for i, k in enumerate(keys)}
    position = {c.key: rank.get(c.key, len(keys) + i) for i, c in enumerate(calls)}
    known = {c.key for c in calls}
    children: dict[str | None, list[CallInfo]] = {}
    for c in calls:
        parent = c.parent_key if c.parent_key in known else None
        children.setdefault(parent, []).append(c)
    for kids in children.values():
        kids.sort(key=lambda c: position[c.key])
    order: list[CallInfo] = []
    work = list(reversed(children.get(None, [])))
    while work:
        c = work.pop()
        order.append(c)
        work.extend(reversed(children.get(c.key, [])))
    return order


def _subtree_ends(order: list[CallInfo]) -> list[int]:
    """`ends[p]`: one past the last position of the subtree of the call at position p."""
    n = len(order)
    position = {c.key: p for p, c in enumerate(order)}
    ends = list(range(1, n + 1))
    for p in range(n - 1, -1, -1):
        parent = position.get(order[p].parent_key or "")
        if parent is not None:
            ends[parent] = max(ends[parent], ends[p])
    return ends


def memory_peaks(stat: ModuleStats | None) -> tuple[int | None, int | None]:
    """The call's forward and backward memory peaks (`fwd_mem_peak_bytes`,
    `bwd_mem_peak_bytes`: medians, each above what was live as it started; None where not
    measured)."""
    if stat is None:
        return None, None
    fwd, bwd = (
        finite(stat.typical("fwd_mem_peak_bytes")),
        finite(stat.typical("bwd_mem_peak_bytes")),
    )
    return (None if fwd is None else round(fwd)), (None if bwd is None else round(bwd))
