"""The table's meta rows, as `(key, text, number)` triples: what the table says about the
profile as a whole (format, model, totals of the root call, rank summary) and about what it
leaves out (`reduced`, `views`). Takes the `ProfileData` and its merged `CallTree`, then the
`Reduction`; `rows.meta_rows` writes the triples.

>>> [key for key, _, _ in reduction_meta(Reduction((), "", {}), CallTree((), ()))]
['reduced', 'views']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from wandb_modprof.records.calls import Structure, routed_signature
from wandb_modprof.records.phases import PHASES, PhaseStats
from wandb_modprof.records.roofline import Roofline
from wandb_modprof.records.sample import ModuleStats
from wandb_modprof.view.columns import TABLE_FORMAT, TABLE_VERSION
from wandb_modprof.view.graphs import CallTree
from wandb_modprof.view.group_nodes import module_cost
from wandb_modprof.view.ranks import rank_meta
from wandb_modprof.view.reduce import Reduction
from wandb_modprof.view.regions import regions
from wandb_modprof.view.rows import MetaRow

if TYPE_CHECKING:
    from wandb_modprof.records.graph import ViewGraph
    from wandb_modprof.records.sample import ModuleStats
    from wandb_modprof.records.snapshot import ProfileData

_TOTALS = ("fwd_ms", "bwd_ms", "act_bytes", "param_bytes", "grad_bytes", "optim_bytes")


def profile_meta(
    prof: ProfileData, tree: CallTree, has_views: bool, roofline: Roofline | None = None
) -> list[MetaRow]:
    """Format and version, the model, the root view (if any view is drawn), sample and call
    counts, the statistic the values are (`ProfileData.statistic`), the root call's totals
    (`total_<metric>`) and the rank rows."""
    root = tree.calls[0] if tree.calls else None
    root_stats = prof.stats.get(root.key) if root is not None else None

    def total(metric: str) -> float | None:
        stat = root_stats.metrics.get(metric) if root_stats is not None else None
        return None if stat is None else stat.typical

    meta: list[MetaRow] = [
        ("table_format", TABLE_FORMAT, float(TABLE_VERSION)),
        ("model_name", prof.model_name, 0.0),
        ("root_view", root.key if root is not None and has_views else "", 0.0),
        ("num_samples", "", prof.num_samples),
        ("invocations", "", float(len(tree.calls))),
        ("structure_passes", "", float(len(prof.structures))),
        # what the metric columns hold: "median", or "mean" for a version-1 file
        ("statistic", prof.statistic, 0.0),
    ]
    meta.extend((f"total_{metric}", "", total(metric)) for metric in _TOTALS)
    fwd, bwd = total("fwd_ms"), total("bwd_ms")
    meta.append(("total_fwd_bwd_ms", "", None if fwd is None or bwd is None else fwd + bwd))
    flops = root.fwd_flops if root is not None and root.flops_known else None
    meta.append(("total_fwd_flops", "", flops))
    if prof.overhead is not None:  # `watch`: what sampling cost the run, in % of its time
        meta.append(("overhead_pct", "", 100.0 * prof.overhead.share))
        if prof.overhead.step_s > 0:  # and what a long run at log_freq=100 would pay
            meta.append(("overhead_long_pct", "", 100.0 * prof.overhead.at_log_freq(100)))
    meta.extend(roofline_meta(roofline))
    meta.extend(cold_meta(prof))
    meta.extend(phase_meta(prof.phases))
    meta.extend(rank_meta(prof.ranks))
    meta.extend(unseen_meta(prof))
    meta.extend(flops_meta(tree, prof.stats))
    meta.extend(region_meta(tree))
    return meta


def roofline_meta(line: Roofline | None) -> list[MetaRow]:
    """The machine's peaks the efficiency mode is measured against, one row (`roofline`): as
    text for the panel and report (`Roofline.text`); its number the peak FLOP/s."""
    return [] if line is None else [("roofline", line.text(), line.peak_flops)]


def phase_meta(phases: PhaseStats | None) -> list[MetaRow]:
    """One `phase_<name>` row per phase of the step (`records.phases.PHASES`, in step order),
    the panel's phase bar: number the phase's median ms, or, for a phase no sample measured,
    missing with the reason as text. No row without phases (no sample recorded them), so such
    tables are unchanged."""
    if phases is None:
        return []
    return [
        (f"phase_{p}", phases.unmeasured.get(p, ""), phases.median_ms.get(p))
        for p in PHASES
        if p in phases.median_ms or p in phases.unmeasured
    ]


# What became of a sample of the model's first step in its process (`Sample.cold_start`):
# the panel's totals and the report's header show it as is, `summary` says it in full.
COLD_LEFT_OUT = "first step left out (start-up)"
COLD_ONLY = "only sample: the first step, mostly start-up (warmup=1)"


def cold_meta(prof: ProfileData) -> list[MetaRow]:
    """`cold_start`, only when the model's first step was sampled: text `COLD_LEFT_OUT`
    (left out of the statistics, number: how many) or `COLD_ONLY` (the statistics are of that
    step alone, number 0)."""
    if prof.cold_left_out:
        return [("cold_start", COLD_LEFT_OUT, float(prof.cold_left_out))]
    if prof.last is not None and prof.last.cold_start and prof.num_samples == 1:
        return [("cold_start", COLD_ONLY, 0.0)]
    return []


# At most this many `compiled_region` rows (they come out of the row budget before the views):
# a model with one compiled block per layer has one per layer, far fewer than this.
MAX_REGION_ROWS = 256


def region_meta(tree: CallTree) -> list[MetaRow]:
    """One `compiled_region` row per compiled region (`view/regions.py`), in forward order,
    at most `MAX_REGION_ROWS`: text the key of its root call (measured as one call), number
    how many calls ran fused inside it (drawn, with every metric but the FLOPs `missing`).
    The panel's hover cards say so on the root and on every node inside (views are numbered
    depth first: a node is inside when its view's id lies in the root's view's interval). No
    row without compiled code, so tables of eager models are unchanged."""
    return [("compiled_region", r.key, float(r.inside)) for r in regions(tree)[:MAX_REGION_ROWS]]


def _routed(structure: Structure) -> bool:
    return structure.signature == routed_signature(structure.training)


def unseen_meta(prof: ProfileData) -> list[MetaRow]:
    """`unseen_calls`, only when some calls the statistics hold are in no captured graph
    (number: how many; text: the note the panel's banner shows): calls that first appeared
    after every structure was captured (a router's new choice past the variant cap, a
    variant seen once on a step that derived no graph) are drawn without edges, and say so.
    No row without any graph (structure capture off: nothing is drawn with edges) or when
    every call was seen, so tables of ordinary models are unchanged."""
    if not prof.structures:
        return []
    seen = {c.key for s in prof.structures if not _routed(s) for c in s.calls}
    for routed in filter(_routed, prof.structures):  # (its calls without an edge: not seen)
        seen.update(e.view_key for e in routed.edges)
        seen.update(k.partition("|")[0] for e in routed.edges for k in (e.src_key, e.dst_key))
    unseen = sum(1 for key in prof.stats if key not in seen)
    if not unseen:
        return []
    text = (
        f"{unseen} call{'s' if unseen > 1 else ''} appeared after the graph was drawn "
        "(no structure pass or sampled step captured them): drawn without edges"
    )
    return [("unseen_calls", text, float(unseen))]


def calls_without_flops(tree: CallTree, stats: Mapping[str, ModuleStats]) -> int:
    """The calls that ran (the statistics hold them) without a FLOP count: a list member no
    sample called, which a graph holds for the "Load" mode (`view.load`), ran nowhere."""
    return sum(not c.flops_known and c.key in stats for c in tree.calls)


def flops_meta(tree: CallTree, stats: Mapping[str, ModuleStats]) -> list[MetaRow]:
    """`flops_unknown`, only when some calls have FLOP counts and others not (number: how many
    not; text: the note the panel shows in its Compute modes): calls no structure pass ran, such
    as experts a router chose on sampled steps only. No row where every call was counted, or
    none was (capture without structure passes: the FLOP modes are then not measured at all)."""
    unknown = calls_without_flops(tree, stats)
    if not unknown or unknown == sum(c.key in stats for c in tree.calls):
        return []
    text = (
        f"{unknown} call{'s' if unknown > 1 else ''} without FLOPs: no structure pass ran "
        f"{'them' if unknown > 1 else 'it'} (grey; not in the totals)"
    )
    return [("flops_unknown", text, float(unknown))]


# The rows `reduction_meta` adds after the reduction: `reduced`, `views` and `open_view`.
REDUCTION_META_ROWS = 3
# A view opens inside the module that holds at least this share of its time (`open_view`).
DOMINANT_SHARE = 0.9


def reduction_meta(
    reduction: Reduction, tree: CallTree, stats: Mapping[str, ModuleStats] | None = None
) -> list[MetaRow]:
    """`reduced` (the note; number: how many calls, the root aside, have no node drawn, 0 when
    nothing was reduced), `views` (how many are drawn) and, when one module dominates the
    root's view, `open_view` (text: the view to open on, `open_view`)."""
    root_key = tree.calls[0].key if tree.calls else None
    drawn = {n.node_key for g in reduction.graphs for n in g.nodes}
    not_drawn = sum(1 for c in tree.calls if c.key not in drawn and c.key != root_key)
    meta: list[MetaRow] = [
        ("reduced", reduction.note, float(not_drawn if reduction.note else 0)),
        ("views", "", float(len(reduction.graphs))),
    ]
    if root_key is not None and stats is not None:
        opened = open_view(reduction.graphs, stats, root_key)
        if opened != root_key:
            meta.append(("open_view", opened, 0.0))
    return meta


def open_view(graphs: Sequence[ViewGraph], stats: Mapping[str, ModuleStats], root: str) -> str:
    """The view the panel and the report open on: from the root, into the module that holds
    at least `DOMINANT_SHARE` of its view's forward + backward time (medians), as long as
    there is one and its view is drawn (`GPT2LMHeadModel` opens on `transformer`, 95 % of
    it). The breadcrumb leads back; a click elsewhere wins."""
    by_view = {g.view_key: g for g in graphs}

    def cost(key: str) -> float:
        return module_cost(stats.get(key))

    view = root
    while (graph := by_view.get(view)) is not None:
        modules = [n.node_key for n in graph.nodes if n.kind == "module"]
        if not modules:
            break
        top = max(modules, key=cost)
        if top not in by_view or not cost(top) >= DOMINANT_SHARE * cost(view) > 0:
            break
        view = top
    return view
