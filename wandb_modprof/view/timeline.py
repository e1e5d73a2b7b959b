"""The step's timeline as table rows: per drawn view, its calls' spans on the step's time axis,
and once, the memory curve. Takes the last sample (`records.sample.Sample`) and the drawn views
with their group members; gives `span` and `mem` row cells, downsampled to a stated budget, the
meta triples that describe them, and what the downsampling left out (for the `reduced` note).

* `span` rows (one per drawn view and node, built in `view/spans.py`): a module node's
  forward window (`span_phase` "fwd", `t0_ms`..`t1_ms`) and its backward work: the runs of the
  autograd nodes (and checkpoint recomputes) charged to it or to its descendants, consecutive
  runs of the same node merged into one span (`group_count`: how many runs). A group node
  (merged modules) gets its members' spans. At most `SPANS_PER_VIEW` per view: beyond that a
  node's spans closer than a gap are merged, the gap doubling until they fit (a view of more
  nodes than that keeps one forward and one backward span per node: spans of different nodes
  are never merged).
* `mem` rows (`view/memory_curve.py`): the curve (`Sample.memory`), at most `CURVE_POINTS`
  points: the time axis is cut into `CURVE_POINTS // 2` buckets and each keeps its lowest and
  highest point, in time order, so the peak is always kept exactly.
* All timeline rows together (this module): at most `TIMELINE_ROWS`, and at most a quarter of
  the table's rows (`budget`), so the 10,000-row cap holds; views past the budget get no spans.

Times are the last sample's (the table's values are medians over samples; the strip shows one
real step), in ms from the root forward's start.

>>> SPANS_PER_VIEW, CURVE_POINTS, TIMELINE_ROWS
(500, 1000, 3000)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wandb_modprof.records.graph import ViewGraph
from wandb_modprof.records.sample import Sample
from wandb_modprof.view.memory_curve import curve_meta
from wandb_modprof.view.spans import SPANS_PER_VIEW, Span, ViewSpans

CURVE_POINTS = 1000
TIMELINE_ROWS = 3000


@dataclass(frozen=True)
class Timeline:
    """The timeline rows' contents and what was left out ("" when nothing was)."""

    spans: tuple[Span, ...]
    curve: tuple[tuple[float, int], ...]  # (t_ms, live_bytes)
    note: str
    meta: tuple[tuple[str, str, float | None], ...]


def timeline_budget(max_rows: int) -> int:
    """The rows the timeline may take from a table of `max_rows`."""
    return min(TIMELINE_ROWS, max_rows // 4)


def build_timeline(
    sample: Sample | None,
    graphs: Sequence[ViewGraph],
    groups: Mapping[str, list[str]],
    budget: int,
    curve_points: int | None = None,
    source: ViewSpans | None = None,
) -> Timeline:
    """The spans of every view in `graphs` (in that order, while the budget lasts) and the
    curve of `sample`, downsampled to `curve_points` (default: `CURVE_POINTS`, at most a third
    of `budget`; see the module docstring). `source`: the sample's `ViewSpans`, to share its
    indexes and per-view spans between the two timelines `build_table` builds (the second
    one, of the reduced views, then recomputes only the views the reduction changed)."""
    if sample is None or not sample.invocations:
        return Timeline((), (), "", curve_meta(None, None))
    curve = sample.memory
    if curve_points is None:
        curve_points = min(CURVE_POINTS, budget // 3)
    if source is None or source.sample is not sample:
        source = ViewSpans(sample)
    points = source.curve(min(curve_points, budget)) if curve is not None else ()
    left = budget - len(points)
    spans: list[Span] = []
    notes: list[str] = []
    if curve is not None and len(points) < len(curve.t_ms):
        notes.append(f"memory curve: {len(points)} of {len(curve.t_ms)} points")
    keys = _view_keys(graphs, groups)
    skipped = 0
    coarsened = 0
    for i, graph in enumerate(graphs):
        if left <= 0:  # nothing more fits: the views left are not computed, only counted
            skipped += sum(source.has_spans(keys.get(g.view_key, ())) for g in graphs[i:])
            break
        mine_keys = keys.get(graph.view_key, [])
        if left < 2 * len(mine_keys) and source.surely_skipped(mine_keys, left):
            # (only then can it be: a view has at most 2 spans per node once fitted)
            skipped += 1
            continue
        mine, fitted = source.of_view(graph.view_key, mine_keys)
        if len(fitted) < len(mine):
            coarsened += 1
        if len(fitted) > left:
            skipped += 1
            continue
        spans += fitted
        left -= len(fitted)
    if coarsened:
        notes.append(f"spans of {coarsened} view(s) merged to at most {SPANS_PER_VIEW}")
    if skipped:
        notes.append(f"no timeline for {skipped} view(s) (row budget)")
    return Timeline(tuple(spans), tuple(points), "; ".join(notes), source.meta())


# per view, (call key, node key) of every call drawn in it
_ViewKeys = dict[str, list[tuple[str, str]]]


def _view_keys(graphs: Sequence[ViewGraph], groups: Mapping[str, list[str]]) -> _ViewKeys:
    """Per view the calls whose spans it shows, each with the node drawing them: its module
    nodes, and the members of its group nodes (a call in two views counts in the last)."""
    node_of: dict[str, tuple[str, str]] = {}  # call key -> (view key, node key)
    for graph in graphs:
        for node in graph.nodes:
            if node.kind == "module":
                node_of[node.node_key] = (graph.view_key, node.node_key)
            elif node.kind == "group":
                for member in groups.get(node.node_key, []):
                    node_of[member] = (graph.view_key, node.node_key)
    keys: _ViewKeys = {}
    for key, (view, drawn) in node_of.items():
        keys.setdefault(view, []).append((key, drawn))
    return keys
