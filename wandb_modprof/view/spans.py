"""The spans of the step's timeline (`span` rows), per drawn view: its nodes' calls' forward
windows and the backward runs charged to them, merged and fitted to at most `SPANS_PER_VIEW`
per view (`view/timeline.py` puts the views' spans together under the table's row budget).
`ViewSpans` computes them for one sample, view by view as they are asked for, and keeps them.

>>> SPANS_PER_VIEW
500
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from wandb_modprof.records.sample import Sample
from wandb_modprof.view.call_times import fwd_end
from wandb_modprof.view.memory_curve import curve_meta, downsample

SPANS_PER_VIEW = 500

# (view key, node key, phase, t0_ms, t1_ms, runs merged)
Span = tuple[str, str, str, float, float, int]


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
        """The sample's curve downsampled to at most `points` (`downsample`)."""
        assert self.sample.memory is not None
        if points not in self._curves:
            self._curves[points] = downsample(self.sample.memory, points)
        return self._curves[points]

    def meta(self) -> tuple[tuple[str, str, float | None], ...]:
        if self._meta is None:
            self._meta = curve_meta(self.sample, self.sample.memory)
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
                fwd.append((view, drawn, "fwd", rec.fwd_start_ms, fwd_end(rec), 1))
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
