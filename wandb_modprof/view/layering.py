"""Step 1 of the layout (see `wandb_modprof.view.layout`): which layer each node goes to.
Takes the node kinds and the edges as node-index pairs; gives each edge oriented downwards
(or None when it stays inside one layer) with whether it was turned, and a layer per node.

>>> kinds = ["input", "module", "output"]
>>> orient(kinds, [(0, 1), (1, 2), (2, 1)])
([(0, 1), (1, 2), (1, 2)], [False, False, True])
>>> layers(kinds, [(0, 1), (1, 2)])
[0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Sequence


def orient(
    kinds: Sequence[str], edges: list[tuple[int, int]]
) -> tuple[list[tuple[int, int] | None], list[bool]]:
    """Each edge as (upper, lower) for the layering, or None if it stays inside one layer
    (input to input, output to output), plus whether it was turned against its direction."""
    down: list[tuple[int, int] | None] = []
    flipped: list[bool] = []
    for s, d in edges:
        if kinds[s] == kinds[d] and kinds[s] in ("input", "output"):
            down.append(None)
            flipped.append(False)
        else:
            turn = kinds[d] == "input" or kinds[s] == "output"
            down.append((d, s) if turn else (s, d))
            flipped.append(turn)
    # Break the remaining cycles: reverse the back edges of an iterative DFS in node order.
    # Inputs are sources and outputs sinks by now, so they are never on a cycle.
    adj: list[list[tuple[int, int]]] = [[] for _ in kinds]  # (head, edge index) per tail
    for i, e in enumerate(down):
        if e is not None:
            adj[e[0]].append((e[1], i))
    state = [0] * len(kinds)  # 0 new, 1 on the stack, 2 done
    for root in range(len(kinds)):
        if state[root]:
            continue
        state[root] = 1
        stack = [(root, 0)]
        while stack:
            u, pos = stack[-1]
            if pos == len(adj[u]):
                state[u] = 2
                stack.pop()
                continue
            stack[-1] = (u, pos + 1)
            v, i = adj[u][pos]
            if state[v] == 1:
                down[i] = (v, u)
                flipped[i] = not flipped[i]
            elif state[v] == 0:
                state[v] = 1
                stack.append((v, 0))
    return down, flipped


def layers(kinds: Sequence[str], edges: list[tuple[int, int]]) -> list[int]:
    """Layer index per node for a DAG given as (upper, lower) pairs; compact, 0 at the top."""
    n = len(kinds)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for u, v in edges:
        succ[u].append(v)
        indeg[v] += 1
    order = [i for i in range(n) if indeg[i] == 0]  # Kahn's algorithm, FIFO: deterministic
    for u in order:
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                order.append(v)
    assert len(order) == n, "cycle left after orientation"
    has_pred = [False] * n
    for _, v in edges:
        has_pred[v] = True
    # The first layer belongs to the inputs (and nodes without edges): the rest start below.
    below = 1 if "input" in kinds else 0
    layer = [
        0 if kind == "input" or not (out or into) else below
        for kind, out, into in zip(kinds, succ, has_pred, strict=True)
    ]
    for u in order:
        for v in succ[u]:
            layer[v] = max(layer[v], layer[u] + 1)
    for u in reversed(order):  # successors are final when a source is reached
        if not has_pred[u] and succ[u] and kinds[u] != "input":
            layer[u] = min(layer[v] for v in succ[u]) - 1
    others = [layer[i] for i in range(n) if kinds[i] != "output"]
    bottom = max(others) + 1 if others else 0
    for i in range(n):
        if kinds[i] == "output":
            layer[i] = bottom
    # Compact: no empty bands.
    rank = {v: r for r, v in enumerate(sorted(set(layer)))}
    return [rank[v] for v in layer]
