"""The backward of the structure pass's step, counted: the bytes and ATen ops of each call's
backward, for its efficiency against the roofline (`records/roofline.py`).

The structure pass sees the forward only. When its forward returns, the autograd nodes it
created get a pre- and a post-hook (`attach`): the pre-hook pushes a counting
`TorchDispatchMode` for the call that created the node (the innermost call whose sequence
numbers hold the node's), the post-hook pops it. Every ATen op the node runs is then charged to
that call, as the forward's are: bytes read and written (`work.moved_bytes`), one op, views not
counted. The autograd engine restores the thread's mode stack after each node, so a mode cannot
outlive its node even when the node raises. A parameter's AccumulateGrad node is charged to the
call of the node that fed it (its module's); an activation-checkpointing recompute runs inside
a node of the checkpointed call and counts as that call's backward work, which it is.

The counts are complete at the end of the first backward through these nodes (an engine
callback queued by the first node): `done` receives them and the hooks are removed. A step
whose backward never comes (evaluation, a forward-only pass) is closed at the next forward
(`close`) with nothing counted: its calls keep `bwd_work_known=False`.

The pass's step is never timed, so the hooks and the mode cost nothing that is measured, and
neither holds a tensor: the hooks' closures hold this counter and integers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

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
    """Charges every op run while it is pushed to one call."""

    def __init__(self, work: BackwardWork, call: int) -> None:
        super().__init__()
        self.work = work
        self.call = call

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
        self._handles: list[Any] = []
        self._task: int | None = None  # the graph task of the backward being counted

    def attach(self, roots: Iterable[Any], owner: list[int], lo: int) -> int:
        """Hook the nodes reachable from `roots` (the forward's output nodes) created in
        `[lo, lo + len(owner))`, and the AccumulateGrad nodes they feed; the number hooked."""
        todo = [(node, -1) for node in roots]
        seen: set[int] = set()
        while todo:
            node, via = todo.pop()
            if id(node) in seen:
                continue
            seq = ap.node_sequence_nr(node)
            if 0 <= seq - lo < len(owner):
                call = owner[seq - lo]
                todo.extend((n, call) for n, _ in node.next_functions if n is not None)
            elif via >= 0 and ap.is_accumulate_grad(node):
                call = via
            else:
                continue  # created before the pass's forward (its inputs' history)
            seen.add(id(node))
            if call < 0:
                continue
            self._handles.append(node.register_prehook(self._pre_hook(call)))
            self._handles.append(node.register_hook(self._post_hook))
        return len(seen)

    def _pre_hook(self, call: int) -> Callable[[Any], None]:
        def pre(grad_outputs: Any) -> None:
            if self.closed:
                return
            try:
                task = ap.graph_task_id()
                if self._task is None:
                    self._task = task
                    torch.autograd.Variable._execution_engine.queue_callback(self._finish)
                elif task != self._task:
                    return  # a second backward through the same graph: counted once
                _Count(self, call).__enter__()
            except Exception:
                self.failed = True

        return pre

    def _post_hook(self, grad_inputs: Any, grad_outputs: Any) -> None:
        stack = _get_current_dispatch_mode_stack()
        if stack and isinstance(stack[-1], _Count) and stack[-1].work is self:
            stack[-1].__exit__(None, None, None)

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
        """Remove the hooks (AccumulateGrad nodes outlive the step); nothing more is counted."""
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
