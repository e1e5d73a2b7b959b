"""Opt-in NVTX ranges. On CPU the torch.cuda.nvtx functions are replaced by recorders (torch
without CUDA has no NVTX), which checks what is emitted and that it balances; on a GPU the
real functions run."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from conftest import requires_cuda
from helpers import disabled_run
from models import Reused, TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof import ModProfError


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, int]] = []
        self._next = 0

    def range_push(self, msg: str) -> int:
        self.calls.append(("push", msg, threading.get_ident()))
        return 0

    def range_pop(self) -> int:
        self.calls.append(("pop", None, threading.get_ident()))
        return 0

    def range_start(self, msg: str) -> int:
        self._next += 1
        self.calls.append(("start", (msg, self._next), threading.get_ident()))
        return self._next

    def range_end(self, range_id: int) -> None:
        self.calls.append(("end", range_id, threading.get_ident()))


@pytest.fixture
def nvtx(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    for name in ("range_push", "range_pop", "range_start", "range_end"):
        monkeypatch.setattr(torch.cuda.nvtx, name, getattr(rec, name))
    return rec


def _check_balanced(calls: list[tuple[str, Any, int]]) -> list[str]:
    """Push/pop nest per thread; every started range ends once. Returns the push names."""
    depth: dict[int, int] = {}
    started: dict[int, str] = {}
    pushed = []
    for kind, arg, thread in calls:
        if kind == "push":
            depth[thread] = depth.get(thread, 0) + 1
            pushed.append(arg)
        elif kind == "pop":
            depth[thread] -= 1
            assert depth[thread] >= 0
        elif kind == "start":
            started[arg[1]] = arg[0]
        else:
            assert started.pop(arg)  # ends a range that is open, once
    assert all(d == 0 for d in depth.values())
    assert not started
    return pushed


def test_sampled_step_emits_balanced_forward_and_backward_ranges(nvtx: Recorder) -> None:
    model = TinyGPT()
    handle = wandb_modprof.watch(model, log_freq=2, nvtx=True, run=disabled_run())
    nvtx.calls.clear()  # the availability check at watch()
    x = gpt_input(2, 16)
    model(x).sum().backward()  # step 1: structure pass, no ranges
    model(x).sum().backward()  # step 2: sampled
    model(x).sum().backward()  # step 3: unsampled, no ranges
    prof = handle.unwatch()
    pushed = _check_balanced(nvtx.calls)
    # forward: one range per call, in forward order
    assert pushed == [f"{r.module_name}.forward" for r in prof.invocations()]
    started = [arg[0] for kind, arg, _ in nvtx.calls if kind == "start"]
    with_backward = {f"{r.module_name}.backward" for r in prof.invocations() if r.backward_nodes}
    assert set(started) == with_backward
    assert started[0] == "<root>.backward"  # the root's range opens first and holds the rest


def test_reused_module_gets_ranges_per_call(nvtx: Recorder) -> None:
    model = Reused()
    with wandb_modprof.profile(model, nvtx=True, structure=False) as prof:
        model(torch.randn(2, 32)).sum().backward()
    pushed = _check_balanced(nvtx.calls[2:])  # after the availability check
    assert pushed.count("shared.forward") == 3
    started = [arg[0] for kind, arg, _ in nvtx.calls if kind == "start"]
    assert started.count("shared.backward") == 3
    assert prof.num_samples == 1


def test_forward_that_raises_leaves_no_range_open(nvtx: Recorder) -> None:
    from models import RaisingModel

    model = RaisingModel()
    model.boom.armed = True
    with (
        wandb_modprof.profile(model, nvtx=True, structure=False),
        pytest.raises(ValueError, match="boom"),
    ):
        model(torch.randn(2, 16))
    _check_balanced(nvtx.calls)


def test_nvtx_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA: NVTX is available")
    with pytest.raises(ModProfError, match="nvtx=True needs a CUDA build of torch"):
        wandb_modprof.watch(Reused(), nvtx=True, run=disabled_run())
    with pytest.raises(ModProfError, match="nvtx must be True or False"):
        wandb_modprof.watch(Reused(), nvtx="yes", run=disabled_run())


@requires_cuda
def test_real_nvtx_ranges_on_cuda_balance(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any, int]] = []
    names = ("range_push", "range_pop", "range_start", "range_end")
    real = {n: getattr(torch.cuda.nvtx, n) for n in names}

    def wrap(name: str) -> Any:
        def call(*args: Any) -> Any:
            out = real[name](*args)
            kind = name.removeprefix("range_")
            arg = (args[0], out) if kind == "start" else (args[0] if args else None)
            calls.append((kind, arg, threading.get_ident()))
            return out

        return call

    for name in real:
        monkeypatch.setattr(torch.cuda.nvtx, name, wrap(name))
    model = TinyGPT().cuda()
    x = gpt_input(2, 16).cuda()
    with wandb_modprof.profile(model, nvtx=True) as prof:
        for _ in range(2):
            model(x).sum().backward()
    torch.cuda.synchronize()
    pushed = _check_balanced(calls)
    assert pushed[0] == "wandb_modprof"  # the availability check at profile()
    assert pushed.count("<root>.forward") == 1  # the second forward; the first is the pass
    started = {arg[0] for kind, arg, _ in calls if kind == "start"}
    assert started == {f"{r.module_name}.backward" for r in prof.invocations() if r.backward_nodes}
    assert prof.num_samples == 1
