"""A checkpoint plan checked against the run (issue 48, "verify it"): the planned model
profiled, its realised activation bytes, memory peak, step time and recompute times beside
the plan's predictions (`AppliedPlan.outcome`, `view.checkpoint_outcome.plan_outcome`).

On CPU the step time is too noisy to hold to a tolerance: only that it is measured."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoint_runs import MODELS, profiled
from torch import nn

import wandb_modprof
from wandb_modprof import CheckpointPlan, ModProfError, apply_checkpoint_plan
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.view.checkpoint_outcome import Compared, PlanOutcome, plan_outcome
from wandb_modprof.view.checkpoint_plan import checkpoint_plan

ROOT = "<root>#0"


@pytest.fixture(scope="module", params=["TinyGPT", "ResNet"])
def checked(
    request: pytest.FixtureRequest,
) -> tuple[CheckpointPlan, ProfileData, PlanOutcome, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model, x = MODELS[request.param]()
    plan = checkpoint_plan(profiled(model, x).snapshot(), "50%")
    with apply_checkpoint_plan(model, plan) as applied:
        after = profiled(model, x)
    return plan, after.snapshot(), applied.outcome(after), model, x


def _consistent(c: Compared) -> None:
    assert c.predicted is not None and c.realised is not None, c.name
    assert c.error == c.realised - c.predicted
    if c.predicted:
        assert c.error_percent == pytest.approx(100 * c.error / c.predicted)


def test_the_realised_figures_are_the_profiles(checked):
    plan, after, outcome, _, _ = checked
    root = after.stats[ROOT]
    assert outcome.plan == plan
    act = outcome.activation_bytes
    assert act.predicted == plan.predicted_activation_bytes
    assert act.realised == round(root.typical("act_bytes") or -1)
    _consistent(act)
    assert outcome.within_margin and outcome.within_budget
    assert abs(act.error or 0) <= plan.margin_bytes
    # the peak: on CPU the saved-tensor curve's, known before and after
    peaks = [root.typical(m) for m in ("fwd_mem_peak_bytes", "bwd_mem_peak_bytes")]
    assert plan.peak_bytes_now is not None and plan.predicted_peak_bytes is not None
    assert outcome.peak_bytes.predicted == plan.predicted_peak_bytes
    assert outcome.peak_bytes.realised == round(max(p for p in peaks if p is not None))
    _consistent(outcome.peak_bytes)
    # the step time: measured, positive (no tolerance on CPU)
    step = outcome.step_ms
    assert step.predicted == plan.predicted_step_ms
    assert step.realised == (root.typical("fwd_ms") or 0) + (root.typical("bwd_ms") or 0)
    assert step.realised is not None and step.realised > 0
    _consistent(step)


def test_every_planned_module_was_recomputed(checked):
    plan, after, outcome, _, _ = checked
    assert [c.name for c in outcome.recompute_ms] == [
        f"recompute {name}" for name in plan.module_names
    ]
    assert outcome.not_recomputed == ()
    for call, compared in zip(plan.calls, outcome.recompute_ms, strict=True):
        assert compared.predicted == call.recompute_ms
        measured = [
            s.typical("recompute_ms")
            for s in after.stats.values()
            if s.module_name == call.module_name
        ]
        assert compared.realised == pytest.approx(sum(t for t in measured if t is not None))
        assert compared.realised is not None and compared.realised > 0
        _consistent(compared)


def test_the_text_says_it_for_people(checked):
    plan, after, outcome, _, _ = checked
    text = outcome.text()
    assert text.startswith(f"Checkpoint plan for {plan.model_name}, checked against the run")
    assert "within the budget" in text
    for row in ("activation memory", "memory peak", "step time"):
        assert row in text
    for name in plan.module_names:
        assert f"recompute {name}" in text
    assert "Not recomputed" not in text
    assert plan_outcome(plan, after) == outcome  # a snapshot, or a Profile: the same


def test_a_profile_without_the_plan_applied_is_said(checked):
    plan, _, _, model, x = checked
    outcome = plan_outcome(plan, profiled(model, x))  # the plan was not applied
    assert outcome.not_recomputed == tuple(f"recompute {n}" for n in plan.module_names)
    assert "Not recomputed in the run" in outcome.text()


def test_a_profile_without_activation_bytes_is_refused():
    model = nn.Linear(4, 4)
    with wandb_modprof.profile(model, structure=False) as prof:
        model(torch.randn(2, 4))  # no backward: no sampled step
    plan = CheckpointPlan(100, 100, 50, 1.0, 1.0, 0, (), ())
    with pytest.raises(ModProfError, match=r"plan_outcome.*expected a profile .* activation"):
        plan_outcome(plan, prof)
    with pytest.raises(ModProfError, match=r"expects a wandb_modprof\.Profile"):
        plan_outcome(plan, 42)


def test_unknown_figures_have_no_error():
    unknown = Compared("memory peak", "bytes", None, 1024.0)
    assert unknown.error is None and unknown.error_percent is None
    zero = Compared("step time", "ms", 0.0, 2.0)
    assert zero.error == 2.0 and zero.error_percent is None


def test_peaks_round_trip_and_older_plans_still_read(checked):
    plan, _, _, _, _ = checked
    data = json.loads(json.dumps(plan.to_json()))
    assert data["peak_bytes_now"] == plan.peak_bytes_now
    assert CheckpointPlan.from_json(data) == plan
    older = {k: v for k, v in data.items() if k not in ("peak_bytes_now", "predicted_peak_bytes")}
    read = CheckpointPlan.from_json(older)
    assert read.peak_bytes_now is None and read.predicted_peak_bytes is None
    with pytest.raises(ModProfError, match=r"peak_bytes_now: expected an integer"):
        CheckpointPlan.from_json(data | {"peak_bytes_now": "big"})


def test_without_a_peak_the_outcome_says_so(checked):
    plan, after, _, _, _ = checked
    older = CheckpointPlan.from_json(plan.to_json() | {"predicted_peak_bytes": None})
    outcome = plan_outcome(older, after)
    assert outcome.peak_bytes.predicted is None and outcome.peak_bytes.error is None
    assert outcome.within_budget  # the other figures are unaffected
