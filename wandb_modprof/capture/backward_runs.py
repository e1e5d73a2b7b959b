"""A finished step's backward as runs for traces: every node execution and checkpoint
recompute, in start order, owned by the call it was charged to.

Takes a finished `SessionRecord` and the node and recompute offsets that `backward_charges`
read from its stamps; gives the `records.sample.BackwardRun`s of `Sample.runs`.

Runs in `resolve`, after the step: nothing here costs the sampled step anything.
"""

from __future__ import annotations

from dataclasses import replace

from wandb_modprof.capture.backward_charges import stamped
from wandb_modprof.capture.session_record import SessionRecord
from wandb_modprof.records.frozen import frozen
from wandb_modprof.records.sample import BackwardRun


def backward_runs(
    record: SessionRecord, t0: list[float], t1: list[float], r_off: list[float]
) -> tuple[BackwardRun, ...]:
    """Every node execution and checkpoint recompute of the backward, in start order."""
    invs = record.invocations
    runs: list[BackwardRun] = []
    nodes = record.nodes
    for j, owner in enumerate(nodes.owner):
        if owner >= 0 and stamped(t0[j]) and stamped(t1[j]):
            # (`frozen`: one run per node that ran, ~90,000 in a 28,000-call MoE step)
            cells = {
                "kind": "node", "name": nodes.name[j], "seq": nodes.seq[j],
                "owner_key": invs[owner].key, "start_ms": t0[j], "end_ms": t1[j],
                "thread_id": nodes.thread[j],
            }  # fmt: skip
            runs.append(frozen(BackwardRun, cells))
    for k, r in enumerate(record.recomputes):
        start, end = r_off[2 * k], r_off[2 * k + 1]
        if r.orig < 0 or not (stamped(start) and stamped(end)):
            continue
        node = r.enclosing_node
        thread = record.nodes.thread[node] if node >= 0 else record.forward_thread
        key = invs[r.orig].key
        runs.append(BackwardRun("recompute", key, -1, key, start, end, thread))
    runs.sort(key=lambda run: (run.start_ms, -run.end_ms))
    return tuple(_clip_recomputes(runs))


def _clip_recomputes(runs: list[BackwardRun]) -> list[BackwardRun]:
    """A recompute runs synchronously inside the node that needed its tensors, so no node
    starts while it runs. With non-reentrant checkpointing's early stop, its module's exit hook
    fires late (when the stop exception is handled): its end is clipped to the next node."""
    out = list(runs)
    for i, run in enumerate(out):
        if run.kind != "recompute":
            continue
        nxt = next(
            (
                r.start_ms
                for r in out[i + 1 :]
                if r.kind == "node" and r.thread_id == run.thread_id and r.start_ms > run.start_ms
            ),
            None,
        )
        if nxt is not None and nxt < run.end_ms:
            out[i] = replace(run, end_ms=nxt)
    return out
