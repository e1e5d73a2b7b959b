"""The load on the members of a module list: how many rows (tokens) each expert of a
mixture-of-experts took, beside its siblings ("Load" mode, `records.modes`).

Members are the calls of one parent call whose module names differ only in their last,
numeric, component (`experts.0` ... `experts.63`), called at the same index in the step.
Per member, from its `rows` statistic (`records.sample.LOAD_METRICS`):

* `load_rows`: rows per sampled step, the steps that did not call it counted as 0 (its mean
  rows x the samples that called it / the samples);
* `load_share`: its percent of the members' `load_rows`;
* `load_imbalance`: the members' max over their mean (1.0: balanced), the same for each;
* `load_idle_samples`: for a member no sample called (a graph holds it because the model's
  module list does: `capture.structure.routed_graph`), the samples it sat out: 0 rows.

A member with statistics but no `rows` (no tensor argument) has no load; a group needs two
members. The meta row `never_called` names the members no sample called.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from wandb_modprof.records.calls import CallInfo
from wandb_modprof.records.sample import ModuleStats

LOAD_COLUMNS = ("load_rows", "load_share", "load_imbalance", "load_idle_samples")
_MEMBER = re.compile(r"^(.*)\.\d+$")
_NAMED = 5  # never-called members named in the meta row's text


@dataclass(frozen=True)
class LoadCells:
    values: dict[str, dict[str, float]] = field(default_factory=dict)  # call key -> columns
    meta: list[tuple[str, str, float | None]] = field(default_factory=list)


def load_cells(
    calls: Sequence[CallInfo], stats: Mapping[str, ModuleStats], samples: int
) -> LoadCells:
    """Each list member's load columns, and the `never_called` meta row (none if no member
    sat out every sample). `samples`: the samples the statistics hold."""
    groups: dict[tuple[str | None, str, int], list[CallInfo]] = {}
    for call in calls:
        found = _MEMBER.match(call.module_name)
        if found is not None:
            groups.setdefault((call.parent_key, found.group(1), call.call_index), []).append(call)
    out = LoadCells()
    never: list[str] = []
    for members in groups.values():
        per: dict[str, float] = {}
        for call in members:
            stat = stats.get(call.key)
            if stat is None:
                per[call.key] = 0.0
                continue
            rows = stat.metrics.get("rows")
            if rows is not None and rows.count and samples > 0:
                per[call.key] = rows.mean * rows.count / samples
        total = sum(per.values())
        if len(per) < 2 or not total > 0 or total == float("inf"):
            continue
        imbalance = max(per.values()) / (total / len(per))
        for key, load in per.items():
            cells = {"load_rows": load, "load_share": 100.0 * load / total}
            cells["load_imbalance"] = imbalance
            if key not in stats:
                cells["load_idle_samples"] = float(samples)
                never.append(key)
            out.values[key] = cells
    if never:
        names = ", ".join(k.partition("#")[0] for k in never[:_NAMED])
        more = f" and {len(never) - _NAMED} more" if len(never) > _NAMED else ""
        text = f"{len(never)} never called in {samples} samples: {names}{more}"
        out.meta.append(("never_called", text, float(len(never))))
    return out
