"""Checkpoint plans (issue 48): planned from a profile, applied to the model, then measured.

On real models (TinyGPT, a plain MLP stack, the zoo's ResNet with BatchNorm): plans at 75, 50
and 25 % of today's activation memory are antichains of the call tree and meet the budget by
prediction; applying one leaves training bitwise unchanged and `remove()` restores the model;
the activation bytes measured on the planned model lie within the plan's stated margin of the
prediction (on these models they are equal, or below by LayerNorm statistics).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from models import ResNet, TinyGPT, gpt_input, resnet_input
from torch import nn

import wandb_modprof
from wandb_modprof import CheckpointPlan, ModProfError, apply_checkpoint_plan
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.view.checkpoint_calls import estimate_calls
from wandb_modprof.view.checkpoint_plan import checkpoint_plan
from wandb_modprof.view.graphs import merge

Loss = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def mlp_stack(width: int = 32, depth: int = 4) -> nn.Sequential:
    """Blocks of Linear, ReLU, Linear, ReLU: each block's last ReLU saves the output that the
    next block's first Linear saves again (a shared output the plan must not count as freed)."""
    blocks = [
        nn.Sequential(
            nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width), nn.ReLU()
        )
        for _ in range(depth)
    ]
    return nn.Sequential(*blocks, nn.Linear(width, 10))


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).float().pow(2).mean()


def _profiled(model: nn.Module, x: torch.Tensor, steps: int = 2) -> wandb_modprof.Profile:
    """A structure pass and a timed step (after an untimed warm-up step), grads cleared."""
    _loss(model, x).backward()
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            _loss(model, x).backward()
    model.zero_grad(set_to_none=True)
    return prof


def _realised(model: nn.Module, x: torch.Tensor) -> int:
    """The root's activation bytes measured on one timed step of `model` as it is now."""
    _loss(model, x).backward()
    with wandb_modprof.profile(model, structure=False) as prof:
        _loss(model, x).backward()
    model.zero_grad(set_to_none=True)
    act = prof.snapshot().stats["<root>#0"].typical("act_bytes")
    assert act is not None
    return round(act)


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "TinyGPT": lambda: (TinyGPT(), gpt_input()),
    "MLP": lambda: (mlp_stack(), torch.randn(16, 32)),
}


@pytest.fixture(scope="module")
def profiled() -> dict[str, tuple[nn.Module, torch.Tensor, ProfileData]]:
    torch.manual_seed(0)
    out = {}
    for name, make in MODELS.items():
        model, x = make()
        out[name] = (model, x, _profiled(model, x).snapshot())
    return out


def _ancestors(data: ProfileData, key: str) -> set[str]:
    found, parent = set(), data.stats[key].parent_key
    while parent is not None:
        found.add(parent)
        parent = data.stats[parent].parent_key
    return found


@pytest.mark.parametrize("budget", ["75%", "50%", "25%"])
@pytest.mark.parametrize("name", list(MODELS))
def test_plans_are_antichains_that_meet_the_budget(profiled, name: str, budget: str):
    _, _, data = profiled[name]
    plan = checkpoint_plan(data, budget)
    now = round(data.stats["<root>#0"].typical("act_bytes") or 0)
    assert plan.activation_bytes_now == now
    assert plan.budget_bytes == int(now * float(budget[:-1]) / 100)
    assert plan.calls and plan.predicted_activation_bytes <= plan.budget_bytes
    freed = sum(c.bytes_freed for c in plan.calls)
    assert plan.predicted_activation_bytes == now - freed
    assert plan.predicted_step_ms == pytest.approx(plan.step_ms_now + plan.recompute_ms)
    planned = {c.module_name for c in plan.calls}
    for call in plan.calls:  # an antichain: no planned call inside another
        assert call.bytes_freed > 0 and call.recompute_ms > 0
        keys = [k for k, s in data.stats.items() if s.module_name == call.module_name]
        assert len(keys) == call.calls
        for key in keys:
            inside = {data.stats[a].module_name for a in _ancestors(data, key)}
            assert not inside & planned, (call.module_name, inside & planned)


@pytest.mark.parametrize("budget", ["75%", "50%", "25%"])
@pytest.mark.parametrize("name", list(MODELS))
def test_realised_activation_bytes_match_the_prediction(profiled, name: str, budget: str):
    """The planned model, profiled: its root's `act_bytes` against the prediction. Seen here:
    equal, except TinyGPT when a whole block is planned (1 KiB below per block: the first
    LayerNorm's mean and inverse deviation, counted as kept input)."""
    model, x, data = profiled[name]
    plan = checkpoint_plan(data, budget)
    with apply_checkpoint_plan(model, plan):
        realised = _realised(model, x)
    assert abs(realised - plan.predicted_activation_bytes) <= plan.margin_bytes
    assert realised <= plan.budget_bytes


@pytest.mark.parametrize("name", list(MODELS))
def test_a_plan_keeps_training_bitwise_and_remove_restores(profiled, name: str):
    model, x, data = profiled[name]
    plan = checkpoint_plan(data, "25%")
    twin = copy.deepcopy(model)
    with apply_checkpoint_plan(twin, plan) as applied:
        assert applied.module_names == plan.module_names
        for module_name in plan.module_names:
            assert "forward" in twin.get_submodule(module_name).__dict__
        torch.manual_seed(1)
        loss_ckpt = _loss(twin, x)
        loss_ckpt.backward()
    torch.manual_seed(1)
    loss_plain = _loss(model, x)
    loss_plain.backward()
    assert torch.equal(loss_ckpt, loss_plain)
    for (n, p), (_, q) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, n
        assert torch.equal(p.grad, q.grad), n
    model.zero_grad(set_to_none=True)
    assert not applied.active
    for _, module in twin.named_modules():
        assert "forward" not in module.__dict__  # the class's forward again
    applied.remove()  # a second remove does nothing


def test_the_planned_calls_are_recomputed_in_backward(profiled):
    model, x, data = profiled["TinyGPT"]
    plan = checkpoint_plan(data, "50%")
    with apply_checkpoint_plan(model, plan):
        _loss(model, x).backward()
        with wandb_modprof.profile(model, structure=False) as prof:
            _loss(model, x).backward()
    model.zero_grad(set_to_none=True)
    stats = prof.snapshot().stats
    for call in plan.calls:
        assert stats[call.key].typical("recompute_ms") is not None, call.key


class _Twin(nn.Module):
    """Linear, GELU, Linear (leaves: each frees nothing alone, its saves are its inputs); with
    `sleep_s` its own code also sleeps, so recomputing it costs that much more."""

    def __init__(self, width: int = 32, sleep_s: float = 0.0) -> None:
        super().__init__()
        self.sleep_s = sleep_s
        self.up, self.act, self.down = (
            nn.Linear(width, 4 * width),
            nn.GELU(),
            nn.Linear(4 * width, width),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.down(self.act(self.up(x)))


class _Siblings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.slow = _Twin(sleep_s=0.02)
        self.fast = _Twin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.unbind(0)  # views of one storage: each twin gets its own copy
        return self.slow(a.clone()) + self.fast(b.clone())


def test_equal_bytes_the_cheaper_recompute_is_chosen():
    torch.manual_seed(0)
    model, x = _Siblings(), torch.randn(2, 16, 32)
    data = _profiled(model, x).snapshot()
    freed = {
        e.call.key: e.freed_bytes
        for e in estimate_calls(merge(data.structures).calls, data.stats)
        if e.freed_bytes and e.call.parent_key is not None
    }
    assert freed == {"slow#0": 16 * 128 * 4 * 2, "fast#0": 16 * 128 * 4 * 2}  # GELU in + out
    slow, fast = (data.stats[k].typical("fwd_ms") or 0.0 for k in ("slow#0", "fast#0"))
    assert slow > fast + 10
    now = checkpoint_plan(data, 1.0)
    assert now.calls == ()  # the budget is met already
    one = checkpoint_plan(data, now.activation_bytes_now - freed["fast#0"] // 2)
    assert one.module_names == ("fast",)
    both = checkpoint_plan(data, now.activation_bytes_now - freed["fast#0"] - 1)
    assert both.module_names == ("slow", "fast")


def test_batchnorm_is_excluded_with_its_reason():
    torch.manual_seed(0)
    model, x = ResNet(), resnet_input()
    data = _profiled(model, x).snapshot()
    plan = checkpoint_plan(data, "100%")
    reasons = dict(plan.excluded)
    assert reasons["<root>#0"].startswith("the root call")
    assert reasons["layer1#0"] == (
        "contains BatchNorm2d (layer1.0.bn1) in training mode: recompute would update running "
        "statistics twice"
    )
    assert reasons["bn1#0"].startswith("contains BatchNorm2d (bn1)")
    assert "conv1#0" not in reasons  # a conv alone may be planned (it frees nothing: its input)
    with pytest.raises(ModProfError, match=r"expected a budget .* best reachable is"):
        checkpoint_plan(data, "75%")
    # and apply refuses a hand-written plan over a module with running statistics
    bad = CheckpointPlan.from_json(plan.to_json() | {"calls": [_call("layer1")]})
    with pytest.raises(ModProfError, match=r"'layer1.0.bn1' \(BatchNorm2d\) inside 'layer1'"):
        apply_checkpoint_plan(model, bad)


def _call(module_name: str) -> dict[str, object]:
    return {
        "key": f"{module_name}#0",
        "module_name": module_name,
        "module_type": "Sequential",
        "bytes_freed": 1,
        "recompute_ms": 1.0,
        "why": "by hand",
        "calls": 1,
    }


def test_json_round_trip_and_apply_from_dict_and_file(profiled, tmp_path: Path):
    model, _, data = profiled["TinyGPT"]
    plan = wandb_modprof.Profile.from_data(data).checkpoint_plan("50%")
    assert plan == checkpoint_plan(data, "50%")
    text = json.dumps(plan.to_json())
    back = CheckpointPlan.from_json(json.loads(text))
    assert back == plan
    assert json.loads(text)["version"] == 1
    path = tmp_path / "plan.json"
    path.write_text(text)
    for given in (plan.to_json(), path, str(path)):
        with apply_checkpoint_plan(model, given) as applied:
            assert applied.module_names == plan.module_names
    broken = plan.to_json() | {"version": 99}
    with pytest.raises(ModProfError, match=r"checkpoint_plan\(plan\)\.version: expected 1; got 99"):
        apply_checkpoint_plan(model, broken)
    with pytest.raises(ModProfError, match=r"calls\[0\]\.bytes_freed: expected an integer"):
        CheckpointPlan.from_json(plan.to_json() | {"calls": [_call("x") | {"bytes_freed": "1"}]})
    with pytest.raises(ModProfError, match="expected a JSON file"):
        apply_checkpoint_plan(model, tmp_path / "missing.json")


def test_apply_refuses_what_it_cannot_wrap(profiled):
    model, _, data = profiled["TinyGPT"]
    plan = checkpoint_plan(data, "50%")
    with pytest.raises(ModProfError, match="expected an uncompiled model"):
        apply_checkpoint_plan(torch.compile(model), plan)
    other = CheckpointPlan.from_json(plan.to_json() | {"calls": [_call("no.such")]})
    with pytest.raises(ModProfError, match=r"got 1 it lacks: no\.such"):
        apply_checkpoint_plan(model, other)
    with (
        apply_checkpoint_plan(model, plan),
        pytest.raises(ModProfError, match="already wrapped"),
    ):
        apply_checkpoint_plan(model, plan)
    with pytest.raises(ModProfError, match="expected a CheckpointPlan"):
        apply_checkpoint_plan(model, 42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "budget", [0, -5, 0.0, 1.5, -0.5, True, None, "abc", "0%", "150%", "50", "x%", [0.5]]
)
def test_bad_budgets_raise(profiled, budget: object):
    _, _, data = profiled["MLP"]
    with pytest.raises(ModProfError, match=r"checkpoint_plan\(budget=.*expected bytes .*; got"):
        checkpoint_plan(data, budget)  # type: ignore[arg-type]


def test_an_unreachable_budget_names_the_best_plan(profiled):
    _, _, data = profiled["MLP"]
    with pytest.raises(ModProfError, match=r"best reachable is \d+ bytes \(\d+%\), checkpointing"):
        checkpoint_plan(data, 1)
