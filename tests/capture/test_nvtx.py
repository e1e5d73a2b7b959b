"""Opt-in NVTX ranges. Most tests replace the torch.cuda.nvtx functions by recorders (a CPU-only
torch has no NVTX), which checks what is emitted and that it balances; on a CUDA build of torch,
with or without a GPU, the real functions run too."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from helpers import disabled_run
from models import Reused, TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.capture.backward.nvtx import check_available

# NVTX ships with the CUDA (and ROCm) builds of torch and needs no GPU.
CPU_ONLY_BUILD = torch.version.cuda is None and getattr(torch.version, "hip", None) is None


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
    handle = wandb_modprof.watch(
        model, log_freq=2, settings=wandb_modprof.Settings(nvtx=True), run=disabled_run()
    )
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
    with wandb_modprof.profile(
        model, settings=wandb_modprof.Settings(nvtx=True), structure=False
    ) as prof:
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
        wandb_modprof.profile(model, settings=wandb_modprof.Settings(nvtx=True), structure=False),
        pytest.raises(ValueError, match="boom"),
    ):
        model(torch.randn(2, 16))
    _check_balanced(nvtx.calls)


def test_nvtx_check_follows_the_build() -> None:
    """A CPU-only torch fails at watch() naming what is missing; a CUDA build, even on a
    machine without a GPU, has NVTX, so watch() succeeds."""
    if CPU_ONLY_BUILD:
        with pytest.raises(ModProfError, match="is a CPU-only build, which has no NVTX"):
            wandb_modprof.watch(
                Reused(), settings=wandb_modprof.Settings(nvtx=True), run=disabled_run()
            )
    else:
        wandb_modprof.watch(
            Reused(), settings=wandb_modprof.Settings(nvtx=True), run=disabled_run()
        ).unwatch()
    with pytest.raises(ModProfError, match="nvtx must be True or False"):
        wandb_modprof.watch(
            Reused(), settings=wandb_modprof.Settings(nvtx="yes"), run=disabled_run()
        )


@pytest.mark.parametrize(
    ("cuda", "hip", "gpu", "expected"),
    [
        (None, None, False, r"torch \S+ is a CPU-only build, which has no NVTX: not installed$"),
        (
            "12.8",
            None,
            False,
            r"is a CUDA 12\.8 build but its NVTX calls fail \(no GPU is visible\)",
        ),
        ("12.8", None, True, r"is a CUDA 12\.8 build but its NVTX calls fail \(a GPU is visible\)"),
        (None, "6.4", False, r"is a ROCm 6\.4 build but its NVTX calls fail"),
    ],
)
def test_nvtx_error_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, cuda: str | None, hip: str | None, gpu: bool, expected: str
) -> None:
    def broken(msg: str) -> int:
        raise RuntimeError("not installed")

    monkeypatch.setattr(torch.cuda.nvtx, "range_push", broken)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    with pytest.raises(ModProfError, match=expected):
        check_available()


@pytest.mark.skipif(CPU_ONLY_BUILD, reason="a CPU-only torch has no NVTX")
def test_real_nvtx_ranges_balance(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real torch.cuda.nvtx functions (wrapped to record): on the GPU where there is one,
    else on CPU (a CUDA build without a GPU).

    While no tool (Nsight) is attached, NVTX gives every `range_start` the id 0, so the wrapper
    hands out its own ids, one per range, and ends the real range by the id NVTX gave."""
    calls: list[tuple[str, Any, int]] = []
    names = ("range_push", "range_pop", "range_start", "range_end")
    real = {n: getattr(torch.cuda.nvtx, n) for n in names}
    real_ids: dict[int, int] = {}  # our id -> the id NVTX returned

    def wrap(name: str) -> Any:
        def call(*args: Any) -> Any:
            kind = name.removeprefix("range_")
            if kind == "start":
                ours = len(real_ids) + 1
                real_ids[ours] = real[name](*args)
                calls.append((kind, (args[0], ours), threading.get_ident()))
                return ours
            out = real[name](real_ids[args[0]]) if kind == "end" else real[name](*args)
            calls.append((kind, args[0] if args else None, threading.get_ident()))
            return out

        return call

    for name in real:
        monkeypatch.setattr(torch.cuda.nvtx, name, wrap(name))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = TinyGPT().to(device)
    x = gpt_input(2, 16).to(device)
    with wandb_modprof.profile(model, settings=wandb_modprof.Settings(nvtx=True)) as prof:
        for _ in range(2):
            model(x).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    pushed = _check_balanced(calls)
    assert pushed[0] == "wandb_modprof"  # the availability check at profile()
    assert pushed.count("<root>.forward") == 1  # the second forward; the first is the pass
    started = {arg[0] for kind, arg, _ in calls if kind == "start"}
    assert started == {f"{r.module_name}.backward" for r in prof.invocations() if r.backward_nodes}
    assert prof.num_samples == 1
