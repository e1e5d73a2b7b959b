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
from operator import itemgetter

import numpy as np

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
    source: ViewSpans | None = None,
) -> Timeline:
    """The spans of every view in `graphs` (in that order, while the budget lasts) and the
    curve of `sample`, downsampled to `curve_points` (default: `CURVE_POINTS`, at most a third
    of `budget`; see the module docstring). `source`: the sample's `ViewSpans`, to share its
    indexes and per-view spans between the two timelines `build_table` builds (the second
    one, of the reduced views, then recomputes only the views the reduction changed)."""
    if sample is None or not sample.invocations:
        return Timeline((), (), "", _meta(None, None))
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


class ViewSpans:
    """A sample's spans per view, computed when asked (`build_timeline` stops asking once its
    budget is spent: a MoE step has ~3,000 views and ~50,000 backward runs) and kept, with
    its downsampled curve and meta rows, so the table's second timeline (of the reduced
    views) recomputes only the views the reduction changed."""

    def __init__(self, sample: Sample) -> None:
        self.sample = sample
        self._inv = {r.key: r for r in sample.invocations}
        self._children: dict[str, list[str]] = {}
        for r in sample.invocations:
            if r.parent_key is not None:
                self._children.setdefault(r.parent_key, []).append(r.key)
        # owner -> its runs, each with its rank in start order (the order spans are merged in)
        self._runs: dict[str, list[tuple[int, float, float]]] = {}
        self._in_order: list[tuple[str, float, float]] = []  # (owner, start, end), by rank
        for rank, run in enumerate(sorted(sample.runs, key=lambda r: r.start_ms)):
            self._runs.setdefault(run.owner_key, []).append((rank, run.start_ms, run.end_ms))
            self._in_order.append((run.owner_key, run.start_ms, run.end_ms))
        # a parent cycle in a damaged file cannot loop forever: a walk visits at most this many
        self._limit = len(self._inv) + 1
        # view -> (the calls it was computed for, its spans, those fitted to SPANS_PER_VIEW)
        self._done: dict[str, tuple[list[tuple[str, str]], list[Span], list[Span]]] = {}
        self._below: dict[str, tuple[int, int]] = {}  # key -> (runs, calls) of its subtree
        self._curves: dict[int, tuple[tuple[float, int], ...]] = {}
        self._meta: tuple[tuple[str, str, float | None], ...] | None = None

    def curve(self, points: int) -> tuple[tuple[float, int], ...]:
        """The sample's curve downsampled to at most `points` (`_downsample`)."""
        assert self.sample.memory is not None
        if points not in self._curves:
            self._curves[points] = _downsample(self.sample.memory, points)
        return self._curves[points]

    def meta(self) -> tuple[tuple[str, str, float | None], ...]:
        if self._meta is None:
            self._meta = _meta(self.sample, self.sample.memory)
        return self._meta

    def has_spans(self, keys: Sequence[tuple[str, str]]) -> bool:
        return any(k in self._inv or k in self._runs for k, _ in keys)

    def _runs_below(self, key: str) -> int | None:
        """The runs the walk of `of_view` finds under `key` (its own and its descendants'),
        None where that walk would meet a parent cycle or stop at its limit (a damaged
        file): then nothing is assumed. Memoised: each call's subtree is counted once."""
        below, runs, children = self._below, self._runs, self._children
        stack: list[tuple[str, bool]] = [(key, False)]
        open_: set[str] = set()  # expanded, not finished: the path from `key`
        while stack:
            k, finished = stack.pop()
            if finished:
                open_.discard(k)
                n_runs, n_calls = len(runs.get(k, ())), 1
                for c in children.get(k, ()):
                    r, c_calls = below[c]
                    n_runs, n_calls = n_runs + r, n_calls + c_calls
                below[k] = (n_runs, n_calls)
                continue
            if k in below:
                continue
            if k in open_:
                return None  # a cycle
            open_.add(k)
            stack.append((k, True))
            stack.extend((c, False) for c in children.get(k, ()))
        n_runs, n_calls = below[key]
        return n_runs if n_calls <= self._limit else None

    def surely_skipped(self, keys: Sequence[tuple[str, str]], left: int) -> bool:
        """Whether the view's fitted spans would not fit in `left` rows and `_fit` would not
        merge any (so skipping it uncomputed changes no note): every node with a forward
        record or a backward run keeps at least one span per phase, and a view of at most
        `SPANS_PER_VIEW` spans is kept as it is. Cheaper than building its spans: once the
        budget is nearly spent, most views of a large model are only this."""
        fwd_nodes: set[str] = set()
        bwd_nodes: set[str] = set()
        most = 0  # spans before merging: an upper bound on the view's spans
        for key, drawn in keys:
            if key in self._inv:
                fwd_nodes.add(drawn)
                most += 1
            runs = self._runs_below(key)
            if runs is None:
                return False
            if runs:
                bwd_nodes.add(drawn)
                most += runs
        return most <= SPANS_PER_VIEW and len(fwd_nodes) + len(bwd_nodes) > left

    def of_view(self, view: str, keys: list[tuple[str, str]]) -> tuple[list[Span], list[Span]]:
        """The view's nodes' forward spans, then their backward spans (merged runs): a node's
        backward is every run of its call's subtree; and those fitted to `SPANS_PER_VIEW`."""
        done = self._done.get(view)
        if done is not None and done[0] == keys:
            return done[1], done[2]
        fwd: list[Span] = []
        for key, drawn in keys:
            rec = self._inv.get(key)
            if rec is not None:
                fwd.append((view, drawn, "fwd", rec.fwd_start_ms, _fwd_end(rec), 1))
        fwd.sort(key=lambda s: s[3])
        # the calls each node's walk visits (a call visited twice, by a parent cycle in a
        # damaged file, would show its runs twice: then the runs are gathered per visit)
        drawn_of: dict[str, str] = {}
        visits, found = 0, 0
        runs_of, children_of = self._runs.get, self._children.get
        for key, drawn in keys:
            todo, walked = [key], 0
            while todo and walked <= self._limit:
                k = todo.pop()
                walked += 1
                drawn_of[k] = drawn
                found += len(runs_of(k, ()))
                todo.extend(children_of(k, ()))
            visits += walked
        bwd: list[Span]
        if visits == len(drawn_of) and 4 * found > len(self._in_order):
            # Most of the step's runs (the top views): one pass in start order, no sort.
            bwd = [
                (view, drawn_of[owner], "bwd", t0, t1, 1)
                for owner, t0, t1 in self._in_order
                if owner in drawn_of
            ]
        else:
            ranked: list[tuple[int, Span]] = []
            for key, drawn in keys:
                todo, walked = [key], 0
                while todo and walked <= self._limit:
                    k = todo.pop()
                    walked += 1
                    for rank, t0, t1 in runs_of(k, ()):
                        ranked.append((rank, (view, drawn, "bwd", t0, t1, 1)))
                    todo.extend(children_of(k, ()))
            ranked.sort(key=_first)
            bwd = [span for _, span in ranked]
        mine = _merge_consecutive(fwd) + _merge_consecutive(bwd)
        fitted = _fit(mine, SPANS_PER_VIEW)
        self._done[view] = (keys, mine, fitted)
        return mine, fitted


_first = itemgetter(0)


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
    its lowest and highest point (the first of equals), in time order (the peak is kept
    exactly)."""
    pairs = list(zip(curve.t_ms, curve.live_bytes, strict=True))
    if len(pairs) <= points:
        return tuple(pairs)
    buckets = max(points // 2, 1)
    t = np.asarray(curve.t_ms, dtype=np.float64)
    live = np.asarray(curve.live_bytes)
    t0, t1 = t[0], t[-1]
    width = (t1 - t0) / buckets or 1.0
    if live.dtype.kind not in "iuf" or not np.isfinite(t).all() or not np.isfinite(width):
        return _downsample_loop(pairs, buckets, t0, width)  # a damaged or huge-valued file
    bucket = np.minimum(np.trunc((t - t0) / width), buckets - 1)
    index = np.arange(len(t))
    # per bucket the first lowest and the first highest point: sort by (bucket, value, index)
    lowest = np.lexsort((index, live, bucket))
    highest = np.lexsort(
        (index, -live.astype(np.float64) if live.dtype.kind == "u" else -live, bucket)
    )
    starts = np.flatnonzero(np.r_[True, np.diff(bucket[lowest]) != 0])
    chosen = np.union1d(lowest[starts], highest[starts])
    return tuple(pairs[i] for i in chosen.tolist())


def _downsample_loop(
    pairs: list[tuple[float, int]], buckets: int, t0: float, width: float
) -> tuple[tuple[float, int], ...]:
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
