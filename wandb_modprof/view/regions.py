"""The compiled regions (`torch.compile`) of a profile, as its views say them. Takes the merged
`CallTree`; gives one `Region` per region root call: what the table's `compiled_region` meta
rows, the report and `wandb-modprof summary` name.

A region's root is measured at its boundary as one call; the calls inside it ran fused in the
compiled code, so they are drawn (from the graph traced on fake tensors) without their own
time and memory (`records.calls.CallInfo.compiled_region`).

>>> regions(CallTree((), ()))
()
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from wandb_modprof.view.graphs import CallTree


@dataclass(frozen=True)
class Region:
    """A compiled region: its root call's key, the name users know it by (`label`: the
    model's class for the whole model, else the module's qualified name) and how many calls
    ran fused inside it (`inside`: the root's descendants)."""

    key: str
    label: str
    inside: int


def regions(tree: CallTree) -> tuple[Region, ...]:
    """The regions whose root call is in `tree`, in forward order; empty for a profile
    without compiled code, or from a file before version 4 (which did not record them)."""
    inside = Counter(
        c.compiled_region
        for c in tree.calls
        if c.compiled_region is not None and c.compiled_region != c.key
    )
    return tuple(
        Region(c.key, c.module_type if c.parent_key is None else c.module_name, inside[c.key])
        for c in tree.calls
        if c.compiled_region == c.key
    )


def note(region: Region) -> str:
    """One line on a region: what is measured and what is not (the calls inside have their
    FLOPs, from the graph traced on fake tensors, and nothing else)."""
    calls = f"{region.inside} module call{'' if region.inside == 1 else 's'}"
    return (
        f"compiled region {region.label} (torch.compile): measured as one call; "
        f"its {calls} inside ran fused (FLOPs only)"
    )
