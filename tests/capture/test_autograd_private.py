"""The torch internals the backward measurement depends on still behave as assumed.

If a torch upgrade breaks one of these, this file fails loudly (rather than every profile
silently reading zero backward time).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from wandb_modprof.capture.step import autograd_private as ap


def test_check_passes_on_this_torch():
    ap.check()


def test_sequence_numbers_bracket_the_nodes_created_in_between():
    x = torch.randn(4, 4, requires_grad=True)
    lo = ap.sequence_nr()
    y = torch.tanh(x @ x)
    hi = ap.sequence_nr()
    node = y.grad_fn
    seen = []
    while node is not None and lo <= ap.node_sequence_nr(node) < hi:
        seen.append(type(node).__name__)
        node = node.next_functions[0][0]
    assert seen == ["TanhBackward0", "MmBackward0"]
    assert hi - lo == 2


def test_accumulate_grad_nodes_fall_outside_every_range():
    lin = nn.Linear(2, 2)
    out = lin(torch.randn(1, 2))
    acc = [n for n, _ in out.grad_fn.next_functions if n is not None and ap.is_accumulate_grad(n)]
    assert acc
    assert all(ap.node_sequence_nr(n) > ap.sequence_nr() for n in acc)


def test_in_backward_and_end_of_backward_callback():
    events = []
    x = torch.randn(3, requires_grad=True)
    y = (x * 2).sum()

    def pre(grad_outputs):
        events.append(("in_backward", ap.in_backward()))
        ap.queue_end_of_backward(lambda: events.append(("end", ap.in_backward())))

    y.grad_fn.register_prehook(pre)
    assert not ap.in_backward()
    y.backward()
    assert events[0] == ("in_backward", True)
    assert events[-1][0] == "end"


def test_saved_tensors_hooks_detection():
    assert not ap.saved_tensors_hooks_active()
    with torch.autograd.graph.save_on_cpu():
        assert ap.saved_tensors_hooks_active()
    assert not ap.saved_tensors_hooks_active()


def test_functorch_detection() -> None:
    """Not required by `check()`, but present on the tested versions: without it a
    `torch.func` transform over a watched model would warn an internal error again."""
    from torch.func import vmap

    assert ap._PEEK_FUNCTORCH is not None
    assert not ap.functorch_active()
    seen: list[bool] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        seen.append(ap.functorch_active())
        return x * 2

    vmap(f)(torch.ones(3, 2))
    assert seen == [True]
    assert not ap.functorch_active()


def test_a_mode_pushed_for_a_node_ends_with_the_node():
    """`push_mode_for_this_node` (the structure pass's backward count): the node's ops see the
    mode, the next node and the code after the backward do not, even after a node raised."""
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    assert ap.counts_backward()
    seen: list[tuple[str, str]] = []

    class Note(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append((ap.current_autograd_node().name(), str(func)))
            return func(*args, **(kwargs or {}))

    mode = Note()
    stacks: list[int] = []

    def pre(grad_outputs):  # type: ignore[no-untyped-def]
        stacks.append(len(_get_current_dispatch_mode_stack()))
        if ap.current_autograd_node().name() == "TanhBackward0":
            ap.push_mode_for_this_node(mode)

    x = torch.randn(4, requires_grad=True)
    y = (torch.tanh(x) * 3).sum()
    for node in (y.grad_fn, y.grad_fn.next_functions[0][0], y.grad_fn.next_functions[0][0]
                 .next_functions[0][0]):  # fmt: skip
        node.register_prehook(pre)
    y.backward()
    assert stacks == [0, 0, 0]  # sum, mul, tanh: nothing left over from an earlier node
    assert {name for name, _ in seen} == {"TanhBackward0"} and seen
    assert _get_current_dispatch_mode_stack() == []

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):  # type: ignore[no-untyped-def]
            return a.clone()

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            raise ValueError("boom")

    z = Boom.apply(x).sum()
    z.grad_fn.next_functions[0][0].register_prehook(lambda g: ap.push_mode_for_this_node(mode))
    with pytest.raises(ValueError, match="boom"):
        z.backward()
    assert _get_current_dispatch_mode_stack() == []
