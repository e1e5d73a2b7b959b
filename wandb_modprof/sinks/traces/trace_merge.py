"""Module spans merged into a `torch.profiler` Chrome trace, on the profiler's clock. Takes
a `Sample` and the profiler's trace (a dict); gives that trace with the module events added.

The profiler wraps every node execution in an `autograd::engine::evaluate_function: <Node>`
event tagged with the node's sequence number, and our node hooks run inside it, so matching
sequence numbers pins the offset between the two clocks, and each matched node takes the
profiler's own interval. No `record_function` range is ever opened across autograd nodes
(MEASUREMENT.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.sample import BackwardRun, Sample
from wandb_modprof.sinks.traces.trace_events import PID, module_events

NODE_EVENT_PREFIX = "autograd::engine::evaluate_function: "
_FORWARD_TRACK = 1_000_000_000  # + thread id: the module track of a thread in merged traces


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
        pid = pid_of.get(sample.forward_thread_id, PID)
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
    same name that holds their end once the offset is applied (the hook after a node runs
    inside its event; on the host an AccumulateGrad node's start is the thread's previous
    node stamp, inside the previous node's event)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for ev in trace.get("traceEvents", []):
        name = ev.get("name", "")
        if ev.get("ph") == "X" and isinstance(name, str) and name.startswith(NODE_EVENT_PREFIX):
            by_name.setdefault(name[len(NODE_EVENT_PREFIX) :], []).append(ev)
    taken = {id(ev) for ev in exact.values()}
    for run in runs:
        if run.kind != "node" or id(run) in exact:
            continue
        end = offset + run.end_ms * 1e3
        for ev in by_name.get(run.name, []):
            ts, dur = float(ev["ts"]), float(ev["dur"])
            if ts <= end <= ts + dur and id(ev) not in taken:
                exact[id(run)] = ev
                taken.add(id(ev))
                break
