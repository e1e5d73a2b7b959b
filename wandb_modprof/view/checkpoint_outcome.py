"""A checkpoint plan checked against the run: what profiling the planned model measured, beside
what the plan predicted.

>>> plan = prof.checkpoint_plan("50%")                              # doctest: +SKIP
>>> with wandb_modprof.apply_checkpoint_plan(model, plan) as applied:  # doctest: +SKIP
...     with wandb_modprof.profile(model) as after:
...         train_a_few_steps()
>>> print(applied.outcome(after).text())                            # doctest: +SKIP

Each figure is read from the root call of the planned model's profile (medians over its
samples), as the plan read today's from the profile it was made from:

* activation memory: `act_bytes`, against `predicted_activation_bytes`; within the budget when
  at most `budget_bytes + margin_bytes` (the margin is the part of the prediction that is an
  estimate: `view.checkpoint_plan`);
* memory peak: the larger of `fwd_mem_peak_bytes` and `bwd_mem_peak_bytes`, against
  `predicted_peak_bytes` (only where both are known: on CPU the saved-tensor memory curve's
  peak, on accelerators the allocator's);
* step time: `fwd_ms + bwd_ms`, against `predicted_step_ms` (the backward holds the recompute);
* per planned module, the `recompute_ms` measured on its checkpointed calls (summed over its
  calls) against the `fwd_ms` the plan expected it to cost again. None: not recomputed (the
  plan was not applied while profiling, or the module did not run).
"""

from __future__ import annotations

from dataclasses import dataclass

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.checkpoint import CheckpointPlan
from wandb_modprof.records.snapshot import ProfileData, as_data
from wandb_modprof.view.checkpoint_calls import memory_peaks

ROOT_KEY = "<root>#0"


@dataclass(frozen=True)
class Compared:
    """One figure: `predicted` by the plan and `realised` in the run (None: not known), in
    `unit` ("bytes" or "ms")."""

    name: str
    unit: str
    predicted: float | None
    realised: float | None

    @property
    def error(self) -> float | None:
        """Realised less predicted (negative: below the prediction); None if either is not
        known."""
        if self.predicted is None or self.realised is None:
            return None
        return self.realised - self.predicted

    @property
    def error_percent(self) -> float | None:
        """`error` as a percentage of the prediction; None where the prediction is 0 or not
        known."""
        error = self.error
        if error is None or not self.predicted:
            return None
        return 100.0 * error / self.predicted


@dataclass(frozen=True)
class PlanOutcome:
    """A plan beside the run of the planned model (`plan_outcome`). `within_margin`: the
    realised activation bytes are within `margin_bytes` of the prediction; `within_budget`:
    they are at most `budget_bytes + margin_bytes`."""

    plan: CheckpointPlan
    activation_bytes: Compared
    peak_bytes: Compared
    step_ms: Compared
    recompute_ms: tuple[Compared, ...]  # one per planned module, in the plan's order

    @property
    def within_margin(self) -> bool:
        error = self.activation_bytes.error
        return error is not None and abs(error) <= self.plan.margin_bytes

    @property
    def within_budget(self) -> bool:
        realised = self.activation_bytes.realised
        return realised is not None and realised <= self.plan.budget_bytes + self.plan.margin_bytes

    @property
    def not_recomputed(self) -> tuple[str, ...]:
        """Planned modules without a measured recompute: was the plan applied?"""
        return tuple(c.name for c in self.recompute_ms if c.realised is None)

    def text(self) -> str:
        """The comparison as lines of text for a terminal or a log."""
        plan = self.plan
        name = plan.model_name or "the model"
        verdict = "within" if self.within_budget else "OVER"
        lines = [
            f"Checkpoint plan for {name}, checked against the run: activation memory "
            f"{_value('bytes', self.activation_bytes.realised)} realised, {verdict} the budget "
            f"{_value('bytes', plan.budget_bytes)} + margin {_value('bytes', plan.margin_bytes)}",
            "",
        ]
        rows = [self.activation_bytes, self.peak_bytes, self.step_ms, *self.recompute_ms]
        width = max(len(c.name) for c in rows)
        lines.append(f"{'':<{width}}  {'predicted':>10}  {'realised':>10}  error")
        for c in rows:
            lines.append(
                f"{c.name:<{width}}  {_value(c.unit, c.predicted):>10}  "
                f"{_value(c.unit, c.realised):>10}  {_error(c)}"
            )
        if self.not_recomputed:
            lines += [
                "",
                f"Not recomputed in the run: {', '.join(self.not_recomputed)} (was the plan "
                "applied while profiling?)",
            ]
        return "\n".join(lines) + "\n"


def plan_outcome(plan: CheckpointPlan, profile_after: object) -> PlanOutcome:
    """`plan` beside the profile of the planned model (`profile_after`: a `Profile` or its
    `snapshot()`, taken with the plan applied). Raises `ModProfError` when that profile has no
    activation bytes for the root call (no sampled step with a backward)."""
    where = "plan_outcome(profile_after=...)"
    data = as_data(profile_after, where)
    root = data.stats.get(ROOT_KEY)
    act = None if root is None else root.typical("act_bytes")
    if root is None or act is None:
        raise ModProfError(
            f"{where}: expected a profile of the planned model with activation bytes measured "
            "(a sampled step with a backward); got none for the root call"
        )
    fwd_peak, bwd_peak = memory_peaks(root)
    peaks = [p for p in (fwd_peak, bwd_peak) if p is not None]
    fwd_ms, bwd_ms = root.typical("fwd_ms"), root.typical("bwd_ms")
    step_ms = None if fwd_ms is None or bwd_ms is None else fwd_ms + bwd_ms
    return PlanOutcome(
        plan=plan,
        activation_bytes=Compared(
            "activation memory", "bytes", plan.predicted_activation_bytes, round(act)
        ),
        peak_bytes=Compared(
            "memory peak", "bytes", plan.predicted_peak_bytes, max(peaks) if peaks else None
        ),
        step_ms=Compared("step time", "ms", plan.predicted_step_ms, step_ms),
        recompute_ms=tuple(
            Compared(
                f"recompute {c.module_name}",
                "ms",
                c.recompute_ms,
                _recompute_ms(data, c.module_name),
            )
            for c in plan.calls
        ),
    )


def _recompute_ms(data: ProfileData, module_name: str) -> float | None:
    """The module's measured recompute, summed over its calls; None if none was recomputed."""
    times = [
        t
        for s in data.stats.values()
        if s.module_name == module_name and (t := s.typical("recompute_ms")) is not None
    ]
    return sum(times) if times else None


def _value(unit: str, value: float | None) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.3g} ms"
    for name, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {name}"
    return f"{value:.0f} B"


def _error(c: Compared) -> str:
    error, percent = c.error, c.error_percent
    if error is None:
        return "-"
    shown = ("+" if error > 0 else "") + _value(c.unit, error)
    if percent is None or error == 0:
        return shown
    return f"{shown} ({percent:+.0f} %)" if abs(percent) >= 100 else f"{shown} ({percent:+.3g} %)"
