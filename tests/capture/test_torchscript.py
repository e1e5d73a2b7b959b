"""TorchScript parts of a watched model (`capture/model/scripted.py`): a scripted or traced
submodule refuses module hooks and runs its own submodules inside the TorchScript interpreter.
It is measured as one call (type "TorchScript <class>"), every other module as usual, nothing
raised or warned, training unchanged; a TorchScript model itself is refused at the boundary."""

from __future__ import annotations

import warnings

import pytest
import torch
import wandb
from torch import nn
from torch.nn.modules import module as module_globals

import wandb_modprof
from wandb_modprof import ModProfError


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class WithScript(nn.Module):
    def __init__(self, traced: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        inner = Inner()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated
            scripted = (
                torch.jit.trace(inner, torch.randn(3, 4)) if traced else torch.jit.script(inner)
            )
        self.s = scripted
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.s(self.a(x)))


def _no_global_hooks() -> bool:
    return not module_globals._global_forward_pre_hooks and not module_globals._global_forward_hooks


@pytest.mark.parametrize("traced", [False, True], ids=["script", "trace"])
def test_a_scripted_submodule_is_one_call_and_the_rest_is_measured(traced: bool) -> None:
    torch.manual_seed(0)
    model, x = WithScript(traced), torch.randn(3, 4)
    twin = WithScript(traced)  # an unwatched twin with the same weights
    twin.load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no internal error, no other warning
        with wandb_modprof.profile(model) as prof:
            for _ in range(2):
                model(x).square().sum().backward()
    for _ in range(2):
        twin(x).square().sum().backward()
    records = {r.key: r for r in prof.invocations()}
    assert list(records) == ["<root>#0", "a#0", "s#0", "b#0"]  # nothing below `s`
    s = records["s#0"]
    assert s.module_type == "TorchScript Inner"
    assert s.fwd_ms > 0 and s.bwd_ms is not None and s.bwd_ms > 0
    assert s.param_bytes == 4 * 4 * 4 + 4 * 4  # its submodule's weight and bias
    structure = prof.structures()[0]
    edges = {(e.src_key, e.dst_key) for e in structure.edges if e.view_key == "<root>#0"}
    assert {("a#0", "s#0"), ("s#0", "b#0")} <= edges
    assert prof.table().rows and "TorchScript Inner" in prof.summary()
    assert _no_global_hooks()  # the global hooks are only there while hooked
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert p.grad is not None and torch.equal(p.grad, q.grad)  # training unchanged


def test_watch_keeps_every_sample_whole_and_no_global_hook_between_samples() -> None:
    model, x = WithScript(), torch.randn(3, 4)
    handle = wandb_modprof.watch(model, log_freq=2, run=wandb.init(mode="disabled"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for step in range(8):
                model(x).sum().backward()
                if step % 2 == 0:  # an unsampled step: no global hook in the process
                    assert _no_global_hooks()
        prof = handle.profile()
        assert prof.num_samples >= 3
        assert [r.key for r in prof.invocations()] == ["<root>#0", "a#0", "s#0", "b#0"]
        assert all(stats.count("fwd_ms") >= 3 for stats in prof.stats().values())
    finally:
        handle.unwatch()
    assert _no_global_hooks()


def test_a_torchscript_model_itself_is_refused_with_what_to_do() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(Inner())
    for call in (
        lambda: wandb_modprof.profile(scripted),
        lambda: wandb_modprof.watch(scripted, run=wandb.init(mode="disabled")),
        lambda: wandb_modprof.on_module(scripted, forward_start=print),
    ):
        with pytest.raises(ModProfError, match=r"TorchScript module .*before torch\.jit\.script"):
            call()
