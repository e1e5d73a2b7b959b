"""The least-cost antichain of a tree that frees at least a given amount: the knapsack under a
checkpoint plan (`view.checkpoint_plan`).

Items form a forest (`parents[i]` is the index of item i's parent, -1 for a root; parents
come before their children). Choosing an item frees `freed[i]` bytes for `cost[i]`
milliseconds and covers its whole subtree, so the chosen items form an antichain: never an
item and one of its ancestors (checkpointing a parent already drops its children's saved
tensors; counting both would count those bytes twice).

The dynamic programme runs bottom-up over the tree on bytes discretised into `buckets`
steps of `need / (buckets - 1)`: `best[v][b]` is the least cost of an antichain inside v's
subtree that frees at least b steps. Children are combined by min-plus convolution (numpy, a
`buckets x buckets` gather per combination: ~0.1 ms at 256), then v itself is the
alternative to any combination of its descendants. Freed bytes are rounded *down* to steps
and the need *up*, so a plan found always frees at least `need` bytes; the price is that an
item smaller than a step counts for nothing, which can make a reachable need look out of
reach (the caller then retries finer, or takes `max_freed`'s antichain).

>>> plan_antichain([-1, 0, 0], [10, 6, 6], [5.0, 1.0, 5.0], [True, True, True], need=6)
[1]
>>> plan_antichain([-1, 0, 0], [10, 6, 6], [5.0, 1.0, 5.0], [True, True, True], need=8)
[0]
>>> max_freed([-1, 0, 0], [10, 6, 6], [True, True, True])
(12, [1, 2])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Costs = npt.NDArray[np.float64]
Args = npt.NDArray[np.int32]


def plan_antichain(
    parents: Sequence[int],
    freed: Sequence[int],
    cost: Sequence[float],
    selectable: Sequence[bool],
    need: int,
    buckets: int = 256,
) -> list[int] | None:
    """Indices (ascending) of the least-cost antichain of selectable items freeing at least
    `need`; [] when `need <= 0`; None when none is found at this resolution."""
    if need <= 0:
        return []
    n = len(parents)
    # integers: f * (buckets - 1) // need is f's whole steps exactly (no float rounding)
    weights = [min(f * (buckets - 1) // need, buckets - 1) if f > 0 else 0 for f in freed]
    children: list[list[int]] = [[] for _ in range(n + 1)]  # item n: a root above the forest
    for i, p in enumerate(parents):
        assert p < i, "parents must come before their children"
        children[p if p >= 0 else n].append(i)
    gather, valid = _shifts(buckets)
    best: dict[int, Costs] = {}  # only items whose subtree can free something
    steps: dict[int, tuple[int, float]] = {}  # items whose `best` is their own option alone
    choose: dict[int, npt.NDArray[np.bool_]] = {}
    merges: dict[int, list[tuple[int, Args | None]]] = {}
    for v in [*range(n - 1, -1, -1), n]:  # children (larger indices) before their parent
        comb: Costs | None = None
        done: list[tuple[int, Args | None]] = []
        for c in children[v]:
            fc = best.pop(c, None)
            if fc is None:
                continue
            if comb is None:
                comb, arg = fc, None  # the first child takes the whole target
            elif c in steps:
                comb, arg = _add_step(comb, *steps[c])
            else:
                comb, arg = _min_plus(comb, fc, gather, valid)
            done.append((c, arg))
        merges[v] = done
        own = v < n and selectable[v] and weights[v] > 0
        if own:
            option = np.full(buckets, np.inf)
            option[: weights[v] + 1] = cost[v]
            option[0] = 0.0
            if comb is None:
                best[v], steps[v] = option, (weights[v], float(cost[v]))
                choose[v] = np.ones(buckets, dtype=bool)
                choose[v][0] = False
            else:
                choose[v] = option < comb
                best[v] = np.minimum(option, comb)
        elif comb is not None:
            best[v] = comb
    top = best.get(n)
    if top is None or not np.isfinite(top[buckets - 1]):
        return None
    return _chosen(n, buckets - 1, choose, merges)


def _shifts(buckets: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
    """`gather[i, b]` = b - i where `valid[i, b]` (i <= b): the child's share when the
    children so far free i steps of a target of b."""
    i = np.arange(buckets)[:, None]
    b = np.arange(buckets)[None, :]
    return np.maximum(b - i, 0), i <= b


def _min_plus(
    g: Costs, f: Costs, gather: npt.NDArray[np.intp], valid: npt.NDArray[np.bool_]
) -> tuple[Costs, Args]:
    """h[b] = min over i <= b of g[i] + f[b - i], and the i that gives it."""
    table = np.where(valid, g[:, None] + f[gather], np.inf)
    arg = table.argmin(axis=0)
    return table[arg, np.arange(len(g))], arg.astype(np.int32)


def _add_step(g: Costs, weight: int, item_cost: float) -> tuple[Costs, Args]:
    """`_min_plus` with an item alone (0 for 0 steps, `item_cost` up to `weight` steps): O(n)."""
    b = np.arange(len(g))
    base = np.maximum(b - weight, 0)
    taken = g[base] + item_cost
    take = taken < g
    take[0] = False
    return np.where(take, taken, g), np.where(take, base, b).astype(np.int32)


def _chosen(
    root: int,
    target: int,
    choose: dict[int, npt.NDArray[np.bool_]],
    merges: dict[int, list[tuple[int, Args | None]]],
) -> list[int]:
    """Walk the recorded decisions back from `root` with `target` steps to free."""
    picked: list[int] = []
    work = [(root, target)]
    while work:
        v, b = work.pop()
        if b <= 0:
            continue
        decided = choose.get(v)
        if decided is not None and decided[b]:
            picked.append(v)
            continue
        for c, arg in reversed(merges[v]):
            i = 0 if arg is None else int(arg[b])
            work.append((c, b - i))
            b = i
    return sorted(picked)


def max_freed(
    parents: Sequence[int], freed: Sequence[int], selectable: Sequence[bool]
) -> tuple[int, list[int]]:
    """The most any antichain of selectable items frees (exact, no steps), and one such
    antichain (ascending): the best reachable when a budget is out of reach."""
    n = len(parents)
    total = [0] * n
    below: list[list[int]] = [[] for _ in range(n)]
    for v in range(n - 1, -1, -1):
        own = freed[v] if selectable[v] and freed[v] > 0 else 0
        if own > total[v]:
            total[v], below[v] = own, [v]
        p = parents[v]
        if p >= 0:
            total[p] += total[v]
            below[p].extend(below[v])
    roots = [v for v in range(n) if parents[v] < 0]
    return sum(total[v] for v in roots), sorted(i for v in roots for i in below[v])
