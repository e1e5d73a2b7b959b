"""The backward of the structure pass's step, counted: the bytes and ATen ops of each call's
backward, for its efficiency against the roofline (`records/roofline.py`).

The structure pass sees the forward only. When its forward returns, the autograd nodes it
created get a pre-hook (`attach`) that pushes a counting `TorchDispatchMode` for the call that
created the node (the innermost call whose sequence numbers hold the node's). Every ATen op
the node runs is then charged to that call, as the forward's are: bytes read and written
(`work.moved_bytes`), one op, views not counted. The autograd engine restores the thread's
mode stack after each node, so the mode ends with its node, even one that raises
(`torch_private.push_mode_for_this_node`). A parameter's AccumulateGrad node is charged to
the call of the node that fed it (its module's); where two gradients of a tensor meet, the
engine's sum runs in the node whose gradient arrives second, and is its call's. An
activation-checkpointing recompute runs inside a node and is that node's call's backward work:
reentrant, the node of `checkpoint` itself (the call whose code called it); non-reentrant, the
node that first unpacks a recomputed tensor.

Every backward through these nodes until the model's next forward is counted, summed: a
`torch.autograd.grad(..., create_graph=True)` before `loss.backward()` (a gradient penalty)
is backward work of the step too. At the end of each (an engine callback queued by its first
node) `done` receives the counts so far; the next forward (or `detach`) removes the hooks
(`close`). A step whose backward never comes (evaluation, a forward-only pass) keeps
`bwd_work_known=False`. An op whose tensors cannot be sized, or an error in a hook, stops the
count: `done` is then told the error (the capture warns once) and the backward runs on.

The pass's step is never timed, so the hooks and the mode cost nothing that is measured, and
neither holds a tensor: the hooks hold this counter, which holds integers.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from wandb_modprof.capture.forward.invocation import tensors_in
from wandb_modprof.capture.step import gc_pause
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.torch_private import TorchDispatchMode
from wandb_modprof.capture.structure.flops import PLAIN_TYPES, handles
from wandb_modprof.capture.structure.pass_frames import rolled_up
from wandb_modprof.capture.structure.work import is_work, moved_bytes
from wandb_modprof.records.calls import Structure

# (bytes, ops) per call, own nodes only, summed over the backwards so far; or the error that
# stopped the count
Done = Callable[[list[int], list[int], Exception | None], None]


class CountedPass(Protocol):
    """What is read of the structure pass whose backward is counted (`StructurePass`)."""

    def call_ranges(self) -> tuple[list[tuple[int, int]], list[int]]: ...

    def followed_calls(self) -> list[bool]: ...

    def with_known_backward(self, nbytes: list[int], ops: list[int]) -> bool: ...


def owners(ranges: Sequence[tuple[int, int]], lo: int, hi: int) -> list[int]:
    """For each sequence number in `[lo, hi)`, the index of the innermost call whose
    `[start, end)` holds it (-1: none). `ranges` are in call order, parents before children,
    so a child's range overwrites its parent's."""
    found = [-1] * max(0, hi - lo)
    for index, (first, last) in enumerate(ranges):
        start, end = max(first, lo), min(last, hi)
        if end > start:
            found[start - lo : end - lo] = [index] * (end - start)
    return found


class _Count(TorchDispatchMode):
    """Charges every op run while it is pushed to `call`. One per thread, with its own
    counts: the engine may run nodes on several device threads at once."""

    supports_higher_order_operators = True  # torch.cond & co. in a backward run unchanged

    def __init__(self, work: BackwardWork, calls: int) -> None:
        super().__init__()
        self.work = work
        self.call = -1
        self.bytes = [0] * calls
        self.ops = [0] * calls

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if not handles(func, types, PLAIN_TYPES):
            return NotImplemented
        out = func(*args, **kwargs)
        if not is_work(func):
            return out
        try:
            self.bytes[self.call] += moved_bytes(args, kwargs, out)
            self.ops[self.call] += 1
        except Exception as error:  # an argument we cannot size: the count is unknown
            self.work.fail(error)
        return out


class BackwardWork:
    """The counted backward of one structure pass's calls (see the module docstring)."""

    def __init__(self, calls: int, done: Done) -> None:
        self.calls = calls
        self.error: Exception | None = None
        self.closed = False
        self._done: Done | None = done
        self._owner: list[int] = []
        self._lo = 0
        self._accumulate: dict[int, int] = {}  # id of an AccumulateGrad node -> its call
        self._handles: list[Any] = []
        self._tasks: set[int] = set()  # the backwards (graph tasks) seen
        self._local = threading.local()
        self._modes: list[_Count] = []  # every thread's

    def attach(
        self,
        roots: Iterable[Any],
        owner: list[int],
        lo: int,
        known: Sequence[bool] | None = None,
    ) -> int:
        """Hook the nodes reachable from `roots` (the forward's output nodes) created in
        `[lo, lo + len(owner))` (`owner`: the call of each), and the AccumulateGrad nodes they
        feed; the number hooked. One pre-hook, the same function on every node (registering
        is most of the cost: tens of thousands of nodes in a large model). The nodes of a
        call whose backward is `known` from an earlier pass (`known_calls`) are walked
        through, not hooked: their work is not counted again."""
        self._owner, self._lo = owner, lo
        todo = [(node, -1) for node in roots]
        seen: set[int] = set()
        hook, handles = self._pre, self._handles
        while todo:
            node, via = todo.pop()
            if id(node) in seen:
                continue
            seq = tp.node_sequence_nr(node)
            if 0 <= seq - lo < len(owner):
                call = owner[seq - lo]
                todo.extend((n, call) for n, _ in node.next_functions if n is not None)
                if known is not None and call >= 0 and known[call]:
                    seen.add(id(node))
                    continue
            elif via >= 0 and tp.is_accumulate_grad(node):
                if known is not None and known[via]:
                    continue
                self._accumulate[id(node)] = via
            else:
                continue  # created before the pass's forward (its inputs' history)
            seen.add(id(node))
            handles.append(node.register_prehook(hook))
        return len(seen)

    def _pre(self, grad_outputs: Any) -> None:
        if self.closed or self.error is not None:
            return
        try:
            node = tp.current_autograd_node()
            index = tp.node_sequence_nr(node) - self._lo
            if 0 <= index < len(self._owner):
                call = self._owner[index]
            else:
                call = self._accumulate.get(id(node), -1)
            task = tp.graph_task_id()
            if task not in self._tasks:
                self._tasks.add(task)
                tp.queue_end_of_backward(self._publish)
                gc_pause.hold(id(self))  # (until `_publish`, as for the pass's forward)
            if call < 0:
                return
            mode = getattr(self._local, "mode", None)
            if mode is None:
                mode = self._local.mode = _Count(self, self.calls)
                self._modes.append(mode)
            mode.call = call
            tp.push_mode_for_this_node(mode)
        except Exception as error:  # never break the user's backward
            self.fail(error)

    def fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error

    def _publish(self) -> None:
        """The end of a counted backward (an engine callback): the counts so far."""
        gc_pause.release(id(self))
        done = self._done
        if self.closed or done is None:
            return
        if self.error is not None:
            self._done = None  # told once
            done([], [], self.error)
            return
        nbytes, ops = [0] * self.calls, [0] * self.calls
        for mode in list(self._modes):
            nbytes = [a + b for a, b in zip(nbytes, mode.bytes, strict=True)]
            ops = [a + b for a, b in zip(ops, mode.ops, strict=True)]
        done(nbytes, ops, None)

    def close(self) -> None:
        """Remove the hooks (AccumulateGrad nodes outlive the step; a graph kept alive would
        hold them, and through them the capture); nothing more is counted."""
        self.closed = True
        self._done = None
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


def with_backward_work(
    structure: Structure, parents: Sequence[int], nbytes: Sequence[int], ops: Sequence[int]
) -> Structure:
    """`structure` with its calls' counted backward: `nbytes[i]` / `ops[i]` of call i's own
    nodes, summed up the tree for the inclusive counts (`parents[i]`: -1 for the root)."""
    inclusive_bytes, inclusive_ops = rolled_up(nbytes, parents), rolled_up(ops, parents)
    calls = tuple(
        dataclasses.replace(
            call,
            bwd_bytes=inclusive_bytes[i],
            bwd_self_bytes=nbytes[i],
            bwd_ops=inclusive_ops[i],
            bwd_self_ops=ops[i],
            bwd_work_known=True,
        )
        for i, call in enumerate(structure.calls)
    )
    return dataclasses.replace(structure, calls=calls)


def count_pass_backward(
    structure: CountedPass,
    stored: Structure | None,
    result: Any,
    store: Callable[[Structure], None],
    warn: Callable[[str, Exception], None],
) -> BackwardWork | None:
    """Count the backward of a structure pass's step where one comes: `store` then gets
    `stored` again with each call's backward bytes and ops (a call the pass did not follow:
    the counts of the pass that did; a partial pass, `stored=None`, stores nothing, and its
    followed calls' counts are learnt). The counter, to be closed at the next forward."""
    roots = [t.grad_fn for t in tensors_in(result) if t.grad_fn is not None]
    if not roots or not tp.counts_backward():
        return None  # evaluation, no_grad: no backward to count
    ranges, parents = structure.call_ranges()
    known = [not f for f in structure.followed_calls()]

    def done(nbytes: list[int], ops: list[int], error: Exception | None) -> None:
        try:  # (an engine callback: an error here would reach the user's backward)
            if error is None:
                counted = structure.with_known_backward(nbytes, ops)  # (learnt)
                if stored is not None:
                    store(
                        with_backward_work(stored, parents, nbytes, ops)
                        if counted
                        else stored  # a call's backward that no pass counted: none shown
                    )
                return
            if stored is not None:
                store(stored)  # no partial counts shown as counted
        except Exception as failed:
            error = failed
        warn("<structure pass backward>", error)

    work = BackwardWork(len(ranges), done)
    try:
        work.attach(roots, owners(ranges, *ranges[0]), ranges[0][0], known)
    except Exception as error:
        work.close()
        warn("<structure pass backward>", error)
        return None
    return work
