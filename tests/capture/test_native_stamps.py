"""The compiled node hooks (`capture/backward/native_stamps.cpp`) against the Python ones.

Both paths must hook the same autograd nodes, charge them to the same calls and stamp them
with the same clock; the build is cached per torch version, and a failed build or
`MODPROF_NATIVE=0` leaves the Python hooks with a line saying why.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch
from helpers import by_key, disabled_run, train_step
from models import (
    CustomFunctionModel,
    KwargsDictModel,
    ResNet,
    Reused,
    TinyGPT,
    gpt_input,
    resnet_input,
)
from torch import nn
from torch.utils.checkpoint import checkpoint

import wandb_modprof
from wandb_modprof.capture.backward import native_build
from wandb_modprof.capture.backward.node_stamps import NodeStamps
from wandb_modprof.capture.step import autograd_private as ap


@pytest.fixture
def built():
    assert native_build.start(wait=True), native_build.failure()
    return native_build.module()


class Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(16, 32)
        self.block = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = checkpoint(self.block, h, use_reentrant=self.use_reentrant)
        return self.out(h)


def _kwargs_loss(out):
    return out.logits.sum() + out.aux


CASES = {
    "resnet": (ResNet, lambda: resnet_input(4, 16), None),
    "gpt": (TinyGPT, lambda: gpt_input(2, 16), None),
    "custom-function": (CustomFunctionModel, lambda: torch.randn(8, 32), None),
    "reused": (Reused, lambda: torch.randn(8, 32, requires_grad=True), None),
    "kwargs-dict": (KwargsDictModel, lambda: torch.randn(8, 32), _kwargs_loss),
    "checkpoint": (lambda: Checkpointed(False), lambda: torch.randn(8, 16), None),
    "checkpoint-reentrant": (
        lambda: Checkpointed(True),
        lambda: torch.randn(8, 16, requires_grad=True),
        None,
    ),
}


def _one_step(
    model: nn.Module, x: torch.Tensor, native: bool, monkeypatch: pytest.MonkeyPatch, loss_fn=None
):
    """One profiled step, with the sessions the capture made (to read their node tables)."""
    sessions: list[NodeStamps] = []
    real_init = NodeStamps.__init__

    def keep(self: NodeStamps, native: bool = False) -> None:
        real_init(self, native)
        sessions.append(self)

    with monkeypatch.context() as patch:
        patch.setenv("MODPROF_NATIVE", "1" if native else "0")
        patch.setattr(NodeStamps, "__init__", keep)
        model.zero_grad(set_to_none=True)
        with wandb_modprof.profile(model, structure=False) as prof:
            train_step(model, x, loss_fn)
    (session,) = sessions
    assert (session._native is not None) == native
    return prof, session


@pytest.mark.parametrize("case", list(CASES))
def test_both_paths_hook_the_same_nodes_and_charge_them_to_the_same_calls(case, built, monkeypatch):
    make, inputs, loss_fn = CASES[case]
    torch.manual_seed(0)
    model, x = make(), inputs()
    train_step(model, x, loss_fn)  # the process's first step, outside both
    results = {}
    for native in (True, False):
        prof, session = _one_step(model, x, native, monkeypatch, loss_fn)
        nodes = session.nodes
        base = session.invocations[0].seq0  # sequence numbers as offsets into the step
        seq = [n - base if n >= 0 else -1 for n in nodes.seq]
        rows = Counter(
            (seq[s], nodes.name[s], nodes.accumulate[s], nodes.grad_new[s])
            for s in range(len(nodes))
        )
        owners = Counter(
            (seq[s], nodes.name[s], session.invocations[nodes.owner[s]].key)
            for s in range(len(nodes))
            if nodes.owner[s] >= 0
        )
        ran = Counter((seq[s], nodes.name[s]) for s in range(len(nodes)) if nodes.t1[s])
        records = {
            key: (r.backward_nodes, r.bwd_ms is not None)
            for key, r in by_key(prof.invocations()).items()
        }
        results[native] = (rows, owners, ran, records, nodes, session)
    for part in range(4):
        assert results[True][part] == results[False][part], part
    nodes, session = results[True][4], results[True][5]
    assert any(nodes.accumulate) and any(nodes.t1)
    # stamps: the host monotonic clock, each run inside the backward, nested runs inside
    # their enclosing node, and the running thread's native id
    for slot in range(len(nodes)):
        t0, t1 = nodes.t0[slot], nodes.t1[slot]
        if t1 is None:
            continue
        assert session.bwd_t_begin <= t0 <= t1 <= session.bwd_t_end
        assert nodes.thread[slot] > 0 and nodes.own1[slot] >= nodes.own0[slot] >= 0
        outer = nodes.enclosing[slot]
        if outer >= 0:
            assert nodes.t0[outer] <= t0 and t1 <= nodes.t1[outer]


def test_the_compiled_clock_is_the_python_clock(built):
    before = time.perf_counter_ns()
    mid = built.now_ns()
    after = time.perf_counter_ns()
    assert before <= mid <= after


def test_training_is_bitwise_identical_under_the_compiled_hooks(built):
    torch.manual_seed(0)
    base = TinyGPT()
    x = gpt_input(2, 16)
    runs = []
    for watched in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run()) if watched else None
        out = []
        for _ in range(3):
            loss = train_step(model, x)
            out.append((loss.detach().clone(), [p.grad.clone() for p in model.parameters()]))
            opt.step()
            opt.zero_grad(set_to_none=True)
        if handle is not None:
            assert handle.profile().num_samples >= 1
            wandb_modprof.unwatch(model)
        runs.append(out)
    for (la, ga), (lb, gb) in zip(*runs, strict=True):
        assert torch.equal(la, lb)
        assert all(torch.equal(a, b) for a, b in zip(ga, gb, strict=True))


def test_no_compiled_hook_is_left_on_a_parameter_after_the_backward(built, monkeypatch):
    """AccumulateGrad nodes outlive the step (the parameter holds them): the hooks put on
    them for a sample must come off at its end, or every later backward would run them.
    (Counted in C++, where a removed Python hook leaves torch's empty wrapper behind: this
    checks the compiled path only.)"""
    model = Reused()
    x = torch.randn(8, 32)
    train_step(model, x)
    params = list(model.parameters())
    accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in params]
    before = [built.hook_counts(node) for node in accumulators]
    prof, session = _one_step(model, x, True, monkeypatch)
    assert prof.num_samples == 1
    assert session.nodes.t1[session.nodes.accumulate.index(True)] is not None
    assert [built.hook_counts(node) for node in accumulators] == before


_FALLBACK = """
import torch
from torch import nn
import wandb_modprof
from wandb_modprof.capture.backward import native_build

model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
x = torch.randn(4, 8)
with wandb_modprof.profile(model, structure=False) as prof:
    native_build.start(wait=True)  # the build ends (or fails) before the measured steps
    for _ in range(3):
        model(x).sum().backward()
rec = {r.key: r for r in prof.invocations()}
assert rec["0#0"].bwd_ms > 0, rec
print("native:", native_build.module() is not None)
"""


@pytest.mark.parametrize("env", ["broken-compiler", "turned-off"])
def test_without_the_compiled_hooks_the_python_ones_measure_and_one_line_says_why(env, tmp_path):
    run_env = dict(os.environ, MODPROF_NATIVE_DIR=str(tmp_path / "cache"))
    if env == "broken-compiler":
        run_env["CXX"] = "/bin/false"  # an empty cache and a compiler that fails
        # what a process ended during its build leaves: torch's lock file (on which every
        # later build in that folder would wait forever) and an old build folder of its own
        folder = tmp_path / "cache" / native_build.name()
        (folder / "build-abandoned").mkdir(parents=True)
        (folder / "lock").touch()
        old = time.time() - 2 * 3600
        os.utime(folder / "build-abandoned", (old, old))
    else:
        run_env["MODPROF_NATIVE"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", _FALLBACK],
        check=False,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "native: False" in done.stdout
    ours = [line for line in done.stderr.splitlines() if line.startswith("wandb_modprof:")]
    if env == "broken-compiler":
        assert len(ours) == 2, ours  # the build starts, the build failed: one line each
        assert "were not built" in ours[1] and "using the Python node hooks" in ours[1]
        assert not list((tmp_path / "cache").rglob("*.so"))
        assert not list(folder.glob("build-*"))  # its own folder, and the abandoned one, gone
    else:
        assert ours == [], ours  # turned off: no build, nothing said


@pytest.mark.parametrize("where", ["backward-start", "end-of-backward"])
def test_a_sample_dropped_in_the_backward_leaves_no_compiled_hook(where, built, monkeypatch):
    model = Reused()
    x = torch.randn(8, 32)
    train_step(model, x)
    accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in model.parameters()]
    before = [built.hook_counts(node) for node in accumulators]

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    if where == "backward-start":
        monkeypatch.setattr(ap, "queue_end_of_backward", broken)
    else:
        monkeypatch.setattr(NodeStamps, "collect_native", broken)
    with pytest.warns(RuntimeWarning, match="injected failure"):
        prof, session = _one_step(model, x, True, monkeypatch)
    assert prof.num_samples == 0 and session.failed
    assert [built.hook_counts(node) for node in accumulators] == before
    loss = train_step(model, x)  # the next backward runs no hook of the dropped sample
    assert torch.isfinite(loss)


def test_ninja_installed_beside_this_python_is_found_without_an_activated_venv(monkeypatch):
    import shutil
    import sysconfig

    scripts = sysconfig.get_path("scripts")
    assert shutil.which("ninja", path=scripts), "the dev extra installs ninja into the venv"
    monkeypatch.setenv("PATH", "/nonexistent")  # a venv's python run without activating it
    assert shutil.which("ninja") is None
    native_build._find_ninja()
    assert shutil.which("ninja") == os.path.join(scripts, "ninja")
