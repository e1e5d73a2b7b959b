"""The last sample as a Chrome / Perfetto trace: module forward and backward spans per call.

A module's backward is not one interval: its autograd nodes run when the engine gets to them,
possibly between nodes of other modules. So its backward is drawn as *segments*: maximal runs
of consecutive node executions (on one thread) that belong to the call or its descendants.
Segments of a call contain those of its children and never overlap a sibling's, so every
thread's spans nest properly, which is what trace viewers need.

Merged with a `torch.profiler` trace, the spans move onto the profiler's time base: the
profiler wraps every node execution in an `autograd::engine::evaluate_function: <Node>` event
tagged with the node's sequence number, and our node hooks run inside it, so matching sequence
numbers pins the offset between the two clocks, and each matched node takes the profiler's own
interval. No `record_function` range is ever opened across autograd nodes (MEASUREMENT.md).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import statistics
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.sample import BackwardRun, InvocationRecord, Sample

NODE_EVENT_PREFIX = "autograd::engine::evaluate_function: "
_PID = 1  # a standalone trace has one process
_FORWARD_TRACK = 1_000_000_000  # + thread id: the module track of a thread in merged traces


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
    recs = {r.key: r for r in sample.invocations}
    events: list[dict[str, Any]] = []
    fwd_tid = sample.forward_thread_id if forward_tid is None else forward_tid
    top = 1 + max((r.depth for r in sample.invocations), default=0)
    for rec in sample.invocations:
        start = offset_us + rec.fwd_start_ms * 1e3
        args = {
            "key": rec.key,
            "module_type": rec.module_type,
            "fwd_ms": rec.fwd_ms,
            "fwd_self_ms": rec.fwd_self_ms,
            "act_bytes": rec.act_bytes,
            "seq_range": [rec.seq_start, rec.seq_end],
        }
        events.append(
            _span(
                f"{_label(rec, model_name)}.forward",
                "wandb_modprof.forward",
                pid_of.get(sample.forward_thread_id, _PID),
                fwd_tid,
                start,
                start + rec.fwd_ms * 1e3,
                args,
                height=top - rec.depth,
            )
        )
    segs = segments(sample.invocations, runs)
    counts: dict[str, int] = {}
    for seg in segs:
        counts[seg.key] = counts.get(seg.key, 0) + 1
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
                pid_of.get(seg.thread_id, _PID),
                seg.thread_id,
                seg.start_us,
                seg.end_us,
                args,
                height=top - rec.depth,
            )
        )
    if with_runs:
        for run, start, end in runs:
            cat = "wandb_modprof.node" if run.kind == "node" else "wandb_modprof.recompute"
            name = run.name if run.kind == "node" else f"{run.name} recompute"
            args = {"owner": run.owner_key, "seq": run.seq}
            tid = run.thread_id
            events.append(_span(name, cat, pid_of.get(tid, _PID), tid, start, end, args))
    return events


def _metadata(sample: Sample, model_name: str) -> list[dict[str, Any]]:
    threads = {sample.forward_thread_id: "forward"}
    for run in sample.runs:
        threads.setdefault(run.thread_id, "backward")
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": _PID, "args": {"name": model_name}}
    ]
    for tid, role in threads.items():
        name = f"{role} (thread {tid})"
        meta = {"ph": "M", "name": "thread_name", "pid": _PID, "tid": tid}
        events.append({**meta, "args": {"name": name}})
    return events


def standalone_trace(sample: Sample, model_name: str) -> dict[str, Any]:
    """The sample on its own clock: time 0 is the start of the root module's forward."""
    runs = [(r, r.start_ms * 1e3, r.end_ms * 1e3) for r in sample.runs]
    events = _metadata(sample, model_name)
    events += module_events(sample, model_name, 0.0, {}, runs, with_runs=True)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# ---- merging with torch.profiler ---------------------------------------------------------------
def _node_events(trace: dict[str, Any]) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """The profiler's node events by (sequence number, node name): a node can run more than
    once in a recorded window (`retain_graph`, a gradient penalty's double backward)."""
    found: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for ev in trace.get("traceEvents", []):
        name = ev.get("name", "")
        if ev.get("ph") == "X" and isinstance(name, str) and name.startswith(NODE_EVENT_PREFIX):
            args = ev.get("args")
            seq = args.get("Sequence number") if isinstance(args, dict) else None
            if isinstance(seq, int) and seq >= 0:
                found.setdefault((seq, name[len(NODE_EVENT_PREFIX) :]), []).append(ev)
    return found


_OFFSET_BIN_US = 20.0  # candidate clock offsets closer than this are the same offset


def _match_nodes(
    sample: Sample, nodes: dict[tuple[int, str], list[dict[str, Any]]]
) -> list[tuple[BackwardRun, dict[str, Any]]]:
    """Pair each sampled node run with the profiler event of the same execution.

    Every candidate pair proposes a clock offset; the sampled backward's pairs agree on one.
    If the node ran more than once in the window, the other executions propose other offsets;
    the most common offset wins, and on a tie the earliest (the sampled backward is the first
    to run the step's graph)."""
    candidates: list[tuple[float, BackwardRun, dict[str, Any]]] = []
    for run in sample.runs:
        if run.kind != "node":
            continue
        for ev in nodes.get((run.seq, run.name), ()):
            mid = float(ev["ts"]) + float(ev["dur"]) / 2
            candidates.append((mid - (run.start_ms + run.end_ms) * 500, run, ev))
    if not candidates:
        return []
    bins: dict[int, int] = {}
    for offset, _, _ in candidates:
        key = math.floor(offset / _OFFSET_BIN_US)
        bins[key] = bins.get(key, 0) + 1
    # Neighbouring bins count together (an offset near a bin edge).
    best = max(bins, key=lambda k: (bins[k] + bins.get(k + 1, 0), -k))
    lo, hi = best * _OFFSET_BIN_US, (best + 2) * _OFFSET_BIN_US
    chosen: dict[int, tuple[float, BackwardRun, dict[str, Any]]] = {}
    for cand in candidates:
        offset, run, _ = cand
        if lo <= offset < hi:
            centre = (lo + hi) / 2
            prev = chosen.get(id(run))
            if prev is None or abs(offset - centre) < abs(prev[0] - centre):
                chosen[id(run)] = cand
    return [(run, ev) for _, run, ev in chosen.values()]


def merged_trace(sample: Sample, model_name: str, trace: dict[str, Any]) -> dict[str, Any]:
    """`trace` (a torch.profiler Chrome trace) with our module spans added on its clock."""
    matched = _match_nodes(sample, _node_events(trace))
    if not matched:
        raise ModProfError(
            "the torch.profiler trace holds none of the sampled step's backward nodes: the "
            "profiler must record the step wandb_modprof sampled (the last sample, step "
            f"{sample.step}), with its backward"
        )
    # Our hooks run inside the profiler's node event: the offset keeps each run inside it.
    lo = max(float(ev["ts"]) - run.start_ms * 1e3 for run, ev in matched)
    hi = min(float(ev["ts"]) + float(ev["dur"]) - run.end_ms * 1e3 for run, ev in matched)
    if lo <= hi:
        offset = (lo + hi) / 2
    else:  # clock jitter: the typical offset, and matched nodes keep the profiler's times
        offset = statistics.median(
            float(ev["ts"]) + float(ev["dur"]) / 2 - (run.start_ms + run.end_ms) * 500
            for run, ev in matched
        )
    exact = {id(run): ev for run, ev in matched}
    _match_by_time(sample.runs, exact, trace, offset)
    runs: list[tuple[BackwardRun, float, float]] = []
    for run in sample.runs:
        ev = exact.get(id(run))
        if ev is not None:
            runs.append((run, float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])))
        else:
            runs.append((run, offset + run.start_ms * 1e3, offset + run.end_ms * 1e3))
    pid_of: dict[int, int] = {}
    python_events = False
    for ev in trace.get("traceEvents", []):
        tid, pid = ev.get("tid"), ev.get("pid")
        if isinstance(tid, int) and isinstance(pid, int):
            pid_of.setdefault(tid, pid)
        if ev.get("cat") == "python_function" and tid == sample.forward_thread_id:
            python_events = True
    extra: list[dict[str, Any]] = []
    forward_tid = None
    if python_events:
        # With `with_stack=True` the profiler records our own hook functions, and the forward
        # stamps are taken inside them: on the same track the spans would cut through those
        # events. They go on a track of their own, right above the thread's.
        forward_tid = _FORWARD_TRACK + sample.forward_thread_id
        pid = pid_of.get(sample.forward_thread_id, _PID)
        name = f"wandb_modprof modules (thread {sample.forward_thread_id})"
        meta = {"ph": "M", "pid": pid, "tid": forward_tid}
        extra = [
            {**meta, "name": "thread_name", "args": {"name": name}},
            {**meta, "name": "thread_sort_index", "args": {"sort_index": -1}},
        ]
    out = dict(trace)
    out["traceEvents"] = (
        list(trace.get("traceEvents", []))
        + extra
        + module_events(sample, model_name, offset, pid_of, runs, False, forward_tid)
    )
    return out


def _match_by_time(
    runs: Sequence[BackwardRun],
    exact: dict[int, dict[str, Any]],
    trace: dict[str, Any],
    offset: float,
) -> None:
    """Nodes without a sequence number (AccumulateGrad) match the profiler's node event of the
    same name that holds them once the offset is applied."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for ev in trace.get("traceEvents", []):
        name = ev.get("name", "")
        if ev.get("ph") == "X" and isinstance(name, str) and name.startswith(NODE_EVENT_PREFIX):
            by_name.setdefault(name[len(NODE_EVENT_PREFIX) :], []).append(ev)
    taken = {id(ev) for ev in exact.values()}
    for run in runs:
        if run.kind != "node" or id(run) in exact:
            continue
        mid = offset + (run.start_ms + run.end_ms) * 500
        for ev in by_name.get(run.name, []):
            ts, dur = float(ev["ts"]), float(ev["dur"])
            if ts <= mid <= ts + dur and id(ev) not in taken:
                exact[id(run)] = ev
                taken.add(id(ev))
                break


def load_profiler_trace(source: Any) -> dict[str, Any]:
    """A torch.profiler Chrome trace from a finished `torch.profiler.profile` or a file."""
    if hasattr(source, "export_chrome_trace"):
        fd, tmp = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            source.export_chrome_trace(tmp)
        except Exception as error:  # still recording, never started, ...
            os.unlink(tmp)
            raise ModProfError(
                "torch_profiler must be a finished torch.profiler.profile (its recording "
                f"stopped); exporting its trace failed: {type(error).__name__}: {error}"
            ) from None
        try:
            return _read_json(Path(tmp))
        finally:
            os.unlink(tmp)
    if isinstance(source, (str, os.PathLike)):
        return _read_json(Path(source))
    raise ModProfError(
        "torch_profiler must be a finished torch.profiler.profile or the path of its exported "
        f"Chrome trace; got {type(source).__name__}"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # tensorboard_trace_handler(use_gzip=True) writes .json.gz
            raw = gzip.decompress(raw)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModProfError(f"cannot read the profiler trace {str(path)!r}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ModProfError(
            f"{str(path)!r} is not a Chrome trace: expected an object with 'traceEvents'"
        )
    return data


def write_trace(trace: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    try:
        target.write_text(json.dumps(trace, allow_nan=False), encoding="utf-8")
    except OSError as error:
        raise ModProfError(f"cannot write the trace to {str(target)!r}: {error}") from None
    return target


# ---- checks (used by the tests; cheap enough to run on any trace) ------------------------------
def nesting_errors(events: Iterable[dict[str, Any]], cats: str = "") -> list[str]:
    """Spans that end before they start or overlap without nesting, per (pid, tid); only
    events whose category starts with `cats`."""
    by_track: dict[tuple[Any, Any], list[tuple[int, int, str]]] = {}
    errors: list[str] = []
    for ev in events:
        if ev.get("ph") != "X" or not str(ev.get("cat", "")).startswith(cats):
            continue
        ts, dur = float(ev["ts"]), float(ev["dur"])
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
            errors.append(f"{ev['name']}: ts={ts} dur={dur}")
            continue
        # As viewers do: microseconds to integer nanoseconds, start and length separately.
        start, length = round(ts * 1000), round(dur * 1000)
        spans = by_track.setdefault((ev.get("pid"), ev.get("tid")), [])
        spans.append((start, start + length, ev["name"]))
    for track, spans in by_track.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_: list[tuple[int, int, str]] = []
        for start, end, name in spans:
            while open_ and open_[-1][1] <= start:
                open_.pop()
            if open_ and end > open_[-1][1]:
                errors.append(f"{track}: {name} [{start}, {end}] overlaps {open_[-1]}")
            open_.append((start, end, name))
    return errors
