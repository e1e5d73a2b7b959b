"""Each call's counts kept across structure passes: a graph handed to the profile carries, for
every call some pass counted, that call's FLOPs, bytes and ops (forward and backward), even
where the graph itself did not count them.

The profile merges its graphs call by call (`view.graphs.merge`): a call's counts are those
of the last graph that holds it, in the order the graphs first arrived (one stored again keeps
its place). A graph derived from a sampled step (`step_dataflow`) has no counts: with routing,
such a graph (or a pass's graph without a counted backward) came after the passes' graphs, so
experts the passes had counted lost their FLOPs and the root's total read 0. So every graph
goes to the profile through `KeptCounts`, which fills each call it did not count:

* its own counts (`fwd_self_*`, `bwd_self_*`) from the newest pass that followed it
  (`known_calls.KnownCalls`: passes that completed a graph, partial ones, and ones past the
  cap of graphs alike), or, for a list member no pass met (an expert first routed to on a
  sampled step), from the identical member that a pass followed (`KnownCalls.own`), with the
  rows they were counted at (`CallInfo.rows`; the views scale counts that are linear in the
  rows to the call's mean rows);
* its inclusive counts summed over its calls in this graph where all of them have own counts:
  exactly this sequence's work, whichever route the passes ran;
* else (a call whose subtree holds a call no pass followed) the inclusive counts of the newest
  graph that counted that call: the work of another route through it, the nearest count there
  is, stated rather than dropped (the root's total of a routed model is the same for any route
  of equal-sized experts);
* else nothing: `flops_known` / `bwd_work_known` stay False.

For one key from two passes the newest wins: for the same module and input shapes both count
the same work; where the shapes differ, the newest pass saw the shapes the model runs now.

Graphs with calls left unknown are kept here (at most `MAX_STRUCTURES`, objects the profile
holds anyway); after each pass learnt something (`refresh`) they are filled again and handed
over once more where that changed them. A call that is in no kept graph (first met past the
cap) has no graph to carry its counts: the profile counts it in `Profile.flops_unknown`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from wandb_modprof.capture.structure.known_calls import KnownCalls
from wandb_modprof.records.calls import CallInfo, Structure

Own = tuple[int, ...]  # a call's own counts, in the order of `_FWD_SELF` or `_BWD_SELF`

_FWD = ("fwd_flops", "bwd_flops", "fwd_bytes", "fwd_ops")
_FWD_SELF = ("fwd_self_flops", "bwd_self_flops", "fwd_self_bytes", "fwd_self_ops")
_BWD = ("bwd_bytes", "bwd_ops")
_BWD_SELF = ("bwd_self_bytes", "bwd_self_ops")
# Each direction's inclusive fields, own fields, and the flags that say they are known.
_FORWARD = (_FWD, _FWD_SELF, ("flops_known", "work_known"))
_BACKWARD = (_BWD, _BWD_SELF, ("bwd_work_known",))


class Sink(Protocol):
    """Where the filled graphs go (the capture's `StructureSink`)."""

    def add_structure(self, structure: Structure) -> None: ...

    def has_structure(self, signature: str) -> bool: ...

    def num_structures(self) -> int: ...


class KeptCounts:
    """A structure sink in front of the profile's: fills what a graph did not count (see the
    module docstring). `known`: the driver's tables of what passes learnt, per training mode
    (the same objects, read when a graph is filled)."""

    def __init__(self, sink: Sink, known: Mapping[bool, KnownCalls]) -> None:
        self.sink = sink
        self.known = known
        # per training mode, per call key: the call as the newest graph that counted it
        # (forward; backward apart, since a pass's step may have no backward)
        self._fwd: dict[bool, dict[str, CallInfo]] = {True: {}, False: {}}
        self._bwd: dict[bool, dict[str, CallInfo]] = {True: {}, False: {}}
        # keys those tables took since the last `refresh` (as `KnownCalls.fresh`)
        self._fresh: dict[bool, set[str]] = {True: set(), False: set()}
        # graphs with calls left unknown, by signature: as received, as handed over, and
        # their call keys
        self._unfilled: dict[str, tuple[Structure, Structure, frozenset[str]]] = {}
        # per training mode, the keys of every graph handed over (`routed_graph` adds a
        # call to its graph only where no graph holds it)
        self.held: dict[bool, set[str]] = {True: set(), False: set()}

    def add_structure(self, structure: Structure) -> None:
        mode = structure.training
        fwd, bwd, fresh = self._fwd[mode], self._bwd[mode], self._fresh[mode]
        self.held[mode].update(c.key for c in structure.calls)
        for call in structure.calls:
            if call.flops_known:
                fwd[call.key] = call
                fresh.add(call.key)
            if call.bwd_work_known:
                bwd[call.key] = call
                fresh.add(call.key)
        self._unfilled.pop(structure.signature, None)  # (a pass's graph replaces a derived one)
        filled, complete = self._fill(structure, None)
        if not complete:
            keys = frozenset(c.key for c in structure.calls)
            self._unfilled[structure.signature] = (structure, filled, keys)
        self.sink.add_structure(filled)

    def has_structure(self, signature: str) -> bool:
        return self.sink.has_structure(signature)

    def num_structures(self) -> int:
        return self.sink.num_structures()

    def refresh(self) -> None:
        """After a pass learnt counts: hand over again each graph they change (a graph derived
        from a sampled step whose route no pass had run, once one has). A graph none of whose
        keys was learnt since would be filled as before: not filled again (with 8 graphs of
        10,000 calls, filling all of them after every pass took seconds)."""
        fresh: dict[bool, set[str]] = {}
        for mode, known in self.known.items():
            learnt, known.fresh = known.fresh, set()
            kept, self._fresh[mode] = self._fresh[mode], set()
            fresh[mode] = learnt | kept
        for signature, (received, before, keys) in list(self._unfilled.items()):
            if keys.isdisjoint(fresh[received.training]):
                continue
            filled, complete = self._fill(received, before)
            if complete:
                self._unfilled.pop(signature, None)  # (a backward's thread may store it too)
            else:
                self._unfilled[signature] = (received, filled, keys)
            if filled.calls != before.calls:  # (the same objects where nothing changed)
                self.sink.add_structure(filled)

    def _fill(self, structure: Structure, before: Structure | None) -> tuple[Structure, bool]:
        mode = structure.training
        return fill(structure, self.known[mode], self._fwd[mode], self._bwd[mode], before)


def fill(
    structure: Structure,
    known: KnownCalls,
    fwd_counted: Mapping[str, CallInfo],
    bwd_counted: Mapping[str, CallInfo],
    before: Structure | None = None,
) -> tuple[Structure, bool]:
    """`structure` with what is known of the calls it did not count, and whether every call
    now has its forward and backward counts. `before`: the same graph as filled last time;
    its calls are reused where their counts did not change (a new `CallInfo` costs ~15 us)."""
    calls = structure.calls
    if all(c.flops_known and c.bwd_work_known for c in calls):
        return structure, True
    index = {c.key: i for i, c in enumerate(calls)}
    parents = [-1 if c.parent_key is None else index.get(c.parent_key, -1) for c in calls]
    fwd_own = [_own_forward(c, known) for c in calls]
    bwd_own = [_own_backward(c, known) for c in calls]
    fwd_sum, bwd_sum = _rolled_up(fwd_own, parents), _rolled_up(bwd_own, parents)
    rows, linear = _rows(calls, known, parents)
    previous = before.calls if before is not None and len(before.calls) == len(calls) else None
    complete = True
    out: list[CallInfo] = []
    for i, call in enumerate(calls):
        changes: dict[str, Any] = {}  # (CallInfo fields: ints and flags)
        for known_here, counted, summed, own_here, (inclusive_f, own_f, flags) in (
            (call.flops_known, fwd_counted, fwd_sum[i], fwd_own[i], _FORWARD),
            (call.bwd_work_known, bwd_counted, bwd_sum[i], bwd_own[i], _BACKWARD),
        ):
            if known_here:  # its graph's own pass counted it: nothing to fill
                continue
            inclusive = summed or _counts(counted.get(call.key), inclusive_f)
            own = own_here or _counts(counted.get(call.key), own_f)
            if inclusive is not None and own is not None:
                changes.update(zip(inclusive_f, inclusive, strict=True))
                changes.update(zip(own_f, own, strict=True))
                changes.update(dict.fromkeys(flags, True))
                if not call.flops_known:  # (the rows its counts were taken at)
                    changes.update(rows=rows[i], rows_linear=linear[i])
            else:
                complete = False
        if not changes:
            out.append(call)
        elif previous is not None and _holds(previous[i], call.key, changes):
            out.append(previous[i])
        else:
            out.append(dataclasses.replace(call, **changes))
    return dataclasses.replace(structure, calls=tuple(out)), complete


def _holds(call: CallInfo, key: str, changes: Mapping[str, Any]) -> bool:
    return call.key == key and all(getattr(call, f) == v for f, v in changes.items())


def _rows(
    calls: Sequence[CallInfo], known: KnownCalls, parents: Sequence[int]
) -> tuple[list[int | None], list[bool]]:
    """Per call, the rows its counts were taken at and whether they scale with the rows:
    every op of its subtree linear in them (a call's twin's, `KnownCalls.own`, where it
    takes its twin's counts)."""
    rows: list[int | None] = []
    linear: list[bool] = []
    for call in calls:
        learnt = None if call.flops_known else known.own(call.key)
        if learnt is None:
            rows.append(call.rows)
            linear.append(call.rows_linear if call.flops_known else False)
        else:
            rows.append(learnt.rows)
            linear.append(learnt.linear and learnt.rows is not None)
    for i in range(len(parents) - 1, -1, -1):
        if parents[i] >= 0 and not linear[i]:
            linear[parents[i]] = False
    return rows, linear


def _own_forward(call: CallInfo, known: KnownCalls) -> Own | None:
    if call.flops_known:
        return _counts(call, _FWD_SELF)
    learnt = known.own(call.key)
    if learnt is None:
        return None
    return (learnt.flops, learnt.bwd_flops, learnt.nbytes, learnt.ops)


def _own_backward(call: CallInfo, known: KnownCalls) -> Own | None:
    if call.bwd_work_known:
        return _counts(call, _BWD_SELF)
    learnt = known.own(call.key)
    if learnt is None or learnt.bwd_bytes is None:
        return None
    return (learnt.bwd_bytes, learnt.bwd_ops or 0)


def _counts(call: CallInfo | None, fields: tuple[str, ...]) -> Own | None:
    return None if call is None else tuple(int(getattr(call, f)) for f in fields)


def _rolled_up(own: Sequence[Own | None], parents: Sequence[int]) -> list[Own | None]:
    """Inclusive counts of each call, summed over its subtree (children come after their
    parent, as calls are entered); None where a call of the subtree has no own counts."""
    total: list[Own | None] = list(own)
    for i in range(len(parents) - 1, -1, -1):
        parent = parents[i]
        if parent < 0:
            continue
        mine, theirs = total[i], total[parent]
        if mine is None or theirs is None:
            total[parent] = None
        else:
            total[parent] = tuple(a + b for a, b in zip(theirs, mine, strict=True))
    return total
