"""A checkpoint plan as text for a terminal (`wandb-modprof plan`): the budget, today's and the
predicted activation memory, step time and memory peak, then the planned modules, each with the
bytes it frees, its recompute time and why it was chosen, then the modules left out and why.

>>> print(format_plan(plan))                                          # doctest: +SKIP
Checkpoint plan for TinyGPT: activation memory 1.07 MiB -> 456 KiB (budget 549 KiB, ±96 KiB)
...
"""

from __future__ import annotations

from wandb_modprof.records.checkpoint import CheckpointPlan
from wandb_modprof.records.modes import Unit
from wandb_modprof.sinks.escape import escape_text
from wandb_modprof.view.units import format_value

EXCLUDED_SHOWN = 10  # modules left out, listed; the rest are counted


def format_plan(plan: CheckpointPlan) -> str:
    """The plan as lines of text (names escaped for a terminal)."""

    def size(n: float) -> str:
        return format_value(Unit.BYTES, n)

    def ms(v: float) -> str:
        return format_value(Unit.MS, v)

    name = escape_text(plan.model_name) or "the model"
    lines = [
        f"Checkpoint plan for {name}: activation memory {size(plan.activation_bytes_now)} -> "
        f"{size(plan.predicted_activation_bytes)} predicted (budget {size(plan.budget_bytes)}, "
        f"margin {size(plan.margin_bytes)})",
        f"step time {ms(plan.step_ms_now)} -> {ms(plan.predicted_step_ms)} predicted "
        f"(+{ms(plan.recompute_ms)} of recompute, +{ms(plan.checkpoint_ms)} of checkpointing "
        f"at {ms(plan.checkpoint_call_ms)} per call)",
    ]
    if plan.peak_bytes_now is not None and plan.predicted_peak_bytes is not None:
        lines.append(
            f"memory peak {size(plan.peak_bytes_now)} -> {size(plan.predicted_peak_bytes)} "
            "predicted"
        )
    lines.append("")
    if not plan.calls:
        lines.append("Nothing to checkpoint: today's activation memory is within the budget.")
    else:
        width = max(len(escape_text(c.module_name)) for c in plan.calls)
        lines.append(f"{'module':<{width}}  {'frees':>10}  {'recompute':>10}  why")
        for call in plan.calls:
            calls = f" ({call.calls} calls)" if call.calls > 1 else ""
            lines.append(
                f"{escape_text(call.module_name):<{width}}  {size(call.bytes_freed):>10}  "
                f"{ms(call.recompute_ms):>10}  {escape_text(call.why)}{calls}"
            )
    if plan.excluded:
        lines += ["", f"Left out ({len(plan.excluded)}):"]
        for key, reason in plan.excluded[:EXCLUDED_SHOWN]:
            lines.append(f"  {escape_text(key)}: {escape_text(reason)}")
        if len(plan.excluded) > EXCLUDED_SHOWN:
            lines.append(f"  ... and {len(plan.excluded) - EXCLUDED_SHOWN} more")
    return "\n".join(lines) + "\n"
