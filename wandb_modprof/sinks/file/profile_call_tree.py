"""The call-tree rules of a profile file (`profile_schema.check_record` applies them and raises
the `FileError`): the calls of a structure, of a sample and the statistics' keys each form a
tree that holds together, so that every sink can walk it.

- One call per key, and every `parent_key` null or a key of the same collection.
- No chain of parents loops; a call without a parent has depth 0.
- Within one forward pass (a structure's calls) a call's depth is its parent's + 1; elsewhere
  at least 1 below a parent (each statistics key keeps the parent and depth of its last
  sample, and with dynamic control flow a parent can be called at another depth later).
- A call's `compiled_region` is null, its own key (the outermost region), or its parent's.

Each check gives a `Problem`: (the JSON path, what is wrong), or None.

>>> from types import SimpleNamespace
>>> orphan = SimpleNamespace(key="a#0", parent_key="b#0", depth=1)
>>> tree_problem([orphan], lambda i: f"calls[{i}]", "a call of this structure")
('calls[0].parent_key', '"b#0" is not a call of this structure')
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Protocol

from wandb_modprof.records.calls import CallInfo

Problem = tuple[str, str] | None  # (JSON path, what is wrong), None: nothing


class _Call(Protocol):
    """What `ModuleStats`, `CallInfo` and `InvocationRecord` share: a place in the call tree."""

    @property
    def key(self) -> str: ...
    @property
    def parent_key(self) -> str | None: ...
    @property
    def depth(self) -> int: ...


def calls_problem(calls: Sequence[_Call], at: str, within: str, exact: bool) -> Problem:
    """One call per key, and a call tree (`tree_problem`); `at` is the JSON path of `calls`."""
    earlier: set[str] = set()
    for i, call in enumerate(calls):
        if call.key in earlier:
            return f"{at}[{i}].key", f"{json.dumps(call.key)} repeats an earlier call's key"
        earlier.add(call.key)
    return tree_problem(calls, lambda i: f"{at}[{i}]", within, exact=exact)


def regions_problem(calls: Sequence[CallInfo], where: str) -> Problem:
    """A call's `compiled_region` (after `tree_problem`: parents known, no cycle) is null, its
    own key with no ancestor in a region (the outermost region is the one measured), or an
    ancestor's key that is that ancestor's own region."""
    by_key = {c.key: c for c in calls}
    for i, call in enumerate(calls):
        region = call.compiled_region
        if region is None:
            continue
        at = f"{where}.calls[{i}].compiled_region"
        parent = by_key.get(call.parent_key) if call.parent_key is not None else None
        above = parent.compiled_region if parent is not None else None
        if region == call.key:
            if above is not None:
                got = f"its own key inside region {json.dumps(above)}"
                return at, f"expected {json.dumps(above)} (the outermost region), {got}"
        elif region != above:  # (so, up the chain, some ancestor is its own region's root)
            expected = "null, its own key" + (f" or {json.dumps(above)}" if above else "")
            got = json.dumps(region)
            return at, f"expected {expected} (its parent's region), got {got}"
    return None


def tree_problem(
    calls: Sequence[_Call], at: Callable[[int], str], within: str, exact: bool = False
) -> Problem:
    """Parents within `calls` (unique keys), no cycle, depth 0 at a root; below a parent depth
    is the parent's + 1 where `exact` (one forward pass), else at least 1 (see the module
    docstring). `at(i)` is the JSON path of `calls[i]`, `within` what a parent must be."""
    index = {c.key: i for i, c in enumerate(calls)}
    for i, call in enumerate(calls):
        if call.parent_key is not None and call.parent_key not in index:
            return f"{at(i)}.parent_key", f"{json.dumps(call.parent_key)} is not {within}"
    rooted: set[str] = set()  # keys whose chain of parents is known to end at a root
    for call in calls:
        chain: dict[str, None] = {}  # the keys walked so far, in order
        key: str | None = call.key
        while key is not None and key not in rooted:
            if key in chain:
                loop = [*list(chain)[list(chain).index(key) :], key]
                shown = " -> ".join(json.dumps(k) for k in loop[:6])
                more = " -> ..." if len(loop) > 6 else ""
                return f"{at(index[key])}.parent_key", f"a cycle of parents: {shown}{more}"
            chain[key] = None
            key = calls[index[key]].parent_key
        rooted.update(chain)
    for i, call in enumerate(calls):
        if call.parent_key is None:
            expected = "0 (a call without a parent)"
            ok = call.depth == 0
        elif exact:
            parent = calls[index[call.parent_key]].depth
            expected = f"{parent + 1} (its parent {json.dumps(call.parent_key)}'s depth + 1)"
            ok = call.depth == parent + 1
        else:
            expected = "at least 1 (a call below a parent)"
            ok = call.depth >= 1
        if not ok:
            return f"{at(i)}.depth", f"expected {expected}, got {call.depth}"
    return None
