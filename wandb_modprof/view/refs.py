"""References instead of repeated strings: what keeps the table linear in the calls it shows.

Takes the drawn views (parents before children) and the calls; gives each view its number
(`ViewRef`: id, parent id, last id of its subtree) and writes the keys and names of a view's
node and edge rows relative to the view (`to_ref`), so that a call's qualified name, which
grows with its depth, is written once per row that needs it rather than once per ancestor.

Before, every row carried its view's whole path of ancestor keys: a chain of depth D wrote
O(D^3) characters (70 MB at depth 200). Now the path is the `view` rows' `view_parent` links,
and the breadcrumbs are the views whose id interval `[view_id, view_last]` holds the current
view's id (views are numbered depth first, so a subtree is one interval).

A ref is decoded against its view's key `vk` and module name `vn` (`from_ref`; the spec's
`tools/spec/expressions.resolve_ref` is the same rule in Vega):

| ref | stands for |
| --- | --- |
| `"="` | `vn` (the view's own module: its `self` node) |
| `"\\|..."` | `vk + ref` (inputs, outputs, self: `<view>|in:x`) |
| `".x..."` | `vn + ref` (a child nested in the view's module: `layer1.0#0` in `layer1#0`) |
| `"~..."` | `ref[1:]` (a name that itself starts with one of `= | . ~`) |
| anything else | itself |

>>> to_ref("layer1.0#0", "layer1#0", "layer1"), to_ref("layer1#0|in:x", "layer1#0", "layer1")
('.0#0', '|in:x')
>>> from_ref(".0#0", "layer1#0", "layer1")
'layer1.0#0'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wandb_modprof.records.calls import CallInfo

_MARKS = ("=", "|", ".", "~")


@dataclass(frozen=True)
class ViewRef:
    """A drawn view's number, its parent's (-1: none drawn, the root view) and the last
    number in its subtree (itself when it has no drawn descendant)."""

    view_id: int
    parent_id: int
    last_id: int


def number_views(view_keys: Sequence[str], calls: Mapping[str, CallInfo]) -> dict[str, ViewRef]:
    """Depth-first numbers of the drawn views, children in the order given. A view's parent
    is the nearest ancestor call that is drawn (the reduction only drops whole subtrees, so it
    is the parent call; a hand-made file may hold anything, hence the walk)."""
    drawn = set(view_keys)
    parent: dict[str, str | None] = {}
    children: dict[str | None, list[str]] = {}
    for key in view_keys:
        up = _parent_key(calls, key)
        seen = {key}
        while up is not None and up not in drawn and up not in seen:
            seen.add(up)
            up = _parent_key(calls, up)
        parent[key] = up if up in drawn else None
        children.setdefault(parent[key], []).append(key)
    order: list[str] = []
    numbered: set[str] = set()
    # iterative depth-first walk: no recursion that grows with the model's depth; a view left
    # over (a cycle of parents, which `load` refuses) is numbered as a root of its own
    for root in [None, *view_keys]:
        if root is not None and root in numbered:
            continue
        stack = list(reversed(children.get(None, []))) if root is None else [root]
        while stack:
            key = stack.pop()
            if key in numbered:
                continue
            numbered.add(key)
            order.append(key)
            stack.extend(reversed(children.get(key, [])))
    ids = {key: i for i, key in enumerate(order)}
    last = dict(ids)
    for key in reversed(order):  # children come after their parent: fold ends upward
        up = parent[key]
        if up is not None:
            last[up] = max(last[up], last[key])
    return {
        key: ViewRef(ids[key], -1 if parent[key] is None else ids[str(parent[key])], last[key])
        for key in order
    }


def _parent_key(calls: Mapping[str, CallInfo], key: str) -> str | None:
    call = calls.get(key)
    return None if call is None else call.parent_key


def to_ref(full: str, view_key: str, view_name: str) -> str:
    """`full` written relative to the view `view_key` (module `view_name`); see the table."""
    if view_key and full.startswith(view_key + "|"):
        return full[len(view_key) :]
    if view_name and full == view_name:
        return "="
    if view_name and full.startswith(view_name + "."):
        return full[len(view_name) :]
    if full.startswith(_MARKS):
        return "~" + full
    return full


def from_ref(ref: str, view_key: str, view_name: str) -> str:
    """The string `ref` stands for in the view `view_key` (module `view_name`)."""
    if ref == "=":
        return view_name
    if ref.startswith("|"):
        return view_key + ref
    if ref.startswith("."):
        return view_name + ref
    if ref.startswith("~"):
        return ref[1:]
    return ref
