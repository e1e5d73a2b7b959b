"""The backward of the structure pass's step, counted: the bytes and ATen ops of each call's
backward, for its efficiency against the roofline (`records/roofline.py`).

The structure pass sees the forward only. When its forward returns, the autograd nodes it
created get a pre-hook (`attach`) that pushes a counting `TorchDispatchMode` for the call that
created the node (the innermost call whose sequence numbers hold the node's). Every ATen op
the node runs is then charged to that call, as the forward's are: bytes read and written
(`work.moved_bytes`), one op, views not counted. The autograd engine restores the thread's
mode stack after each node, so the mode ends with its node, even one that raises
(`autograd_private.push_mode_for_this_node`). A parameter's AccumulateGrad node is charged to the
call of the node that fed it (its module's); an activation-checkpointing recompute runs inside
a node of the checkpointed call and counts as that call's backward work, which it is.

The counts are complete at the end of the first backward through these nodes (an engine
callback queued by the first node): `done` receives them, and the hooks turn into no-ops
(those of the AccumulateGrad nodes, which outlive the graph, are removed). A step
whose backward never comes (evaluation, a forward-only pass) is closed at the next forward
(`close`) with nothing counted: its calls keep `bwd_work_known=False`.

The pass's step is never timed, so the hooks and the mode cost nothing that is measured, and
neither holds a tensor: the hook holds this counter, which holds integers.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from wandb_modprof.capture.step import autograd_private as ap
from wandb_modprof.capture.structure.work import is_view, moved_bytes
from wandb_modprof.records.calls import Structure

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
Done = Callable[[list[int], list[int]], None]


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
    """Charges every op run while it is pushed to `call` (one per thread: the engine may run
    nodes on several device threads at once)."""

    def __init__(self, work: BackwardWork) -> None:
        super().__init__()
        self.work = work
        self.call = -1

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if any(t not in _PLAIN_TYPES for t in types):
            return NotImplemented  # tensor subclasses unwrap first; we see their plain ops
        out = func(*args, **kwargs)
        if is_view(func) or isinstance(func, torch._ops.HigherOrderOperator):
            return out
        try:
            self.work.add(self.call, moved_bytes(args, kwargs, out))
        except Exception:
            self.work.failed = True
        return out


class BackwardWork:
    """The counted backward of one structure pass's calls (see the module docstring)."""

    def __init__(self, calls: int, done: Done) -> None:
        self.bytes = [0] * calls  # of the call's own nodes (children's are theirs)
        self.ops = [0] * calls
        self.failed = False
        self.closed = False
        self._done = done
        self._owner: list[int] = []
        self._lo = 0
        self._accumulate: dict[int, int] = {}  # id of an AccumulateGrad node -> its call
        self._handles: list[Any] = []  # of the AccumulateGrad nodes (they outlive the graph)
        self._task: int | None = None  # the graph task of the backward being counted
        self._modes = threading.local()

    def attach(self, roots: Iterable[Any], owner: list[int], lo: int) -> int:
        """Hook the nodes reachable from `roots` (the forward's output nodes) created in
        `[lo, lo + len(owner))` (`owner`: the call of each), and the AccumulateGrad nodes they
        feed; the number hooked. One pre-hook, the same function on every node: registering
        is most of the cost (tens of thousands of nodes in a large model)."""
        self._owner, self._lo = owner, lo
        todo = [(node, -1) for node in roots]
        seen: set[int] = set()
        hook = self._pre
        while todo:
            node, via = todo.pop()
            if id(node) in seen:
                continue
            seq = ap.node_sequence_nr(node)
            if 0 <= seq - lo < len(owner):
                seen.add(id(node))
                node.register_prehook(hook)  # (the graph's nodes die with it: no handle kept)
                call = owner[seq - lo]
                todo.extend((n, call) for n, _ in node.next_functions if n is not None)
            elif via >= 0 and ap.is_accumulate_grad(node):
                seen.add(id(node))
                self._accumulate[id(node)] = via
                self._handles.append(node.register_prehook(hook))
        return len(seen)

    def _pre(self, grad_outputs: Any) -> None:
        if self.closed:
            return
        try:
            node = ap.current_autograd_node()
            index = ap.node_sequence_nr(node) - self._lo
            if 0 <= index < len(self._owner):
                call = self._owner[index]
            else:
                call = self._accumulate.get(id(node), -1)
            task = ap.graph_task_id()
            if self._task != task:
                if self._task is not None:
                    return  # a second backward through the same graph: counted once
                self._task = task
                ap.queue_end_of_backward(self._finish)
            if call < 0:
                return
            mode = getattr(self._modes, "mode", None)
            if mode is None:
                mode = self._modes.mode = _Count(self)
            mode.call = call
            ap.push_mode_for_this_node(mode)
        except Exception:
            self.failed = True

    def add(self, call: int, nbytes: int) -> None:
        self.bytes[call] += nbytes
        self.ops[call] += 1

    def _finish(self) -> None:
        """The end of the counted backward (an engine callback)."""
        if self.closed:
            return
        self.close()
        if not self.failed:
            self._done(self.bytes, self.ops)

    def close(self) -> None:
        """Remove the AccumulateGrad nodes' hooks (they outlive the step; the graph's nodes
        go with it, their hook a no-op from now on); nothing more is counted."""
        self.closed = True
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


def with_backward_work(
    structure: Structure, parents: Sequence[int], nbytes: Sequence[int], ops: Sequence[int]
) -> Structure:
    """`structure` with its calls' counted backward: `nbytes[i]` / `ops[i]` of call i's own
    nodes, summed up the tree for the inclusive counts (`parents[i]`: -1 for the root)."""
    inclusive_bytes, inclusive_ops = list(nbytes), list(ops)
    for i in range(len(parents) - 1, 0, -1):  # children come after their parent
        inclusive_bytes[parents[i]] += inclusive_bytes[i]
        inclusive_ops[parents[i]] += inclusive_ops[i]
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
