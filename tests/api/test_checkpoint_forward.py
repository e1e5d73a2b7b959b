"""The forward of a planned module (`api/checkpoint_forward.py`) on models that break a naive
wrapper.

* Copies: `deepcopy`, `AveragedModel`, `pickle` and `torch.save` of a planned model give
  copies that compute from their own weights (the original's weights moved on after the copy)
  and whose backward puts gradients on their own parameters only; deep copies stay planned,
  pickled ones are written without the plan and load where wandb_modprof is missing.
* Inputs modified in place: pre-activation residual blocks opening with `ReLU(inplace=True)`,
  planned from their profile, train bitwise as the unplanned twin.
* State written in the forward: spectral norm (hooks and parametrization), weight norm (both),
  a buffer counted up in place, one written through `.data`, BatchNorm, with the discriminator
  called twice per step: gradients, parameters and buffers bitwise those of the unplanned twin
  over three steps.

Models are built with torch's global generator seeded and then put back (`_built`), inputs drawn
from private generators: the tests leave the process's random stream as they found it.
"""

from __future__ import annotations

import copy
import functools
import io
import pickle
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from checkpoint_runs import loss, profiled
from torch import nn
from torch.optim.swa_utils import AveragedModel

from wandb_modprof import CheckpointPlan, apply_checkpoint_plan
from wandb_modprof.api.checkpoint_forward import CheckpointedForward
from wandb_modprof.records.checkpoint import PlannedCall

T = TypeVar("T")


def _built(make: Callable[[], T], seed: int = 0) -> T:
    """`make()` with torch's global generator seeded, then put back as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _plan(model: nn.Module, names: list[str]) -> CheckpointPlan:
    """A plan of `names`, each with its class as a profile records it."""
    calls = tuple(
        PlannedCall(f"{n}#0", n, type(model.get_submodule(n)).__name__, 1, 1.0, "by hand")
        for n in names
    )
    return CheckpointPlan(100, 100, 50, 1.0, 1.0, 0, calls, ())


def _same_state(a: nn.Module, b: nn.Module) -> None:
    """Parameters and buffers, bitwise."""
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(p, q), n


def _same_grads(a: nn.Module, b: nn.Module, step: int) -> None:
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, (step, n)
        assert torch.equal(p.grad, q.grad), (step, n)


# ---- copies ------------------------------------------------------------------------------------
class _Block(nn.Module):
    """Linear, GELU, Linear with a residual; `calls` counts its forward runs (a recompute is
    one), a plain attribute that copies and pickles with the block."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up, self.act, self.down = (
            nn.Linear(width, 4 * width),
            nn.GELU(),
            nn.Linear(4 * width, width),
        )
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + self.down(self.act(self.up(x)))


def _blocks() -> nn.Sequential:
    return nn.Sequential(_Block(), _Block(), nn.Linear(16, 4))


def _planned() -> nn.Sequential:
    model = _built(_blocks)
    apply_checkpoint_plan(model, _plan(model, ["0", "1"]))  # kept: the model stays planned
    return model


def _computes_from_its_own_weights(original: nn.Module, copied: nn.Module, planned: bool) -> None:
    """The original's weights move on; the copy's output is a fresh computation from the copy's
    own weights, its planned blocks run their forward again in its backward (if `planned`),
    and the gradients land on its parameters, none on the original's."""
    with torch.no_grad():
        for p in original.parameters():
            p.add_(1.0)
    fresh = _built(_blocks, seed=1)
    fresh.load_state_dict(copied.state_dict())
    x = _randn(8, 16)
    before = [copied[i].calls for i in (0, 1)]
    out = copied(x)
    assert torch.equal(out, fresh(x))
    out.pow(2).mean().backward()
    runs = 2 if planned else 1
    assert [copied[i].calls for i in (0, 1)] == [b + runs for b in before]
    assert all(p.grad is not None for p in copied.parameters())
    assert all(p.grad is None for p in original.parameters())


def test_a_deep_copy_is_planned_and_computes_from_its_own_weights():
    model = _planned()
    twin = copy.deepcopy(model)
    for i in (0, 1):
        forward = twin[i].__dict__["forward"]
        assert isinstance(forward, CheckpointedForward) and forward.module is twin[i]
    _computes_from_its_own_weights(model, twin, planned=True)


def test_an_averaged_model_computes_from_the_averaged_weights():
    model = _planned()
    ema = AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    ema.update_parameters(model)  # the first update copies the weights
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    ema.update_parameters(model)  # the average differs from both the start and the model
    assert not torch.equal(ema.module[0].up.weight, model[0].up.weight)
    _computes_from_its_own_weights(model, ema.module, planned=True)


def test_a_pickled_planned_model_is_written_without_the_plan():
    model = _planned()
    data = pickle.dumps(model)
    assert b"wandb_modprof" not in data  # loads where wandb_modprof is not installed
    loaded = pickle.loads(data)
    for i in (0, 1):
        assert loaded[i].forward.__func__ is _Block.forward
        assert loaded[i].forward.__self__ is loaded[i]
    _computes_from_its_own_weights(model, loaded, planned=False)
    # the loaded model takes the plan again, and still pickles
    with apply_checkpoint_plan(loaded, _plan(loaded, ["0", "1"])):
        assert isinstance(loaded[0].__dict__["forward"], CheckpointedForward)
        pickle.loads(pickle.dumps(loaded))
    assert loaded[0].forward.__func__ is _Block.forward


def test_torch_save_and_load_of_a_planned_model():
    model = _planned()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    _computes_from_its_own_weights(model, loaded, planned=False)


def test_a_saved_planned_model_loads_without_wandb_modprof(tmp_path: Path):
    """In a process where importing wandb_modprof fails (torch's own modules only, so that the
    file names no class of the tests either)."""
    model = _built(
        lambda: nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.GELU()), nn.Linear(8, 2))
    )
    path = tmp_path / "planned.pt"
    with apply_checkpoint_plan(model, _plan(model, ["0"])):
        torch.save(model, path)
    code = (
        "import sys, torch\n"
        "sys.modules['wandb_modprof'] = None  # import wandb_modprof raises ImportError\n"
        f"model = torch.load({str(path)!r}, weights_only=False)\n"
        "model(torch.ones(2, 8)).sum().backward()\n"
        "assert model[0].forward.__self__ is model[0]\n"
        "print('loaded')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "loaded", done.stderr[-2000:]


def _doubled(self: _Block, x: torch.Tensor) -> torch.Tensor:
    return 2 * _Block.forward(self, x)


def test_an_instance_forward_set_before_the_plan_copies_with_its_module():
    """A forward set on the instance (as other tools do) is what the plan wraps; copies call
    theirs, bound to themselves, and `remove()` puts it back."""
    model = _built(_blocks)
    own = functools.partial(_doubled, model[0])
    model[0].forward = own
    x = _randn(8, 16)
    with apply_checkpoint_plan(model, _plan(model, ["0"])):
        deep, loaded = copy.deepcopy(model), pickle.loads(pickle.dumps(model))
        assert deep[0].__dict__["forward"].own.args == (deep[0],)
        assert loaded[0].forward.func is _doubled and loaded[0].forward.args == (loaded[0],)
        for copied in (deep, loaded):
            fresh = _built(_blocks, seed=1)
            fresh.load_state_dict(copied.state_dict())
            fresh[0].forward = functools.partial(_doubled, fresh[0])
            assert torch.equal(copied(x), fresh(x))
    assert model[0].__dict__["forward"] is own


# ---- inputs modified in place -------------------------------------------------------------------
class _PreAct(nn.Module):
    """A pre-activation residual block whose first op is `ReLU(inplace=True)` on the block's
    input: the residual then adds the modified input, as such a block does."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.relu = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv1d(width, width, 3, padding=1)
        self.bn = nn.BatchNorm1d(width)
        self.conv2 = nn.Conv1d(width, width, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(x)
        return self.conv2(torch.relu(self.bn(self.conv1(out)))) + x


def _preact() -> nn.Sequential:
    return nn.Sequential(nn.Conv1d(3, 8, 1), _PreAct(8), _PreAct(8), _PreAct(8), nn.Conv1d(8, 2, 1))


def test_blocks_that_modify_their_input_in_place_train_bitwise():
    model, x = _built(_preact), _randn(4, 3, 32)
    plan = profiled(model, x).checkpoint_plan("50%")
    assert {"_PreAct"} <= {c.module_type for c in plan.calls}, plan.module_names
    plain = copy.deepcopy(model)
    sgd_plain = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    sgd_planned = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with apply_checkpoint_plan(model, plan):
        for step in range(3):
            batch = x + 0.1 * step
            loss_planned, loss_plain = loss(model, batch), loss(plain, batch)
            loss_planned.backward()
            loss_plain.backward()
            assert torch.equal(loss_planned, loss_plain), step
            _same_grads(plain, model, step)
            sgd_plain.step()
            sgd_planned.step()
            sgd_plain.zero_grad(set_to_none=True)
            sgd_planned.zero_grad(set_to_none=True)
            _same_state(plain, model)
        for name in plan.module_names:
            forward = model.get_submodule(name).forward
            assert isinstance(forward, CheckpointedForward)
            # learnt at the first call: copies kept only where the forward modifies its input
            assert forward.copies_inputs == (type(forward.module) is _PreAct), name


def test_inputs_left_alone_are_kept_without_copies():
    model = _planned()
    loss(model, _randn(8, 16)).backward()
    assert not any(model[i].forward.copies_inputs for i in (0, 1))
    assert not any(model[i].forward.written for i in (0, 1))


# ---- state written in the forward ---------------------------------------------------------------
class _Counted(nn.Module):
    """Buffers its forward writes: a step count added to in place, and a running mean written
    through `.data` (which moves no version counter)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("mean", torch.zeros(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        self.mean.data.mul_(0.9).add_(0.1 * x.detach().mean((0, 2)).unsqueeze(-1))
        return x * (1.0 + 1.0 / self.steps) + self.mean


def _discriminator() -> nn.Sequential:
    sn, psn = nn.utils.spectral_norm, nn.utils.parametrizations.spectral_norm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.nn.utils.weight_norm: deprecated
        old_weight_norm = nn.utils.weight_norm(nn.Conv1d(8, 8, 3, padding=1))
    return nn.Sequential(
        nn.Sequential(sn(nn.Conv1d(3, 8, 3, padding=1)), nn.LeakyReLU(0.2)),
        nn.Sequential(psn(nn.Conv1d(8, 8, 3, padding=1)), nn.BatchNorm1d(8), nn.LeakyReLU(0.2)),
        nn.Sequential(old_weight_norm, nn.LeakyReLU(0.2)),
        nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 1)), _Counted(8)),
        psn(nn.Conv1d(8, 1, 1)),  # planned itself: its parametrization runs inside its forward
    )


def test_state_written_in_the_forward_is_kept_bitwise():
    """A GAN's discriminator step: called on two batches, one backward. The recompute of each
    call runs from the buffers that call's forward found (spectral norm's power iteration gives
    the same weight again) and leaves them as the backward found them."""
    model, plain = _built(_discriminator), _built(_discriminator)  # (weight_norm: no deepcopy)
    sgd_plain = torch.optim.SGD(plain.parameters(), lr=0.05)
    sgd_planned = torch.optim.SGD(model.parameters(), lr=0.05)
    with apply_checkpoint_plan(model, _plan(model, ["0", "1", "2", "3", "4"])):
        for step in range(3):
            real, fake = _randn(4, 3, 16, seed=2 * step), _randn(4, 3, 16, seed=2 * step + 1)
            losses = [d(real).mean() - d(fake).mean() for d in (model, plain)]
            for value in losses:
                value.backward()
            assert torch.equal(losses[0], losses[1]), step
            _same_grads(plain, model, step)
            _same_state(plain, model)
            sgd_plain.step()
            sgd_planned.step()
            sgd_plain.zero_grad(set_to_none=True)
            sgd_planned.zero_grad(set_to_none=True)
        counted = model[3][1]
        assert int(counted.steps) == 6  # two calls a step, each counted once
        assert counted.forward is not counted.__dict__.get("forward")  # inside a planned block
        assert (counted, "mean") in model[3].forward.written  # seen by its values
        assert (model[0][0], "weight_u") in model[0].forward.written
    with torch.no_grad():  # evaluation is not checkpointed and updates as before
        for d in (model, plain):
            d.eval()(_randn(4, 3, 16, seed=9))
    _same_state(plain, model)


@pytest.mark.parametrize("retain", [False, True])
def test_a_second_backward_recomputes_from_the_same_state(retain: bool):
    """`backward(retain_graph=True)` twice: each backward recomputes, each from the state the
    forward found, and the buffers end as after one forward."""
    model, plain = _built(_discriminator), _built(_discriminator)  # (weight_norm: no deepcopy)
    with apply_checkpoint_plan(model, _plan(model, ["0", "1", "3"])):
        x = _randn(4, 3, 16)
        for d in (model, plain):
            out = d(x).pow(2).mean()
            out.backward(retain_graph=retain)
            if retain:
                out.backward()
        _same_grads(plain, model, 0)
        _same_state(plain, model)
