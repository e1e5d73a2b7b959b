"""Profiling never changes what training computes: bitwise-identical outputs, losses, gradients.

Each scenario runs the same training code three times from identical starting points (the same
deep-copied model, the same inputs, the same seed): plainly, under `watch(log_freq=1)` (every
step sampled) and inside `with profile(model)`. Everything training can observe (outputs,
losses, every parameter's `.grad`, input gradients, parameters after an optimizer step and
BatchNorm buffers) must be `torch.equal`, not merely close: the hooks only read counters and
clocks and must not add, reorder or change a single floating-point operation.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from helpers import disabled_run, hook_counts
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

import wandb_modprof

MODES = ("plain", "watch", "profile")


@contextlib.contextmanager
def _instrumented(
    model: nn.Module,
    mode: str,
    optimizer: torch.optim.Optimizer | None = None,
    samples: int | None = None,
) -> Iterator[Any]:
    """Run the body plainly, watched with every step sampled, or inside a profile block.

    `samples`: how many samples the instrumented run must have taken (so a comparison can never
    pass because the profiler silently measured nothing).
    """
    if mode == "plain":
        yield None
    elif mode == "watch":
        handle = wandb_modprof.watch(
            model, log_freq=1, optimizer=optimizer, structure=False, run=disabled_run()
        )
        try:
            yield handle
            if samples is not None:
                assert handle.profile().num_samples == samples
        finally:
            handle.unwatch()
    else:
        with wandb_modprof.profile(model, optimizer=optimizer, structure=False) as prof:
            yield prof
            if samples is not None:
                assert prof.num_samples == samples
    # Whatever the mode, nothing may stay on the model afterwards.
    assert all(n == 0 for n in hook_counts(model).values()), hook_counts(model)


def _flatten(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value.detach()]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flatten(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in _flatten(value[k])]
    if hasattr(value, "__dataclass_fields__"):
        return [t for k in value.__dataclass_fields__ for t in _flatten(getattr(value, k))]
    raise TypeError(type(value))


def _state(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Parameters, their gradients and buffers, by name (tied weights appear once)."""
    out: dict[str, torch.Tensor | None] = {}
    for name, p in model.named_parameters():
        out[f"param:{name}"] = p.detach().clone()
        out[f"grad:{name}"] = None if p.grad is None else p.grad.detach().clone()
    for name, b in model.named_buffers():
        out[f"buffer:{name}"] = b.detach().clone()
    return out


def _assert_bitwise_equal(a: Any, b: Any, what: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            _assert_bitwise_equal(a[k], b[k], f"{what}/{k}")
        return
    if isinstance(a, list):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_bitwise_equal(x, y, f"{what}[{i}]")
        return
    if a is None or b is None:
        assert a is None and b is None, f"{what}: {a!r} vs {b!r}"
        return
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert torch.equal(a, b), (
        f"{what} differs: max |diff| = {(a.double() - b.double()).abs().max()}"
    )


Scenario = Callable[[nn.Module, str], dict[str, Any]]


def _compare(make_model: Callable[[], nn.Module], scenario: Scenario) -> None:
    torch.manual_seed(1234)
    base = make_model()
    results = {}
    for mode in MODES:
        model = copy.deepcopy(base)
        torch.manual_seed(99)  # same randomness (inputs, dropout if any) in every mode
        results[mode] = scenario(model, mode)
    for mode in MODES[1:]:
        _assert_bitwise_equal(results["plain"], results[mode], f"plain vs {mode}")


def _simple_training(
    make_input: Callable[[], torch.Tensor], loss_fn: Callable[[Any], torch.Tensor], steps: int = 2
) -> Scenario:
    """`steps` SGD steps; records outputs, losses, grads before each step and params after."""

    def scenario(model: nn.Module, mode: str) -> dict[str, Any]:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        xs = [make_input() for _ in range(steps)]
        rec: dict[str, Any] = {"out": [], "loss": [], "state": []}
        with _instrumented(model, mode, opt, samples=steps) as h:
            for x in xs:
                out = model(x)
                loss = loss_fn(out)
                loss.backward()
                rec["out"].append(_flatten(out))
                rec["loss"].append(loss.detach())
                rec["state"].append(_state(model))
                opt.step()
                opt.zero_grad(set_to_none=True)
            if mode != "plain":
                prof = h.profile() if mode == "watch" else h
                assert prof.last_sample.totals.bwd_ms is not None
        rec["final"] = _state(model)
        return rec

    return scenario


def _mse(out: Any) -> torch.Tensor:
    return out.float().pow(2).mean()


def test_resnet_inplace_relu_and_residual_add():
    _compare(ResNet, _simple_training(lambda: resnet_input(4, 16), _mse))


def test_tinygpt_tied_weights():
    _compare(TinyGPT, _simple_training(gpt_input, _mse))


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_tinygpt_activation_checkpointing(mode):
    _compare(lambda: TinyGPT(checkpointing=mode), _simple_training(gpt_input, _mse))


def test_custom_autograd_function():
    _compare(CustomFunctionModel, _simple_training(lambda: torch.randn(8, 32), _mse))


def test_kwargs_dict_and_dataclass_outputs():
    _compare(
        KwargsDictModel,
        _simple_training(lambda: torch.randn(8, 32), lambda o: o.logits.pow(2).mean() + o.aux),
    )


def _penalty_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Softplus(), nn.Linear(32, 1)
    )


@pytest.mark.parametrize(
    "make_model", [_penalty_model, Reused, CustomFunctionModel], ids=["mlp", "reused", "custom_fn"]
)
def test_gradient_penalty_double_backward(make_model):
    """`torch.autograd.grad(..., create_graph=True)` on a leaf input, then (loss + gp).backward().

    The leaf input is what breaks `register_multi_grad_hook` (pytorch #131753).
    """

    def scenario(model: nn.Module, mode: str) -> dict[str, Any]:
        dim = 16 if isinstance(model, nn.Sequential) else 32
        rec: dict[str, Any] = {"out": [], "gp": [], "loss": [], "xgrad": [], "state": []}
        # One sample per step: it ends with the first backward (the autograd.grad call).
        with _instrumented(model, mode, samples=2):
            for _ in range(2):
                x = torch.randn(8, dim, requires_grad=True)
                out = model(x)
                (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
                gp = (g.norm(2, dim=1) - 1).pow(2).mean()
                loss = out.pow(2).mean()
                (loss + gp).backward()
                rec["out"].append(out.detach())
                rec["gp"].append(gp.detach())
                rec["loss"].append(loss.detach())
                rec["xgrad"].append(x.grad)
                rec["state"].append(_state(model))
                model.zero_grad(set_to_none=True)
        return rec

    _compare(make_model, scenario)


def test_retain_graph_then_second_backward():
    def scenario(model: nn.Module, mode: str) -> dict[str, Any]:
        rec: dict[str, Any] = {"state": [], "loss": []}
        with _instrumented(model, mode, samples=2):
            for _ in range(2):
                loss = _mse(model(gpt_input()))
                loss.backward(retain_graph=True)
                rec["state"].append(_state(model))
                (2 * loss).backward()  # through the same retained graph
                rec["state"].append(_state(model))
                rec["loss"].append(loss.detach())
                model.zero_grad(set_to_none=True)
        return rec

    _compare(TinyGPT, scenario)


def test_gradient_accumulation_two_micro_batches():
    def scenario(model: nn.Module, mode: str) -> dict[str, Any]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        rec: dict[str, Any] = {"loss": [], "state": []}
        # watch counts optimizer steps (first micro-batch sampled); profile() every forward.
        with _instrumented(model, mode, opt, samples=2 if mode == "watch" else 4):
            for _ in range(2):  # optimizer steps
                for _ in range(2):  # micro-batches
                    loss = _mse(model(resnet_input(4, 16))) / 2
                    loss.backward()
                    rec["loss"].append(loss.detach())
                    rec["state"].append(_state(model))
                opt.step()
                opt.zero_grad(set_to_none=True)
        rec["final"] = _state(model)
        rec["opt"] = [
            t.clone() for st in opt.state.values() for t in st.values() if torch.is_tensor(t)
        ]
        return rec

    _compare(ResNet, scenario)


class _SigmoidThenLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.lin(x))  # sigmoid saves its output for backward


@pytest.mark.parametrize("mode", MODES)
def test_inplace_modification_of_saved_tensor_still_raises(mode):
    """Autograd's version-counter check survives our saved-tensor hooks."""
    model = _SigmoidThenLinear()
    # The failed backward's sample is dropped; the second step is measured.
    with _instrumented(model, mode, samples=1):
        y = model(torch.randn(2, 4))
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        # Training can go on after the user fixes the bug.
        model(torch.randn(2, 4)).sum().backward()
        assert model.lin.weight.grad is not None


@pytest.mark.parametrize("mode", MODES)
def test_inplace_modification_inside_module_still_raises(mode):
    """The same check when the saved tensor is modified inside the sampled forward itself."""

    class Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.sigmoid(self.lin(x))
            z = y * 2
            y.mul_(3)  # y was saved by sigmoid
            return z

    model = Bad()
    # watch: the one step raised, so unwatch says that no sample completed
    said = (
        pytest.warns(UserWarning, match="Bad was watched for 1 training step.* no sample completed")
        if mode == "watch"
        else contextlib.nullcontext()
    )
    with (
        said,
        _instrumented(model, mode),
        pytest.raises(RuntimeError, match="modified by an inplace operation"),
    ):
        model(torch.randn(2, 4)).sum().backward()
