"""Turn a finished step session's record (`session_record.SessionRecord`: stamps, node slots,
byte counts) into invocation records.

Runs after the step: on an accelerator only once the step's timing events have completed, so
nothing here can stall training.

Here: the forward times, the sums up the call tree and the records themselves. The backward
charged to its calls is `backward_charges`, the backward's runs for traces `backward_runs`,
the memory curve and the CPU peaks read from it `memory_curve`.
"""

from __future__ import annotations

from collections.abc import Mapping

from wandb_modprof._warn import warn_safely
from wandb_modprof.capture import memory_curve
from wandb_modprof.capture.backward_charges import BackwardTimes, NodeMemory, backward_times
from wandb_modprof.capture.backward_runs import backward_runs
from wandb_modprof.capture.forward.invocation import rows_of
from wandb_modprof.capture.memory.gradient_readings import GradientState
from wandb_modprof.capture.memory.static_memory import StaticMemory
from wandb_modprof.capture.session_record import SessionRecord
from wandb_modprof.capture.step.clock import CpuClock
from wandb_modprof.capture.step_phases import step_phases
from wandb_modprof.records.frozen import frozen
from wandb_modprof.records.sample import InvocationRecord, MemoryCurve, Sample, StepTotals


def resolve(
    record: SessionRecord,
    static: Mapping[str, StaticMemory],
    gradients: GradientState | None,
) -> Sample:
    """The sample of a finished session's record: one `InvocationRecord` per call (forward
    times from the call stamps; backward times from node stamps charged to their owners,
    recomputes to the calls they repeat, then summed up the call tree; memory from the byte
    counters and the static / gradient readings taken at the end of the step) and the step
    totals."""
    clock, ref = record.clock, record.ref_stamp
    invs = record.invocations
    fwd_start, fwd, fwd_self, fwd_wall = _forward_times(record)
    curve, fwd_peak, node_mem = _memory(record, static, gradients)
    back = (
        backward_times(record, node_mem) if record.bwd_started else BackwardTimes.empty(len(invs))
    )
    act_self: list[int | None] = [None] * len(invs)
    if record.activations is not None:
        counts = record.activations.bytes_by_invocation
        act_self = [counts.get(i, 0) for i in range(len(invs))]
    bwd, act = _roll_up(record, back, act_self)
    records = [
        _record(
            record,
            i,
            static,
            gradients,
            (fwd_start, fwd, fwd_self, fwd_wall),
            back,
            bwd,
            act,
            act_self,
            fwd_peak,
        )
        for i in range(len(invs))
    ]
    bwd_total = None
    if record.bwd_started:
        begin, end = clock.offsets_ms(ref, [record.bwd_t_begin, record.bwd_t_end])
        bwd_total = end - begin
    phases = step_phases(
        record.phase_stamps,
        clock,
        ref,
        fwd[0],
        bwd[0] if record.bwd_started else None,
        record.bwd_t_begin,
    )
    totals = StepTotals(fwd_ms=fwd[0], bwd_ms=bwd_total, act_bytes=act[0], phases=phases)
    return Sample(
        step=record.step,
        invocations=tuple(records),
        totals=totals,
        forward_thread_id=record.forward_thread,
        runs=backward_runs(record, back.t0, back.t1, back.r_off) if record.bwd_started else (),
        host_origin_ns=ref if isinstance(clock, CpuClock) else None,
        memory=curve,
        cold_start=record.cold_start,
    )


def _memory(
    record: SessionRecord,
    static: Mapping[str, StaticMemory],
    gradients: GradientState | None,
) -> tuple[MemoryCurve | None, list[int | None] | None, NodeMemory | None]:
    """The step's memory curve; on CPU also the per-call forward peaks and per-node levels read
    from it (on an accelerator those come from the allocator's peak counter, in the record).
    A failure here loses the curve, never the sample."""
    try:
        if record.device_memory:
            return memory_curve.device_curve(record), None, None
        counter = record.activations
        if counter is None or counter.curve is None or not isinstance(record.clock, CpuClock):
            return None, None, None
        root = record.invocations[0]
        st = static.get(root.name)
        static_bytes = st.param_bytes + st.buffer_bytes if st is not None else 0
        grads = gradients.grad_bytes.get(root.name) if gradients is not None else None
        levels = memory_curve.saved_levels(record, static_bytes, grads)
        peaks = memory_curve.forward_peaks(record, levels)
        nodes = memory_curve.node_levels(record, levels) if record.bwd_started else None
        return levels.curve(), peaks, nodes
    except Exception as error:  # the curve is extra: the sample's other numbers stand
        # (the default warnings filter shows this once per place, not once per step)
        warn_safely(f"wandb_modprof: no memory curve for this sample: {error!r}", RuntimeWarning)
        return None, None, None


def _forward_times(
    record: SessionRecord,
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per call: forward start offset, inclusive forward time and self time (children out),
    both less our own hook time inside the window (`CpuClock.own_at`), and the wall-clock
    window (what traces draw)."""
    invs = record.invocations
    n = len(invs)
    stamps = record.clock.offsets_ms(
        record.ref_stamp, [t for inv in invs for t in (inv.t0, inv.t1)]
    )
    fwd_start, fwd_end = stamps[0::2], stamps[1::2]
    wall = [fwd_end[i] - fwd_start[i] for i in range(n)]
    fwd = [wall[i] - (invs[i].own1 - invs[i].own0) / 1e6 for i in range(n)]
    children: list[list[int]] = [[] for _ in range(n)]
    for i, inv in enumerate(invs):
        if inv.parent >= 0:
            children[inv.parent].append(i)
    # The hook dispatch taken out per child call is a measured constant (`HookCost`): where a
    # call's real dispatch was cheaper, a container of many near-empty calls could read less
    # than its children. It is then its children's sum (self 0), never a negative self time.
    for i in reversed(range(n)):  # preorder: children after their parent
        fwd[i] = max(fwd[i], sum(fwd[c] for c in children[i]), 0.0)
    fwd_self = [fwd[i] - sum(fwd[c] for c in children[i]) for i in range(n)]
    return fwd_start, fwd, fwd_self, wall


def _roll_up(
    record: SessionRecord, back: BackwardTimes, act_self: list[int | None]
) -> tuple[list[float], list[int | None]]:
    """Inclusive backward time and activation bytes: each call's own plus its descendants'
    (node counts, first / last node and peaks are folded into `back` in place)."""
    invs = record.invocations
    act: list[int | None] = list(act_self)
    bwd = list(back.bwd_self)
    first, last, first_alloc, peak = back.first, back.last, back.first_alloc, back.peak
    for i in range(len(invs) - 1, -1, -1):  # preorder indices: children come after their parent
        p = invs[i].parent
        if p < 0:
            continue
        bwd[p] += bwd[i]
        back.nodes_run[p] += back.nodes_run[i]
        if first[i] < first[p]:
            first[p], first_alloc[p] = first[i], first_alloc[i]
        last[p] = max(last[p], last[i])
        if peak[i] is not None:
            q = peak[p]
            peak[p] = peak[i] if q is None else max(q, peak[i])  # type: ignore[type-var]
        a, b = act[p], act[i]
        if a is not None and b is not None:
            act[p] = a + b
    return bwd, act


def _record(
    record: SessionRecord,
    i: int,
    static: Mapping[str, StaticMemory],
    gradients: GradientState | None,
    forward: tuple[list[float], list[float], list[float], list[float]],
    back: BackwardTimes,
    bwd: list[float],
    act: list[int | None],
    act_self: list[int | None],
    fwd_peak: list[int | None] | None,
) -> InvocationRecord:
    # One field per metric, in the record's order: splitting it would only scatter the list.
    invs = record.invocations
    inv = invs[i]
    fwd_start, fwd, fwd_self, fwd_wall = forward
    has_bwd = record.bwd_started
    st = static.get(inv.name)
    ran_any = back.nodes_run[i] > 0
    first, last = back.first[i], back.last[i]
    grad_bytes = gradients.grad_bytes.get(inv.name) if gradients is not None else None
    # (`frozen`: the dataclass's own __init__ was half the time of building the records)
    return frozen(
        InvocationRecord,
        {
            "key": inv.key,
            "module_name": inv.name,
            "module_type": inv.module_type,
            "call_index": inv.call_index,
            "parent_key": invs[inv.parent].key if inv.parent >= 0 else None,
            "depth": inv.depth,
            "order": i,
            "fwd_ms": fwd[i],
            "fwd_self_ms": fwd_self[i],
            "bwd_ms": _duration(bwd[i]) if has_bwd else None,
            "bwd_self_ms": back.bwd_self[i] if has_bwd else None,
            "bwd_span_ms": last - first if ran_any else (0.0 if has_bwd else None),
            "recompute_ms": _duration(back.recompute[i]) if back.recomputed[i] else None,
            "fwd_start_ms": fwd_start[i],
            "bwd_start_ms": first if ran_any else None,
            "bwd_end_ms": last if ran_any else None,
            "backward_nodes": back.nodes_run[i],
            "seq_start": inv.seq0,
            "seq_end": inv.seq1,
            "act_bytes": act[i],
            "act_self_bytes": act_self[i],
            "param_bytes": st.param_bytes if st else 0,
            "param_count": st.param_count if st else 0,
            "buffer_bytes": st.buffer_bytes if st else 0,
            "grad_bytes": grad_bytes,
            "optim_bytes": st.optim_bytes if st else None,
            "fwd_mem_delta_bytes": (
                inv.mem_alloc1 - inv.mem_alloc0
                if inv.mem_alloc0 is not None and inv.mem_alloc1 is not None
                else None
            ),
            "fwd_mem_peak_bytes": (
                max(0, inv.mem_peak - inv.mem_alloc0)
                if inv.mem_peak is not None and inv.mem_alloc0 is not None
                else (fwd_peak[i] if fwd_peak is not None else None)
            ),
            "bwd_mem_peak_bytes": _peak_over(back.peak[i], back.first_alloc[i]),
            "param_norm": gradients.param_norm.get(inv.name) if gradients is not None else None,
            "grad_norm": gradients.grad_norm.get(inv.name) if gradients is not None else None,
            "gc_ms": record.gc.ms(i),
            "fwd_wall_ms": fwd_wall[i],
            "rows": rows_of(inv.shapes),
        },
    )


def _peak_over(peak: int | None, baseline: int | None) -> int | None:
    if peak is None or baseline is None:
        return None
    return max(0, peak - baseline)


def _duration(ms: float) -> float:
    """Never below 0 (NaN stays): sums of node times less our hooks' can end a hair below."""
    return 0.0 if ms < 0 else ms
