"""The capture's hook lifecycle: interrupted forwards, a root that calls itself, copies of a
watched model, forwards in except blocks, replaced modules, hooks gone after a failed backward.
"""

from __future__ import annotations

import copy
import io
import pickle
import pickletools
import subprocess
import sys
import zipfile

import pytest
import torch
from helpers import disabled_run, hook_counts
from torch import nn
from torch.optim.swa_utils import AveragedModel

import wandb_modprof
from wandb_modprof.capture.inert_hook import InertHook
from wandb_modprof.capture.step import torch_private as tp


class Interruptible(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.interrupt = False

    def forward(self, x):
        x = torch.relu(self.a(x))
        if self.interrupt:
            raise KeyboardInterrupt  # Ctrl-C: Module._call_impl runs no always-call hooks
        return self.b(x)


def test_keyboard_interrupt_in_a_sampled_forward_does_not_stick():
    model, x = Interruptible(), torch.randn(4, 8)
    handle = wandb_modprof.watch(model, log_freq=2, structure=False, run=disabled_run())
    model(x).sum().backward()
    model.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        model(x)  # step 2, sampled
    model.interrupt = False
    for _ in range(20):  # steps 3..22: 10 sampled
        model(x).sum().backward()
    assert not tp.saved_tensors_hooks_active()
    assert handle.unwatch().num_samples == 10
    assert all(v == 0 for v in hook_counts(model).values())


def test_keyboard_interrupt_inside_a_profile_block():
    model, x = Interruptible(), torch.randn(4, 8)
    model.interrupt = True
    with pytest.raises(KeyboardInterrupt), wandb_modprof.profile(model, structure=False):
        model(x)
    assert not tp.saved_tensors_hooks_active()
    assert all(v == 0 for v in hook_counts(model).values())


class Pyramid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x)).mean()
        if x.shape[-1] > 8:
            y = y + self(nn.functional.avg_pool2d(x, 2))  # the root calls itself
        return y


def test_a_root_that_calls_itself_is_one_step():
    model = Pyramid()
    handle = wandb_modprof.watch(model, log_freq=3, structure=False, run=disabled_run())
    for _ in range(6):
        model(torch.randn(2, 3, 32, 32)).backward()
    assert handle.steps == 6
    prof = handle.unwatch()
    assert prof.num_samples == 2
    keys = [r.key for r in prof.invocations()]
    assert keys == ["<root>#0", "conv#0", "<root>#1", "conv#1", "<root>#2", "conv#2"]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))


def test_copies_of_a_watched_model_are_plain_models():
    model = _mlp()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    model(torch.randn(2, 8)).sum().backward()
    clone = copy.deepcopy(model)
    AveragedModel(model)
    torch.save(model, io.BytesIO())
    clone(torch.randn(2, 8)).sum().backward()  # the copy trains, unmeasured
    assert handle.profile().num_samples == 1
    model(torch.randn(2, 8)).sum().backward()  # the original is still watched
    assert handle.unwatch().num_samples == 2


def _globals_in(raw: bytes) -> set[str]:
    """The classes and functions a pickle names (its GLOBAL / STACK_GLOBAL opcodes)."""
    names: set[str] = set()
    strings: list[str] = []
    for op, arg, _ in pickletools.genops(raw):
        if op.name == "GLOBAL":
            names.add(str(arg).replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            names.add(".".join(strings[-2:]))
        if isinstance(arg, str):
            strings.append(arg)
    return names


def test_a_saved_watched_model_holds_nothing_of_ours_and_loads_without_the_package(tmp_path):
    model = _mlp()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    model(torch.randn(2, 8)).sum().backward()
    path = tmp_path / "model.pt"
    torch.save(model, path)
    with zipfile.ZipFile(path) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("data.pkl")]
        named = _globals_in(archive.read(name))
    assert named and not [n for n in named if n.startswith("wandb_modprof")], named
    clone = copy.deepcopy(model)
    ours = [
        hook
        for module in clone.modules()
        for hooks in (module._forward_pre_hooks, module._forward_hooks)
        for hook in hooks.values()
        if type(hook).__module__.startswith("wandb_modprof")
    ]
    assert not ours
    handle.unwatch()
    # Where wandb_modprof cannot be imported, the file loads and the model trains.
    script = (
        "import sys; sys.modules['wandb_modprof'] = None\n"
        "import torch\n"
        f"m = torch.load({str(path)!r}, weights_only=False)\n"
        "y = m(torch.ones(2, 8)); y.sum().backward()\n"
        "print('loaded', tuple(y.shape))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "loaded (2, 1)" in done.stdout
    expected = model(torch.ones(2, 8))
    assert torch.equal(torch.load(path, weights_only=False)(torch.ones(2, 8)), expected)


def test_forward_inside_an_except_block_is_measured():
    model, x = _mlp(), torch.randn(4, 8)
    with wandb_modprof.profile(model, structure=False) as prof:
        try:
            raise MemoryError("batch too large")
        except MemoryError:
            model(x[:2]).sum().backward()  # the retry
    assert prof.num_samples == 1 and prof.invocations()[0].bwd_ms > 0


class FailingBackward(torch.autograd.Function):
    fail = True

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if FailingBackward.fail:
            raise RuntimeError("boom")
        return g


def test_a_backward_that_raised_leaves_no_hooks_after_unwatch(monkeypatch):
    from wandb_modprof.capture.backward.node_stamps import NodeStamps

    calls = []
    original = NodeStamps._node_pre

    def counting(self, slot, grad_outputs):
        calls.append(id(self))
        return original(self, slot, grad_outputs)

    monkeypatch.setattr(NodeStamps, "_node_pre", counting)
    model, x = _mlp(), torch.randn(4, 8)
    handle = wandb_modprof.watch(model, log_freq=2, structure=False, run=disabled_run())
    model(x).sum().backward()
    loss = model(FailingBackward.apply(x.clone().requires_grad_())).sum()  # sampled
    with pytest.raises(RuntimeError, match="boom"):
        loss.backward()
    FailingBackward.fail = False
    model(x).sum().backward()
    with pytest.warns(UserWarning, match=r"3 training step\(s\) .* no sample completed"):
        handle.unwatch()  # the sampled step's backward raised
    before = len(calls)
    for _ in range(3):
        model(x).sum().backward()
    assert len(calls) == before  # `loss` (and its graph) is alive, its hooks are not
    del loss


def test_modules_replaced_inside_a_profile_block_are_measured():
    model, x = _mlp(), torch.randn(4, 8)
    with wandb_modprof.profile(model, structure=False) as prof:
        model(x).sum().backward()
        model[2] = nn.Linear(8, 2)
        model(x).sum().backward()
    assert [r.key for r in prof.invocations()] == ["<root>#0", "0#0", "1#0", "2#0"]


def test_models_saved_while_watched_before_the_stage_layout_still_load():
    # What torch.save wrote for a watched model's hooks before the package was split into
    # stages: a call of wandb_modprof._capture._inert_hook (pickle protocol 0).
    old = b"cwandb_modprof._capture\n_inert_hook\n(tR."
    hook = pickle.loads(old)
    assert isinstance(hook, InertHook) and hook.fn is None
    assert hook("anything") is None
