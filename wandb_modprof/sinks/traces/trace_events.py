"""A sample's module calls as Chrome / Perfetto trace events, on any clock: forward spans,
backward segments and node runs. Takes a `Sample` (and, merged, the profiler's clock offset
and thread ids); gives a list of trace events (plain dicts). `trace.py` writes them as a
standalone trace, `trace_merge.py` adds them to a torch.profiler trace.

A module's backward is not one interval: its autograd nodes run when the engine gets to them,
possibly between nodes of other modules. So its backward is drawn as *segments*: maximal runs
of consecutive node executions (on one thread) that belong to the call or its descendants.
Segments of a call contain those of its children and never overlap a sibling's, so every
thread's spans nest properly, which is what trace viewers need.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from wandb_modprof.records.sample import BackwardRun, InvocationRecord, Sample

PID = 1  # a standalone trace has one process


@dataclass(frozen=True)
class Segment:
    """A stretch of one call's backward on one thread (microseconds on the trace's clock)."""

    key: str
    thread_id: int
    start_us: float
    end_us: float


def _chains(invocations: Sequence[InvocationRecord]) -> dict[str, tuple[str, ...]]:
    """Each key's ancestor chain, root first."""
    chains: dict[str, tuple[str, ...]] = {}
    for rec in invocations:  # forward order: parents first
        parent = chains.get(rec.parent_key, ()) if rec.parent_key is not None else ()
        chains[rec.key] = (*parent, rec.key)
    return chains


def segments(
    invocations: Sequence[InvocationRecord],
    runs: Iterable[tuple[BackwardRun, float, float]],
) -> list[Segment]:
    """Backward segments from timed runs `(run, start_us, end_us)`, per thread, nested."""
    chains = _chains(invocations)
    by_thread: dict[int, list[tuple[float, float, tuple[str, ...]]]] = {}
    for run, start, end in runs:
        chain = chains.get(run.owner_key)
        if chain is not None:
            by_thread.setdefault(run.thread_id, []).append((start, end, chain))
    out: list[Segment] = []
    for thread, items in by_thread.items():
        items.sort(key=lambda item: (item[0], -item[1]))
        stack: list[list[Any]] = []  # [key, start, end], outermost first
        running: list[tuple[float, tuple[str, ...]]] = []  # runs still executing: (end, chain)
        for start, end, own_chain in items:
            while running and running[-1][0] <= start:
                running.pop()
            chain = own_chain
            if running and own_chain[: len(running[-1][1])] != running[-1][1]:
                # Nested inside a run of a call it does not descend from (a checkpoint
                # recompute inside the node that unpacked its tensors): part of that run.
                chain = running[-1][1]
            running.append((end, chain))
            common = 0
            while common < len(stack) and common < len(chain) and stack[common][0] == chain[common]:
                common += 1
            while len(stack) > common:
                key, s, e = stack.pop()
                out.append(Segment(key, thread, s, e))
            stack.extend([key, start, end] for key in chain[common:])
            for seg in stack:
                seg[2] = max(seg[2], end)
        while stack:
            key, s, e = stack.pop()
            out.append(Segment(key, thread, s, e))
    return out


# ---- events -----------------------------------------------------------------------------------
_PAD_US = 0.01  # per nesting level; see `_span`


def _span(
    name: str,
    cat: str,
    pid: int,
    tid: int,
    start_us: float,
    end_us: float,
    args: dict[str, Any],
    height: int = 0,
) -> dict[str, Any]:
    # Viewers turn `ts` and `dur` into integer nanoseconds separately, and on a profiler's
    # clock (~5e12 us) a double holds microseconds to ~1 ns only: a child's end can land a
    # nanosecond or two past its parent's. A span `height` levels above the innermost events is
    # widened by 10 ns per level on both sides, so nesting survives the rounding (the gaps
    # between calls and nodes are microseconds).
    pad = height * _PAD_US
    ts, te = round(start_us - pad, 3), round(end_us + pad, 3)
    return {
        "ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
        "ts": ts, "dur": round(max(0.0, te - ts), 3), "args": args,
    }  # fmt: skip


def _label(rec: InvocationRecord, model_name: str) -> str:
    return model_name if rec.parent_key is None else rec.module_name


def module_events(
    sample: Sample,
    model_name: str,
    offset_us: float,
    pid_of: dict[int, int],
    runs: Sequence[tuple[BackwardRun, float, float]],
    with_runs: bool,
    forward_tid: int | None = None,
) -> list[dict[str, Any]]:
    """Forward spans, backward segments (and, standalone, the node runs) as trace events."""
    top = 1 + max((r.depth for r in sample.invocations), default=0)
    events = _forward_events(sample, model_name, offset_us, pid_of, forward_tid, top)
    events += _backward_events(sample, model_name, pid_of, runs, top)
    if with_runs:
        events += _run_events(pid_of, runs)
    return events


def _forward_events(
    sample: Sample,
    model_name: str,
    offset_us: float,
    pid_of: dict[int, int],
    forward_tid: int | None,
    top: int,
) -> list[dict[str, Any]]:
    """One span per call's forward, on the forward thread (or `forward_tid`)."""
    events: list[dict[str, Any]] = []
    fwd_tid = sample.forward_thread_id if forward_tid is None else forward_tid
    for rec in sample.invocations:
        start = offset_us + rec.fwd_start_ms * 1e3
        # The span is the call's wall-clock window (our hooks' time included), so spans nest
        # and line up with a profiler's events; the args carry the reported times, without it.
        wall_ms = rec.fwd_ms if rec.fwd_wall_ms is None else rec.fwd_wall_ms
        args = {
            "key": rec.key,
            "module_type": rec.module_type,
            "fwd_ms": rec.fwd_ms,
            "fwd_self_ms": rec.fwd_self_ms,
            "fwd_wall_ms": wall_ms,
            "act_bytes": rec.act_bytes,
            "seq_range": [rec.seq_start, rec.seq_end],
        }
        events.append(
            _span(
                f"{_label(rec, model_name)}.forward",
                "wandb_modprof.forward",
                pid_of.get(sample.forward_thread_id, PID),
                fwd_tid,
                start,
                start + wall_ms * 1e3,
                args,
                height=top - rec.depth,
            )
        )
    return events


def _backward_events(
    sample: Sample,
    model_name: str,
    pid_of: dict[int, int],
    runs: Sequence[tuple[BackwardRun, float, float]],
    top: int,
) -> list[dict[str, Any]]:
    """One span per backward segment of a call, on the thread that ran it."""
    recs = {r.key: r for r in sample.invocations}
    segs = segments(sample.invocations, runs)
    counts: dict[str, int] = {}
    for seg in segs:
        counts[seg.key] = counts.get(seg.key, 0) + 1
    events: list[dict[str, Any]] = []
    for seg in segs:
        rec = recs[seg.key]
        args = {
            "key": rec.key,
            "module_type": rec.module_type,
            "bwd_ms": rec.bwd_ms,
            "bwd_self_ms": rec.bwd_self_ms,
            "backward_nodes": rec.backward_nodes,
            "segments": counts[seg.key],
        }
        events.append(
            _span(
                f"{_label(rec, model_name)}.backward",
                "wandb_modprof.backward",
                pid_of.get(seg.thread_id, PID),
                seg.thread_id,
                seg.start_us,
                seg.end_us,
                args,
                height=top - rec.depth,
            )
        )
    return events


def _run_events(
    pid_of: dict[int, int], runs: Sequence[tuple[BackwardRun, float, float]]
) -> list[dict[str, Any]]:
    """The autograd node runs (and checkpoint recomputes) themselves: a standalone trace has
    no profiler events to show them."""
    events: list[dict[str, Any]] = []
    for run, start, end in runs:
        cat = "wandb_modprof.node" if run.kind == "node" else "wandb_modprof.recompute"
        name = run.name if run.kind == "node" else f"{run.name} recompute"
        args = {"owner": run.owner_key, "seq": run.seq}
        tid = run.thread_id
        events.append(_span(name, cat, pid_of.get(tid, PID), tid, start, end, args))
    return events
