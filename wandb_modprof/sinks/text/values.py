"""One analysis mode's value per module call, read from the statistics: what `wandb-modprof
summary --mode` and `compare` print. Takes a `ProfileData`, gives `ModeValues` (builtins).

>>> vals = mode_values(prof, "bwd")                          # doctest: +SKIP
>>> max(vals.modules, key=lambda m: m.value or 0).key       # doctest: +SKIP
'layer3.0.conv1#0'

The values are exactly those of the module rows of the flat table (`view/table.py`, which the
panel colours nodes by), computed without building it: the table also lays out every view
(igraph), which a terminal table does not need. The rules below mirror `build_table` and
`Mode.value`; `tests/sinks/test_summary.py` checks on real profiles that both give the same values
in every mode. The number conversions are the table's own (`view.values`); the columns are
re-derived for the few the modes read, without the spreads the table also writes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from wandb_modprof._validate import check_choice
from wandb_modprof.capture.backward.checkpoint_cost import checkpoint_call_ms
from wandb_modprof.records.calls import CallInfo
from wandb_modprof.records.modes import CHECKPOINT_MODE, MODE_KEYS, Mode, mode
from wandb_modprof.records.ranks import RankData
from wandb_modprof.records.roofline import BOUNDS, Roofline
from wandb_modprof.records.sample import ModuleStats
from wandb_modprof.records.snapshot import ProfileData, SupportsSnapshot, as_data
from wandb_modprof.view.checkpoint_cells import NO_CELLS, STATE_CODES, checkpoint_cells
from wandb_modprof.view.graphs import call_graphs
from wandb_modprof.view.load import load_cells
from wandb_modprof.view.regions import Region, regions
from wandb_modprof.view.values import (
    as_float,
    counted_values,
    derived_values,
    finite,
    profile_roofline,
)


@dataclass(frozen=True)
class ModuleValue:
    """One module call's value in one analysis mode (None: not measured)."""

    key: str  # call key, "<qualified name>#<call index>"
    module_name: str
    module_type: str
    calls: int  # calls of this module in a step (a module called 3 times has 3 keys)
    value: float | None
    # samples in which a garbage collection ran inside this call; None: not watched (v1 file)
    gc_samples: int | None = None
    # what the mode ranks by where not the value (`Mode.rank_by`), None where not measured
    rank: float | None = None
    # the call's class under the roofline (`records.roofline.BOUNDS`: "compute", "memory",
    # "overhead", "none" for a call without work, "above_compute" / "above_memory" for one
    # faster than its roofline), where known
    bound: str = ""
    # the "Checkpoint value" mode: the call's module is in the table's checkpoint plan
    planned: bool = False


@dataclass(frozen=True)
class ModeValues:
    """Every module call of a profile in one analysis mode (root excluded; in the table's
    order: view by view, parents' views first), and the model total of that mode (None where
    the mode has none or it was not measured)."""

    model_name: str
    num_samples: int
    mode: Mode
    modules: tuple[ModuleValue, ...]
    total: float | None
    statistic: str = "median"  # what the values are: `ProfileData.statistic`
    # the compiled regions (`view/regions.py`): the calls inside have FLOPs only
    regions: tuple[Region, ...] = ()
    roofline: Roofline | None = None  # the machine's peaks (`records.roofline`), where known
    root_key: str = ""  # the root call's key, whose statistics make `total` ("": no call)
    # the "Checkpoint value" mode: the plan's lines at the table's budget (`view.checkpoint_cells`);
    # the "Load" mode: the list members no sample called (`view.load`)
    plan: tuple[str, ...] = ()

    def ranked(self) -> list[ModuleValue]:
        """The measured calls, most first: by value, or by what the mode ranks by (the
        efficiency mode: the time lost to the roofline). Ties keep the table's order."""
        key = "value" if not self.mode.rank_by else "rank"
        measured = [v for v in self.modules if getattr(v, key) is not None]
        measured.sort(key=lambda v: getattr(v, key) or 0.0, reverse=True)
        return measured

    def colour(self, v: ModuleValue) -> float | None:
        """What the panel colours `v`'s node by (`Mode.colour_value`), and what compare mode
        takes the ratio of: what the mode ranks by, else the value (the efficiency modes: the
        time lost to the roofline)."""
        return v.rank if self.mode.rank_by else v.value

    def share(self, value: float | None) -> float | None:
        """`value` as a fraction of the model total, where the mode has one."""
        if value is None or self.total is None or self.total <= 0:
            return None
        return value / self.total


def check_mode(key: str) -> Mode:
    """The analysis mode named `key`; ModProfError listing the valid ones otherwise."""
    check_choice("mode", key, MODE_KEYS)
    return mode(key)


def mode_values(prof: ProfileData | SupportsSnapshot, mode_key: str) -> ModeValues:
    """The values the panel colours module nodes by (medians over the sampled steps; means
    for a version-1 file: `ProfileData.statistic`).

    Every module call is one node of kind `module` in its parent's view (the root is the view
    of the top level and has no node: its value is the model `total`), so each call appears
    exactly once, in the order of the table's rows.
    """
    m = check_mode(mode_key)
    data = as_data(prof, "mode_values()")
    tree, graphs = call_graphs(data.structures, data.stats.values())
    calls = {c.key: c for c in tree.calls}
    order = [calls[n.node_key] for g in graphs for n in g.nodes if n.kind == "module"]
    per_module = Counter(c.module_name for c in order)
    roofline = profile_roofline(data.structures, tree.calls, data.stats)
    # (priced as `Profile.checkpoint_plan` prices it: the plan `wandb-modprof plan` writes)
    plan = NO_CELLS
    if m.key == CHECKPOINT_MODE:
        plan = checkpoint_cells(data, tree.calls, data.stats, call_ms=checkpoint_call_ms())
    load = load_cells(tree.calls, data.stats, data.num_samples - data.cold_left_out)
    modules = []
    for c in order:
        measured = _columns(data.stats.get(c.key), c, data.ranks, roofline)
        measured.update(plan.values.get(c.key, {}))
        measured.update(load.values.get(c.key, {}))
        bound = measured.get(m.bound_by) if m.bound_by else None
        modules.append(
            ModuleValue(
                key=c.key,
                module_name=c.module_name,
                module_type=c.module_type,
                calls=per_module[c.module_name],
                value=_combine(m, measured),
                gc_samples=_gc_samples(data.stats.get(c.key)),
                rank=_rank(m, measured),
                bound=BOUNDS[int(bound) - 1] if bound is not None else "",
                planned=measured.get("ckpt_state") == STATE_CODES["planned"],
            )
        )
    root = tree.calls[0] if tree.calls else None
    total = _total(m, data, root)
    return ModeValues(
        data.model_name,
        data.num_samples,
        m,
        tuple(modules),
        total,
        data.statistic,
        regions(tree),
        roofline,
        root.key if root is not None else "",
        tuple(
            line
            for _, text, _ in (*plan.meta, *(load.meta if m.key == "load" else []))
            for line in text.split("\n")
        ),
    )


def _gc_samples(stats: ModuleStats | None) -> int | None:
    return None if stats is None else stats.gc_samples


# ---- the table's rules (view/table.py), for the columns the modes read ----------------------
def _columns(
    stats: ModuleStats | None, call: CallInfo, ranks: RankData | None, roofline: Roofline | None
) -> dict[str, float]:
    """A module row's measured columns (finite values only; the others are `missing`): the
    colour statistics of its metrics (`RunningStat.typical`), its FLOPs and other work where
    the structure pass counted them, FLOP/s and the roofline's columns (`view.values.
    derived_values`), and its rank imbalance in a distributed run."""
    raw: dict[str, float] = {}
    if stats is not None:
        raw.update({metric: as_float(stat.typical) for metric, stat in stats.metrics.items()})
    if call.flops_known:
        raw.update(counted_values(call))
    derived_values(raw, roofline)
    imbalance = _imbalance(ranks.fwd_bwd.get(call.key) if ranks is not None else None)
    if imbalance is not None:
        raw["rank_imbalance"] = imbalance
    return {column: v for column, value in raw.items() if (v := finite(value)) is not None}


def _imbalance(per_rank: Mapping[int, float] | None) -> float | None:
    """max / mean over the ranks of each rank's mean fwd + bwd time (finite values only)."""
    measured = [v for v in (per_rank or {}).values() if math.isfinite(as_float(v))]
    if not measured:
        return None
    mean = sum(measured) / len(measured)
    return max(measured) / mean if mean > 0 else None


def _rank(m: Mode, measured: Mapping[str, float]) -> float | None:
    """What the ranked list orders mode `m` by where not its value (`Mode.rank_by`)."""
    if not m.rank_by or any(c not in measured for c in m.rank_by):
        return None
    return sum(measured[c] for c in m.rank_by)


def _combine(m: Mode, measured: Mapping[str, float]) -> float | None:
    """`Mode.value` on a row: None if any column the mode reads is missing."""
    if any(c not in measured for c in m.columns):
        return None
    values = [measured[c] for c in m.columns]
    return sum(values) if m.combine == "sum" else max(values)


def _total(m: Mode, data: ProfileData, root: CallInfo | None) -> float | None:
    """The meta number `m.total` of the table: a statistic of the root call, fwd + bwd, or the
    root's FLOPs where counted."""
    if not m.total:
        return None
    if m.total == "total_fwd_flops":
        return finite(root.fwd_flops) if root is not None and root.flops_known else None
    root_stats = data.stats.get(root.key) if root is not None else None
    typicals = [root_stats.typical(c) if root_stats is not None else None for c in total_metrics(m)]
    if any(v is None for v in typicals):
        return None
    return finite(sum(v for v in typicals if v is not None))


def total_metrics(m: Mode) -> tuple[str, ...]:
    """The root's metrics whose sum is the model total `m.total` (none for the FLOPs, which
    the structure pass counts: `CallInfo.fwd_flops`)."""
    if m.total == "total_fwd_bwd_ms":
        return ("fwd_ms", "bwd_ms")
    if not m.total or m.total == "total_fwd_flops":
        return ()
    return (m.total.removeprefix("total_"),)
