"""The structure pass's counted backward (`capture/structure/backward_work.py`): bytes and ops
of each call's backward, equal to what its backward kernels read and write by construction; the
backward's efficiency class of calls whose class is known; and no counting anywhere else (no
mode of ours in a timed backward, none left behind by a pass whose backward never came)."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.checkpoint import checkpoint

import wandb_modprof
from wandb_modprof.capture.structure.backward_work import owners
from wandb_modprof.records.calls import CallInfo

F32 = 4


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)  # no gradient to accumulate into: AccumulateGrad copies 0
    model(x).sum().backward()


def _calls(model: nn.Module, x: torch.Tensor, steps: int = 3) -> dict[str, CallInfo]:
    _step(model, x)  # not the process's first step of this model
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):  # the second is the structure pass
            _step(model, x)
    (structure,) = prof.structures()
    return {c.key: c for c in structure.calls}


def test_the_backward_bytes_are_what_its_kernels_read_and_write():
    """A Linear whose input needs no gradient runs two kernels in its backward: the weight's
    gradient (x^T @ g) and the bias's (a sum of g); a ReLU one (threshold_backward: g and its
    output read, the gradient written). Views (`t`, `view`, AccumulateGrad's detach) move
    nothing and are not counted."""
    batch, n_in, n_out = 64, 256, 512
    model = nn.Sequential(nn.Linear(n_in, n_out), nn.ReLU())
    calls = _calls(model, torch.randn(batch, n_in))
    g = batch * n_out * F32
    linear = (batch * n_in * F32 + g + n_in * n_out * F32) + (g + n_out * F32)
    relu = 3 * g
    assert (calls["0#0"].bwd_bytes, calls["0#0"].bwd_ops) == (linear, 2)
    assert (calls["1#0"].bwd_bytes, calls["1#0"].bwd_ops) == (relu, 1)
    root = calls["<root>#0"]
    assert root.bwd_self_bytes == root.bwd_self_ops == 0  # the loss's `sum` is outside it
    assert (root.bwd_bytes, root.bwd_ops) == (linear + relu, 3)
    assert all(c.bwd_work_known for c in calls.values())


def test_accumulating_into_an_existing_gradient_is_the_parameters_modules_work():
    """Without `zero_grad`, AccumulateGrad adds in place (grad and new gradient read, grad
    written): charged to the Linear that owns the parameters."""
    model = nn.Linear(32, 16)
    x = torch.randn(8, 32)
    model(x).sum().backward()
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(x).sum().backward()
    (structure,) = prof.structures()
    (call,) = structure.calls
    g = 8 * 16 * F32
    kernels = (8 * 32 * F32 + g + 32 * 16 * F32) + (g + 16 * F32)
    accumulate = 3 * (32 * 16 + 16) * F32
    assert (call.bwd_bytes, call.bwd_ops) == (kernels + accumulate, 4)


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.b(h) + h


def test_gradients_that_meet_are_summed_by_the_node_whose_gradient_arrives_second():
    """`h` feeds `b` and the skip: the engine adds the two gradients of `h` (one read, one
    read, the sum written) when the second arrives: after `b`'s node (the skip's `add`
    backward, created last, runs first and passes its gradient on without a kernel)."""
    calls = _calls(_Residual(), torch.randn(8, 16))
    g, w = 8 * 32 * F32, 32 * 32 * F32
    weight_and_bias = lambda n_in: (g + 8 * n_in * F32 + n_in * 32 * F32) + (g + 32 * F32)  # noqa: E731
    into_h = g + w + g  # g @ W: the gradient of b's input
    assert (calls["a#0"].bwd_bytes, calls["a#0"].bwd_ops) == (weight_and_bias(16), 2)
    assert (calls["b#0"].bwd_bytes, calls["b#0"].bwd_ops) == (
        weight_and_bias(32) + into_h + 3 * g,
        4,
    )
    assert calls["<root>#0"].bwd_self_ops == 0


class _Checkpointed(nn.Module):
    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reentrant is None:
            return self.block(x)
        return checkpoint(self.block, x, use_reentrant=self.reentrant)


def test_a_checkpoint_recompute_is_counted_as_backward_work():
    """Activation checkpointing reruns the block's forward inside the backward: counted as
    backward work. Reentrant: the whole forward again, in the checkpoint's node (created by
    the root's code: the root's). Non-reentrant: up to the last tensor the backward needs
    (the last Linear's output is saved by nothing: its addmm is not rerun), where a saved
    tensor is first unpacked (in the last Linear's node)."""
    x = torch.randn(16, 64, requires_grad=True)
    plain = _calls(_Checkpointed(None), x)
    block = plain["block#0"]
    assert (plain["<root>#0"].bwd_ops, block.fwd_ops) == (block.bwd_ops, 3)
    reentrant = _calls(_Checkpointed(True), x)["<root>#0"]
    assert reentrant.bwd_ops == block.bwd_ops + block.fwd_ops
    assert reentrant.bwd_bytes == block.bwd_bytes + block.fwd_bytes
    again = _calls(_Checkpointed(False), x)
    assert again["<root>#0"].bwd_ops == block.bwd_ops + 2
    assert again["block.2#0"].bwd_ops == plain["block.2#0"].bwd_ops + 2


class _Probe(torch.autograd.Function):
    """Identity whose backward notes the dispatch modes active while it runs."""

    seen: ClassVar[list[int]] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        _Probe.seen.append(len(_get_current_dispatch_mode_stack()))
        return g


class _Probed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(_Probe.apply(x))


def test_only_the_structure_steps_backward_is_counted():
    """Our counting mode is pushed in the structure pass's backward only: never in a timed or
    unsampled step's, and not after a pass whose backward never came (its hooks, AccumulateGrad
    ones included, are gone at the next forward)."""
    model, x = _Probed(), torch.randn(4, 8, requires_grad=True)
    _Probe.seen.clear()
    with wandb_modprof.profile(model) as prof:
        for _ in range(4):
            model(x).sum().backward()
    assert _Probe.seen == [0, 1, 0, 0]  # the second step is the structure pass
    assert all(c.bwd_work_known for c in prof.structures()[0].calls)

    _Probe.seen.clear()
    model = _Probed()
    with wandb_modprof.profile(model) as prof:
        model(x).sum().backward()
        model(x)  # the structure pass: its backward never comes
        for _ in range(3):
            model(x).sum().backward()
    assert _Probe.seen == [0, 0, 0, 0]
    (structure,) = prof.structures()
    assert not any(c.bwd_work_known for c in structure.calls)
    assert all(c.work_known for c in structure.calls)  # the forward's counts stay
    values = wandb_modprof.sinks.text.values.mode_values(prof, "eff_bwd")
    assert all(v.value is None for v in values.modules)  # no backward efficiency shown


def test_an_evaluation_pass_has_no_backward_to_count():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    with torch.no_grad(), wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(torch.randn(2, 8))
    (structure,) = prof.structures()
    assert not any(c.bwd_work_known for c in structure.calls)


class _Known(nn.Module):
    """A backward of each class by construction: a 512 x 1024 @ 1024 x 1024 matmul whose
    input and weight both need gradients (two GEMMs: compute-bound), a ReLU over 32 MiB
    (memory-bound), 200 ops on 4 numbers (overhead-bound)."""

    def __init__(self) -> None:
        super().__init__()
        self.matmul = nn.Linear(1024, 1024, bias=False)
        self.relu = nn.ReLU()
        self.tiny = _Tiny()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = self.relu(torch.ones(8 << 20, requires_grad=True) * x.mean())
        return self.matmul(x).sum() + big.sum() + self.tiny(x[:1, :4]).sum()


class _Tiny(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(100):
            x = x * 1.0001 + 0.0001
        return x


def test_the_backward_class_of_calls_whose_class_is_known():
    x = torch.randn(512, 1024, requires_grad=True)
    model = _Known()
    model(x).sum().backward()
    with wandb_modprof.profile(model) as prof:
        for _ in range(4):
            model(x).sum().backward()
    values = wandb_modprof.sinks.text.values.mode_values(prof, "eff_bwd")
    bound = {v.key: v.bound for v in values.modules}
    assert bound == {"matmul#0": "compute", "relu#0": "memory", "tiny#0": "overhead"}, bound
    assert all(v.value is not None and v.value > 0 for v in values.modules)
    assert [v.key for v in values.ranked()] == sorted(
        bound, key=lambda k: -next(v.rank for v in values.modules if v.key == k)
    )


def test_each_node_is_charged_to_the_innermost_call_holding_its_sequence_number():
    # root [10, 20) with a child [12, 15) and its child [13, 14), then a sibling [16, 18)
    found = owners([(10, 20), (12, 15), (13, 14), (16, 18)], 10, 20)
    assert found == [0, 0, 1, 2, 1, 0, 3, 3, 0, 0]
    assert owners([(5, 8)], 6, 6) == []


class _CondBackward(torch.autograd.Function):
    """A backward that runs a higher-order operator (as some libraries' kernels do)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return torch.cond(g.sum() > 0, lambda t: t * 2, lambda t: t * 2, (g,))


class _WithCond(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _CondBackward.apply(self.lin(x))


def test_a_higher_order_operator_in_the_backward_runs_and_its_ops_count():
    model, x = _WithCond(), torch.randn(4, 8)
    twin = _WithCond()
    twin.load_state_dict(model.state_dict())
    calls = _calls(model, x)
    _step(twin, x), _step(twin, x), _step(twin, x), _step(twin, x)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert a.grad is not None and torch.equal(a.grad, b.grad)
    root = calls["<root>#0"]
    # the Function's node is the root's: its `sum` and `gt` count; the branch's `mul` runs
    # inside the higher-order operator, unseen (as in the forward's count)
    assert root.bwd_work_known and root.bwd_self_ops == 2


def test_every_backward_of_the_step_is_counted_a_gradient_penalty_too():
    """`torch.autograd.grad(..., create_graph=True)` before `loss.backward()`: both are the
    step's backward work (summed), not the first alone."""

    def penalised(model: nn.Module, x: torch.Tensor) -> None:
        model.zero_grad(set_to_none=True)
        out = model(x)
        (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        (out.sum() + g.pow(2).sum()).backward()

    x = torch.randn(8, 32, requires_grad=True)
    counts = {}
    for name, step in (("plain", _step), ("penalty", penalised)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
        step(model, x)
        with wandb_modprof.profile(model) as prof:
            for _ in range(3):
                step(model, x)
        (structure,) = prof.structures()
        counts[name] = {c.key: c.bwd_ops for c in structure.calls if c.bwd_work_known}
    assert set(counts["penalty"]) == set(counts["plain"]) == {"<root>#0", "0#0", "1#0", "2#0"}
    # the first backward runs each call's input-gradient kernels; the second all of them,
    # and through the first one's graph (the double backward of Tanh and both Linears)
    for key, ops in counts["plain"].items():
        assert counts["penalty"][key] > ops, (key, counts)


def test_a_sparse_gradient_is_counted():
    """`Embedding(sparse=True)`: its gradient is a sparse tensor, which `nbytes` refuses; it
    is sized by its values and indices (20 rows of 8 floats, 20 int64 indices: 800 bytes)."""
    model = nn.Embedding(100, 8, sparse=True)
    tokens = torch.randint(0, 100, (4, 5), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an internal error would warn
        (call,) = _calls(model, tokens).values()
    assert call.bwd_work_known and call.bwd_ops >= 1
    assert call.bwd_bytes >= 2 * (20 * 8 * F32 + 20 * 8)  # the gradient written and read


def test_a_count_that_fails_warns_once_and_shows_no_backward_counts(monkeypatch):
    """An op the counter cannot size: the capture warns once, the graph keeps the forward's
    counts only, and the backward's gradients are the unobserved model's."""
    from wandb_modprof.capture.structure import backward_work

    def refuse(*args: object) -> int:
        raise RuntimeError("cannot size this")

    monkeypatch.setattr(backward_work, "moved_bytes", refuse)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    twin = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    twin.load_state_dict(model.state_dict())
    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="<structure pass backward>.*cannot size this"):
        calls = _calls(model, x)
    _step(twin, x), _step(twin, x), _step(twin, x), _step(twin, x)
    assert not any(c.bwd_work_known for c in calls.values())
    assert all(c.work_known for c in calls.values())
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
