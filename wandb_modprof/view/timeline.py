"""The step's timeline as table rows: per drawn view, its calls' spans on the step's time axis,
and once, the memory curve. Takes the last sample (`records.sample.Sample`) and the drawn views
with their group members; gives `span` and `mem` row cells, downsampled to a stated budget, the
meta triples that describe them, and what the downsampling left out (for the `reduced` note).

* `span` rows (one per drawn view and node): a module node's forward window
  (`span_phase` "fwd", `t0_ms`..`t1_ms`) and its backward work: the runs of the autograd nodes
  (and checkpoint recomputes) charged to it or to its descendants, consecutive runs of the same
  node merged into one span (`group_count`: how many runs). A group node (merged modules) gets
  its members' spans. At most `SPANS_PER_VIEW` per view: beyond that a node's spans closer
  than a gap are merged, the gap doubling until they fit (a view of more nodes than that keeps
  one forward and one backward span per node: spans of different nodes are never merged).
* `mem` rows: the curve (`Sample.memory`), at most `CURVE_POINTS` points: the time axis is cut
  into `CURVE_POINTS // 2` buckets and each keeps its lowest and highest point, in time order,
  so the peak is always kept exactly.
* All timeline rows together: at most `TIMELINE_ROWS`, and at most a quarter of the table's
  rows (`budget`), so the 10,000-row cap holds; views past the budget get no spans.

Times are the last sample's (the table's values are medians over samples; the strip shows one
real step), in ms from the root forward's start.

>>> SPANS_PER_VIEW, CURVE_POINTS, TIMELINE_ROWS
(500, 1000, 3000)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wandb_modprof.records.graph import ViewGraph
from wandb_modprof.records.sample import InvocationRecord, MemoryCurve, Sample

SPANS_PER_VIEW = 500
CURVE_POINTS = 1000
TIMELINE_ROWS = 3000

# (view key, node key, phase, t0_ms, t1_ms, runs merged)
Span = tuple[str, str, str, float, float, int]


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
) -> Timeline:
    """The spans of every view in `graphs` (in that order, while the budget lasts) and the
    curve of `sample`, downsampled to `curve_points` (default: `CURVE_POINTS`, at most a third
    of `budget`; see the module docstring)."""
    if sample is None or not sample.invocations:
        return Timeline((), (), "", _meta(None, None))
    curve = sample.memory
    if curve_points is None:
        curve_points = min(CURVE_POINTS, budget // 3)
    points = _downsample(curve, min(curve_points, budget)) if curve is not None else ()
    left = budget - len(points)
    spans: list[Span] = []
    notes: list[str] = []
    if curve is not None and len(points) < len(curve.t_ms):
        notes.append(f"memory curve: {len(points)} of {len(curve.t_ms)} points")
    per_view = _view_spans(sample, graphs, groups)
    skipped = 0
    coarsened = 0
    for graph in graphs:
        mine = per_view.get(graph.view_key, [])
        fitted = _fit(mine, SPANS_PER_VIEW)
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
    return Timeline(tuple(spans), tuple(points), "; ".join(notes), _meta(sample, curve))


def _view_spans(
    sample: Sample, graphs: Sequence[ViewGraph], groups: Mapping[str, list[str]]
) -> dict[str, list[Span]]:
    """Per view key, its nodes' forward spans then backward spans (merged runs)."""
    inv = {r.key: r for r in sample.invocations}
    # call key -> (view key, node key) for every module or group node of a drawn view
    node_of: dict[str, tuple[str, str]] = {}
    for graph in graphs:
        for node in graph.nodes:
            if node.kind == "module":
                node_of[node.node_key] = (graph.view_key, node.node_key)
            elif node.kind == "group":
                for member in groups.get(node.node_key, []):
                    node_of[member] = (graph.view_key, node.node_key)
    out: dict[str, list[Span]] = {g.view_key: [] for g in graphs}
    for key, (view, drawn) in node_of.items():
        rec = inv.get(key)
        if rec is not None:
            out[view].append((view, drawn, "fwd", rec.fwd_start_ms, _fwd_end(rec), 1))
    for view, spans in out.items():
        spans.sort(key=lambda s: s[3])
        out[view] = _merge_consecutive(spans)
    backward: dict[str, list[Span]] = {g.view_key: [] for g in graphs}
    # every drawn view above the run's owner sees it, as the span of its node there: the
    # nodes are found once per owner (a MoE step has ~50,000 runs of ~15,000 owners)
    seen_by: dict[str, list[tuple[str, str]]] = {}
    for run in sorted(sample.runs, key=lambda r: r.start_ms):
        hits = seen_by.get(run.owner_key)
        if hits is None:
            hits = seen_by[run.owner_key] = _drawn_above(run.owner_key, node_of, inv)
        for view, drawn in hits:
            backward[view].append((view, drawn, "bwd", run.start_ms, run.end_ms, 1))
    for view in out:
        out[view] += _merge_consecutive(backward[view])
    return out


def _drawn_above(
    key: str, node_of: Mapping[str, tuple[str, str]], inv: Mapping[str, InvocationRecord]
) -> list[tuple[str, str]]:
    """(view key, node key) of every drawn node that is the call `key` or an ancestor of it."""
    hits: list[tuple[str, str]] = []
    up: str | None = key
    while up is not None:
        hit = node_of.get(up)
        if hit is not None:
            hits.append(hit)
        rec = inv.get(up)
        up = rec.parent_key if rec is not None else None
    return hits


def _fwd_end(rec: InvocationRecord) -> float:
    wall = rec.fwd_wall_ms if rec.fwd_wall_ms is not None else rec.fwd_ms
    return rec.fwd_start_ms + wall


def _merge_consecutive(spans: list[Span], gap: float = -1.0) -> list[Span]:
    """Spans in start order; a span of the same node as the one before it (no other node's in
    between), or closer than `gap` to its node's previous span, is merged into it."""
    out: list[Span] = []
    last: dict[tuple[str, str], int] = {}  # (node, phase) -> index in out of its latest span
    for span in spans:
        node = (span[1], span[2])
        i = last.get(node)
        if i is not None and (i == len(out) - 1 or span[3] - out[i][4] <= gap):
            prev = out[i]
            out[i] = (prev[0], prev[1], prev[2], prev[3], max(prev[4], span[4]), prev[5] + span[5])
            continue
        last[node] = len(out)
        out.append(span)
    return out


def _fit(spans: list[Span], cap: int) -> list[Span]:
    """At most `cap` spans: merge each node's spans across gaps, doubling the gap. A view with
    more than `cap` nodes keeps one forward and one backward span per node (spans of different
    nodes are never merged): the gap stops growing once it spans the whole step (it looped
    forever there: `prof.table()` of a 600-module `Sequential` hung)."""
    if len(spans) <= cap:
        return spans
    ends = [s[4] for s in spans] + [s[3] for s in spans]
    extent = max(ends) - min(ends)
    gap = max(extent / (4 * cap), 1e-6)
    ordered = sorted(spans, key=lambda s: (s[2] != "fwd", s[3]))
    fitted = spans
    while len(fitted) > cap:
        fitted = _merge_consecutive(ordered, gap)
        if gap > extent:
            break  # every node's spans are one per phase now: no wider gap merges more
        gap *= 2
    return fitted


def _downsample(curve: MemoryCurve, points: int) -> tuple[tuple[float, int], ...]:
    """At most `points` (t, bytes) of the curve: each of `points // 2` equal time buckets keeps
    its lowest and highest point, in time order (the peak is kept exactly)."""
    pairs = list(zip(curve.t_ms, curve.live_bytes, strict=True))
    if len(pairs) <= points:
        return tuple(pairs)
    buckets = max(points // 2, 1)
    t0, t1 = pairs[0][0], pairs[-1][0]
    width = (t1 - t0) / buckets or 1.0
    kept: dict[int, list[int]] = {}  # bucket -> [index of its lowest, index of its highest]
    for i, (t, b) in enumerate(pairs):
        k = min(int((t - t0) / width), buckets - 1)
        have = kept.get(k)
        if have is None:
            kept[k] = [i, i]
            continue
        if b < pairs[have[0]][1]:
            have[0] = i
        if b > pairs[have[1]][1]:
            have[1] = i
    chosen = sorted({i for pair in kept.values() for i in pair})
    return tuple(pairs[i] for i in chosen)


def _meta(
    sample: Sample | None, curve: MemoryCurve | None
) -> tuple[tuple[str, str, float | None], ...]:
    """`timeline` (text: the curve's source, "" without one; number: the sample's step),
    `mem_peak` (text: the key of the call running at the curve's peak, "" if none was;
    number: the peak's live bytes) and `mem_peak_ms` (text: "forward" or "backward"; number:
    when)."""
    if sample is None or curve is None or not curve.live_bytes:
        step = float(sample.step) if sample is not None else None
        return (("timeline", "", step), ("mem_peak", "", None), ("mem_peak_ms", "", None))
    top = max(range(len(curve.live_bytes)), key=curve.live_bytes.__getitem__)
    at = curve.t_ms[top]
    key, phase = running_at(sample, at)
    return (
        ("timeline", curve.source, float(sample.step)),
        ("mem_peak", key, float(curve.live_bytes[top])),
        ("mem_peak_ms", phase, at),
    )


def running_at(sample: Sample, t_ms: float) -> tuple[str, str]:
    """The innermost call running at `t_ms` and in which phase: in the forward the deepest
    call whose window holds it, in the backward the owner of the run holding it (the latest
    started, so a nested recompute wins); ("", "") between them."""
    best: InvocationRecord | None = None
    for rec in sample.invocations:
        if rec.fwd_start_ms <= t_ms <= _fwd_end(rec) and (best is None or rec.depth > best.depth):
            best = rec
    if best is not None:
        return best.key, "forward"
    owner = ""
    for run in sample.runs:
        if run.start_ms <= t_ms <= run.end_ms:
            owner = run.owner_key
    return (owner, "backward") if owner else ("", "")
