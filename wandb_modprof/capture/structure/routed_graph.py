"""One graph for a model whose call sequence changes from step to step (a routed
mixture-of-experts: the router picks other experts, and sends them other numbers of tokens,
at every step).

Keeping one graph per call sequence filled `MAX_STRUCTURES` places within a few samples and
asked for a structure pass after each: experts first routed to after that had no FLOPs. Here
the graphs of such a model's sampled steps (`step_dataflow`, no pass needed) grow one graph
per training mode: a call no kept graph holds is added the first time a step calls it, with
the edges that reach it in that step, so every expert any sample called is a node of a graph,
whichever subset ran. Its counts come from the passes (`kept_counts`: the expert's own, or
an identical expert's; the views scale them with its rows). A sampled step that derived no
graph (the first one seen to vary) adds its new calls without edges; a later graph of a step
that called them gives them their edges.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Sequence

from wandb_modprof.records.calls import CallInfo, DataEdge, Structure, routed_signature


class RoutedGraph:
    """The union of a routed model's sampled steps' graphs, per training mode. `members`:
    the model's modules in a module list, by the list's name (`experts` ->
    `[("experts.0", "Expert"), ...]`): a list member first called brings its siblings that
    no step called yet, as calls without counts or edges (the "Load" mode lists them, with
    0 rows: `view.load`)."""

    def __init__(self, members: Callable[[str], Sequence[tuple[str, str]]] = lambda _: ()) -> None:
        self._members = members
        self._calls: dict[bool, dict[str, CallInfo]] = {True: {}, False: {}}
        self._edges: dict[bool, set[DataEdge]] = {True: set(), False: set()}
        self._bare: dict[bool, set[str]] = {True: set(), False: set()}  # added without edges

    def absorb(
        self, structure: Structure, held: Collection[str], bare: bool = False
    ) -> Structure | None:
        """`structure`'s calls that no graph holds (`held`: the keys of every graph kept,
        this one's included), or that this one holds without edges, with the edges that reach
        them; the grown graph, or None where nothing was new. `bare`: the calls come without
        edges (a step's calls, `step_dataflow.step_calls`)."""
        mode = structure.training
        calls, edges, without = self._calls[mode], self._edges[mode], self._bare[mode]
        if bare:
            new = {c.key for c in structure.calls if c.key not in held}
        else:
            new = {c.key for c in structure.calls if c.key not in held or c.key in without}
        if not new:
            return None
        idle: list[CallInfo] = []
        for call in structure.calls:
            if call.key in new:
                calls[call.key] = dataclasses.replace(call, order=len(calls))
                idle += self._siblings(call, held, calls)
        for call in idle:
            calls[call.key] = dataclasses.replace(call, order=len(calls))
            without.add(call.key)
        if bare:
            without |= new
        else:
            without -= new
            edges.update(e for e in structure.edges if _touches(e, new))
        return Structure(
            routed_signature(mode),
            mode,
            tuple(calls.values()),
            tuple(sorted(edges, key=lambda e: (e.view_key, e.src_key, e.dst_key))),
        )

    def _siblings(
        self, call: CallInfo, held: Collection[str], calls: dict[str, CallInfo]
    ) -> list[CallInfo]:
        """The members of `call`'s module list no graph holds (keyed as `call` is: its first
        call, a plain key), as calls of the same parent."""
        found = _MEMBER.match(call.module_name)
        if found is None or call.key != f"{call.module_name}#0":
            return []
        out = []
        for name, module_type in self._members(found.group(1)):
            key = f"{name}#0"
            if key in held or key in calls or key == call.key:
                continue
            out.append(
                dataclasses.replace(
                    call,
                    key=key,
                    module_name=name,
                    module_type=module_type,
                    inputs=(),
                    outputs=(),
                    flops_known=False,
                    work_known=False,
                    bwd_work_known=False,
                    rows=None,
                    rows_linear=False,
                )
            )
        return out


_MEMBER = re.compile(r"^(.*)\.\d+$")  # a module list's member: `experts.5` of `experts`


def _touches(edge: DataEdge, keys: set[str]) -> bool:
    """The edge is inside a new call's view, or leaves or reaches one of its nodes
    (`key`, or `key|in:slot` / `key|out:slot`)."""
    return (
        edge.view_key in keys
        or edge.src_key.partition("|")[0] in keys
        or edge.dst_key.partition("|")[0] in keys
    )
