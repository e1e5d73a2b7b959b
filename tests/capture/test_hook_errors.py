"""Training never breaks: user exceptions and internal errors inside our hooks drop one sample,
warn once, and leave the next step measured; warnings-as-errors never crash training.
"""

from __future__ import annotations

import copy
import logging
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import (
    Probed,
    RecordingRun,
    by_key,
    disabled_run,
    hook_counts,
    no_hooks,
    ours,
    recorded_warnings,
    root_only,
    train_step,
)
from models import RaisingModel, TinyGPT
from torch import nn

import wandb_modprof
from wandb_modprof.capture.root_hooks import under_transform_text
from wandb_modprof.capture.step import torch_private as tp

pytestmark = pytest.mark.usefixtures("isolate_saved_tensor_hooks")


def test_warnings_as_errors_never_crash_training(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    reference = TinyGPT()
    reference.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 64, (2, 16))
    run = RecordingRun(fail=True)  # every log raises, like a finished run or a full disk
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="wandb_modprof"):
        warnings.simplefilter("error")  # python -W error / pytest filterwarnings = error
        handle = wandb_modprof.watch(model, log_freq=1, run=run)
        for _ in range(4):
            out = model(tokens).sum()
            out.backward()
            expected = reference(tokens).sum()
            expected.backward()
            assert torch.equal(out, expected)
        handle.unwatch()
    assert run.calls  # logging was attempted and failed
    assert any("could not log modprof/TinyGPT" in r.getMessage() for r in caplog.records)


ROOT = "<root>"


# ---- exceptions raised by the user's forward ----------------------------------------------------
@pytest.mark.parametrize("how", ["watch", "profile"])
def test_exception_in_forward_propagates_and_next_step_is_measured(how):
    model = RaisingModel()
    x = torch.randn(4, 16)
    if how == "watch":
        handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
        prof = handle.profile()
        block = None
    else:
        block = wandb_modprof.profile(model, structure=False)
        prof = block.__enter__()
    try:
        train_step(model, x)
        assert prof.num_samples == 1
        model.boom.armed = True
        with recorded_warnings() as caught, pytest.raises(ValueError) as excinfo:
            train_step(model, x)
        # The user's exception, unchanged: same type, same args, raised from their code.
        assert type(excinfo.value) is ValueError and excinfo.value.args == ("boom",)
        assert excinfo.traceback[-1].name == "forward"
        assert str(excinfo.traceback[-1].path).endswith("models.py")
        assert ours(caught) == []  # it is the user's error, not ours: no warning
        assert prof.num_samples == 1  # the failed step's sample is dropped
        assert not tp.saved_tensors_hooks_active()  # our saved-tensor hooks were popped
        if how == "watch":
            assert hook_counts(model) == root_only(model)

        model.boom.armed = False
        model.zero_grad(set_to_none=True)
        train_step(model, x)
        assert prof.num_samples == 2
        keys = by_key(prof.invocations())
        # Call indices restart: the failed step left no half-open invocation behind.
        assert set(keys) == {"<root>#0", "lin#0", "boom#0", "out#0"}
        assert keys["lin#0"].bwd_ms > 0 and keys["out#0"].bwd_ms > 0
        assert keys["lin#0"].grad_norm is not None and keys["lin#0"].grad_norm > 0
        assert keys["<root>#0"].act_bytes is not None and keys["<root>#0"].act_bytes > 0
    finally:
        if block is not None:
            block.__exit__(None, None, None)
    if how == "profile":
        assert hook_counts(model) == no_hooks(model)


def test_exception_in_root_forward_after_children_ran():
    class RaisesLate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.fail = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            if self.fail:
                raise KeyError("late")
            return y

    model = RaisesLate()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    model.fail = True
    with recorded_warnings() as caught, pytest.raises(KeyError, match="late"):
        train_step(model, torch.randn(2, 8))
    assert ours(caught) == []
    assert hook_counts(model) == root_only(model)
    assert not tp.saved_tensors_hooks_active()
    model.fail = False
    train_step(model, torch.randn(2, 8))
    assert handle.profile().num_samples == 1
    assert set(by_key(handle.profile().invocations())) == {"<root>#0", "lin#0"}


# ---- internal errors inside our hooks --------------------------------------------------------
class Trigger:
    """Makes a wrapped package function raise, once or always, where a condition holds."""

    def __init__(self, once: bool) -> None:
        self.once = once
        self.armed = False
        self.fired = 0

    def wrap(
        self, real: Callable[..., Any], when: Callable[[Any], bool] = lambda frame: True
    ) -> Callable[..., Any]:
        def patched(*args: Any, **kwargs: Any) -> Any:
            if self.armed and when(sys._getframe(1)):
                self.fired += 1
                if self.once:
                    self.armed = False
                raise RuntimeError("injected failure")
            return real(*args, **kwargs)

        return patched


def _caller_is(name: str, stack_len: Callable[[int], bool] | None = None) -> Callable[[Any], bool]:
    def when(frame: Any) -> bool:
        if frame.f_code.co_name != name:
            return False
        if stack_len is None:
            return True
        return stack_len(len(frame.f_locals["self"]._stack))

    return when


def _inject(where: str, trigger: Trigger, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb_modprof.capture.memory.activations as activations_mod
    import wandb_modprof.capture.session_hooks as capture_mod
    import wandb_modprof.capture.step.clock as clock_mod

    if where == "root_enter":  # first read of the sequence counter, the root's pre-hook
        monkeypatch.setattr(
            tp, "sequence_nr", trigger.wrap(tp.sequence_nr, _caller_is("enter", lambda n: n == 1))
        )
    elif where == "child_exit":  # a submodule's post-hook in the middle of the forward
        monkeypatch.setattr(
            tp, "sequence_nr", trigger.wrap(tp.sequence_nr, _caller_is("exit", lambda n: n >= 1))
        )
    elif where == "root_exit":  # the root's post-hook, the last forward hook of the step
        monkeypatch.setattr(
            tp, "sequence_nr", trigger.wrap(tp.sequence_nr, _caller_is("exit", lambda n: n == 0))
        )
    elif where == "saved_tensor_pack":
        monkeypatch.setattr(activations_mod, "storages", trigger.wrap(activations_mod.storages))
    elif where == "backward_start":  # the first backward node's pre-hook
        monkeypatch.setattr(tp, "queue_end_of_backward", trigger.wrap(tp.queue_end_of_backward))
    elif where == "backward_node":  # a backward node's post-hook
        monkeypatch.setattr(
            clock_mod.CpuClock,
            "stamp",
            trigger.wrap(clock_mod.CpuClock.stamp, _caller_is("_node_post")),
        )
    elif where == "end_of_backward":  # the engine's end-of-backward callback (`finish`)
        monkeypatch.setattr(
            clock_mod.CpuClock,
            "stamp",
            trigger.wrap(clock_mod.CpuClock.stamp, _caller_is("stamp_end")),
        )
    elif where == "gradient_state":  # reading gradients once the backward has finished
        monkeypatch.setattr(capture_mod, "gradient_state", trigger.wrap(capture_mod.gradient_state))
    else:
        raise AssertionError(where)


INJECTION_POINTS = [
    "root_enter",
    "child_exit",
    "root_exit",
    "saved_tensor_pack",
    "backward_start",
    "backward_node",
    "end_of_backward",
    "gradient_state",
]


def _reference_run(
    model: nn.Module, xs: list[torch.Tensor]
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    out = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in xs:
        loss = train_step(model, x)
        out.append((loss, [p.grad.clone() for p in model.parameters()]))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return out


def _assert_internal_warning(caught: list[warnings.WarningMessage]) -> None:
    mine = ours(caught)
    assert len(mine) == 1, [str(w.message) for w in mine]
    assert mine[0].category is RuntimeWarning
    assert str(mine[0].message).startswith("wandb_modprof: internal error")
    assert "injected failure" in str(mine[0].message)


@pytest.mark.parametrize("where", INJECTION_POINTS)
def test_internal_error_once_drops_that_sample_only(where, monkeypatch):
    base = Probed()
    xs = [torch.randn(8, 16) for _ in range(4)]
    expected = _reference_run(copy.deepcopy(base), xs)

    model = copy.deepcopy(base)
    model.probe.root_ref = weakref.ref(model)
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trigger = Trigger(once=True)
    _inject(where, trigger, monkeypatch)
    trigger.armed = True
    with recorded_warnings() as caught:
        for i, x in enumerate(xs):
            loss = train_step(model, x)  # must not raise
            assert torch.equal(loss, expected[i][0])
            for g, ref in zip([p.grad for p in model.parameters()], expected[i][1], strict=True):
                assert torch.equal(g, ref)
            opt.step()
            opt.zero_grad(set_to_none=True)
            assert not tp.saved_tensors_hooks_active(), (
                f"saved-tensor hooks left pushed after step {i + 1}"
            )
            assert hook_counts(model) == root_only(model), f"hooks left after step {i + 1}"
            if i == 0:
                assert trigger.fired == 1
                assert handle.profile().num_samples == 0  # the failed sample is dropped
    _assert_internal_warning(caught)
    prof = handle.profile()
    assert prof.num_samples == 3  # every later step is measured
    keys = by_key(prof.invocations())
    assert set(keys) == {"<root>#0", "lin#0", "act#0", "probe#0", "out#0"}
    assert keys["lin#0"].bwd_ms > 0 and keys["out#0"].bwd_ms > 0
    assert keys["act#0"].act_bytes == 8 * 16 * 4  # activations measured again
    assert keys["lin#0"].grad_norm is not None


@pytest.mark.parametrize("where", ["every_sequence_read", "backward_start", "gradient_state"])
def test_internal_error_that_keeps_raising_warns_once(where, monkeypatch):
    base = Probed()
    xs = [torch.randn(8, 16) for _ in range(6)]
    expected = _reference_run(copy.deepcopy(base), xs)

    model = copy.deepcopy(base)
    model.probe.root_ref = weakref.ref(model)
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trigger = Trigger(once=False)
    with monkeypatch.context() as patch:
        if where == "every_sequence_read":
            # The brief's case: the private autograd counter itself breaks.
            patch.setattr(tp, "sequence_nr", trigger.wrap(tp.sequence_nr))
        else:
            _inject(where, trigger, patch)
        trigger.armed = True
        with recorded_warnings() as caught:
            for i, x in enumerate(xs[:4]):
                loss = train_step(model, x)
                assert torch.equal(loss, expected[i][0])
                for g, ref in zip(
                    [p.grad for p in model.parameters()], expected[i][1], strict=True
                ):
                    assert torch.equal(g, ref)
                opt.step()
                opt.zero_grad(set_to_none=True)
        assert trigger.fired >= 4  # it really raised on every sampled step
        _assert_internal_warning(caught)
        assert handle.profile().num_samples == 0
        assert not tp.saved_tensors_hooks_active()
    # Patch removed: later samples work, without further warnings.
    with recorded_warnings() as caught:
        for i, x in enumerate(xs[4:], start=4):
            loss = train_step(model, x)
            assert torch.equal(loss, expected[i][0])
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert ours(caught) == []
    prof = handle.profile()
    assert prof.num_samples == 2
    keys = by_key(prof.invocations())
    assert keys["lin#0"].bwd_ms > 0 and keys["out#0"].bwd_ms > 0
    assert hook_counts(model) == root_only(model)


@pytest.mark.parametrize("how", ["watch", "profile"])
def test_functorch_transforms_pass_through_with_one_warning_and_are_not_sampled(how: str) -> None:
    """`vmap(grad(functional_call(model, ...)))` (per-sample gradients) runs the forward on
    functorch wrapper tensors without storage: it used to warn "internal error ... Cannot access
    data pointer of Tensor that doesn't have storage". Now such a step is passed through
    unmeasured, results bitwise unchanged, and the ordinary steps after it are measured; the
    first one says so, once, at the user's line (`capture/model/transforms.py`)."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(model, p, (x.unsqueeze(0),))
        return out.pow(2).sum()

    x = torch.randn(5, 4)
    per_sample = vmap(grad(loss), in_dims=(None, 0))
    expected = per_sample(params, x)
    with recorded_warnings() as caught:
        if how == "watch":
            handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
            got = [per_sample(params, x) for _ in range(3)]
            for _ in range(3):
                train_step(model, x)
            prof = handle.unwatch()
            assert handle.steps == 6  # counted as steps, never sampled
        else:
            with wandb_modprof.profile(model) as prof:
                got = [per_sample(params, x) for _ in range(3)]
                for _ in range(3):
                    train_step(model, x)
    warned = ours(caught)
    assert [str(w.message) for w in warned] == [under_transform_text("Sequential")]
    assert warned[0].filename == __file__
    for out in got:
        assert all(torch.equal(out[k], expected[k]) for k in expected)
    # the structure pass waited for an ordinary step; the ones after it are measured
    assert {r.key for r in prof.invocations()} == {"<root>#0", "0#0", "1#0", "2#0"}
    assert prof.structures()  # the graph came from an ordinary step
    assert prof.stats()["0#0"].metrics["fwd_ms"].count == 2
    assert no_hooks(model) == hook_counts(model)
