"""The process as the user left it after any exception inside a sampled step or a structure
pass: `KeyboardInterrupt` (raised by code or by a real SIGINT), `SystemExit` and plain errors,
injected at points drawn from a private generator (in the user's forward, in our own hook
code, in the backward), with the process state read right after the `except` block.

The state: the collector, the saved-tensor hooks, torch's dispatch and function modes, the
global module hooks, `gc.callbacks`, the trace and profile functions and SIGINT's handler.
A sampled forward or pass puts it back before the line after the `except` runs (the SIGINT
handler before the interrupt unwinds, `root_hooks.ForwardFrame` when the forward's frame
goes). An exception inside a sampled backward leaves the collector held until the next call
into the package: the autograd engine runs no callback of ours after a node raised (the docs
say so); the tests check that call puts it back.
"""

from __future__ import annotations

import contextlib
import gc
import random
import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers import disabled_run
from torch import nn

import wandb_modprof
from wandb_modprof.capture.session import StepSession


def process_state() -> dict[str, Any]:
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    mm = torch.nn.modules.module
    return {
        "collector": gc.isenabled(),
        "saved-tensor hooks": torch._C._autograd._top_saved_tensors_default_hooks(False),
        "dispatch modes": len(_get_current_dispatch_mode_stack()),
        "function modes": len(_get_current_function_mode_stack()),
        "gc.callbacks": list(gc.callbacks),
        "global module hooks": [
            len(getattr(mm, name))
            for name in dir(mm)
            if name.startswith("_global_") and name.endswith("hooks")
        ],
        "trace": (sys.gettrace(), sys.getprofile()),
        "SIGINT": signal.getsignal(signal.SIGINT),
    }


def changed(before: dict[str, Any]) -> dict[str, Any]:
    now = process_state()
    return {k: (before[k], now[k]) for k in before if before[k] != now[k]}


class Raiser(nn.Module):
    """Raises `what` at its `at`-th forward call, or in the backward through it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.what: str | None = None
        self.where = "forward"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.lin(x).relu()
        what, self.what = self.what, None
        if what is None:
            return y
        if self.where == "forward":
            _raise(what)
        else:

            def in_backward(grad: torch.Tensor) -> None:
                _raise(what)

            y.register_hook(in_backward)
        return y


def _raise(what: str) -> None:
    if what == "SIGINT":
        signal.raise_signal(signal.SIGINT)  # Python's handler runs at the next bytecode
    raise {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}.get(
        what, RuntimeError
    )("injected")


def make_model() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(8, 8), Raiser(), nn.Sequential(nn.Dropout(0.1), Raiser()), nn.Linear(8, 1)
    )


KINDS = ("KeyboardInterrupt", "SIGINT", "SystemExit", "RuntimeError")


@pytest.fixture
def baseline() -> Iterator[dict[str, Any]]:
    assert gc.isenabled()
    before = process_state()
    yield before
    gc.enable()


def _step(model: nn.Module) -> None:
    model(torch.randn(4, 8)).sum().backward()


def _attach(model: nn.Module, how: str) -> Any:
    if how == "watch":  # the first step a structure pass, then every step sampled
        return wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    return wandb_modprof.profile(model)  # a sample, a pass, then samples


@pytest.mark.parametrize("how", ["watch", "profile"])
@pytest.mark.parametrize("kind", KINDS)
def test_an_exception_in_a_sampled_forward_or_pass_leaves_nothing_changed(
    kind: str, how: str, baseline: dict[str, Any]
) -> None:
    picks = random.Random(f"{kind}-{how}")  # (a private generator: the points to inject)
    model = make_model()
    attached = _attach(model, how)
    if how == "profile":
        attached.__enter__()
    try:
        for step in range(6):
            raiser = model[1] if picks.random() < 0.5 else model[2][1]
            raiser.what, raiser.where = kind, "forward"
            with contextlib.suppress(KeyboardInterrupt, SystemExit, RuntimeError):
                _step(model)
            assert changed(baseline) == {}, f"step {step}"
            _step(model)  # a step that completes, between the failed ones
            assert changed(baseline) == {}, f"step {step}, after a good one"
    finally:
        if how == "profile":
            attached.__exit__(None, None, None)
        else:
            attached.unwatch()
    assert changed(baseline) == {}


@pytest.mark.parametrize("kind", KINDS)
def test_an_interrupt_inside_our_own_hook_code_leaves_nothing_changed(
    kind: str, baseline: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C lands wherever the interpreter is: also inside a hook of ours."""
    picks = random.Random(kind)
    model = make_model()
    enter = StepSession.enter
    calls = {"n": 0, "at": -1}

    def enter_or_raise(self: StepSession, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            _raise(kind)
        enter(self, *args, **kwargs)

    monkeypatch.setattr(StepSession, "enter", enter_or_raise)
    with wandb_modprof.profile(model) as prof:
        for _ in range(5):
            calls["n"], calls["at"] = 0, picks.randrange(1, 8)  # root, children, grandchildren
            with contextlib.suppress(KeyboardInterrupt, SystemExit, RuntimeError):
                _step(model)
            assert changed(baseline) == {}, calls
            calls["at"] = -1
            _step(model)
    assert prof.num_samples >= 2
    assert changed(baseline) == {}


@pytest.mark.parametrize("kind", KINDS)
def test_an_exception_in_a_sampled_backward_is_put_right_by_our_next_call(
    kind: str, baseline: dict[str, Any]
) -> None:
    model = make_model()
    other = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    with wandb_modprof.profile(model):
        _step(model)
        model[1].what, model[1].where = kind, "backward"
        with contextlib.suppress(KeyboardInterrupt, SystemExit, RuntimeError):
            _step(model)
        left = changed(baseline)
        if kind == "SIGINT":  # the handler ends the windows before the interrupt unwinds
            assert left == {}
        else:  # the engine called nothing of ours after the node raised: only the collector
            assert set(left) <= {"collector", "gc.callbacks", "SIGINT"}, left
        # the next call into the package (here another model's profile) puts it right
        with wandb_modprof.profile(other) as prof_other:
            assert changed(baseline) == {}
            other(torch.randn(2, 4)).sum().backward()
        assert prof_other.snapshot().last.totals.act_bytes  # it measured its activations
    assert changed(baseline) == {}


def test_another_models_profile_measures_activations_after_an_interrupted_step(
    baseline: dict[str, Any],
) -> None:
    model = make_model()
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    for _ in range(3):
        _step(model)
    model[1].what = "KeyboardInterrupt"
    with contextlib.suppress(KeyboardInterrupt):
        _step(model)
    assert changed(baseline) == {}
    other = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    with wandb_modprof.profile(other) as prof:
        other(torch.randn(2, 4)).sum().backward()
    assert prof.snapshot().last.totals.act_bytes
    handle.unwatch()
    assert changed(baseline) == {}
