"""Two profiles side by side in one analysis mode: per module call, the ratio B / A.

>>> from wandb_modprof.sinks.text.compare import compare, format_comparison     # doctest: +SKIP
>>> c = compare(load("before.modprof.json"), load("after.modprof.json"), "bwd")
>>> print(format_comparison(c, top=10))                                # doctest: +SKIP

Calls are matched by call key (`layer1.0.conv1#0`), the values are the ones the panel colours
nodes by (`values.ModeValues.colour`: the efficiency modes compare the time lost to the
roofline, so a ratio above 1 means more time lost than in A, not a better share). As in the
panel's compare mode, a ratio exists only where both values are measured and > 0; the
ranking is by |log ratio|, so 2x slower and 2x faster rank together. `wandb-modprof compare
A B` prints it; `--html` writes the report in compare mode with A as the baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wandb_modprof.sinks.escape import escape_text
from wandb_modprof.sinks.text.summary import render_columns
from wandb_modprof.sinks.text.values import ModeValues, ModuleValue, mode_values
from wandb_modprof.view.units import format_value

if TYPE_CHECKING:
    from wandb_modprof.records.modes import Mode
    from wandb_modprof.records.snapshot import ProfileData, SupportsSnapshot


def ratio(a: float | None, b: float | None) -> float | None:
    """b / a where both are measured and > 0 (a 0 has no meaningful ratio), else None."""
    if a is None or b is None or a <= 0 or b <= 0:
        return None
    return b / a


@dataclass(frozen=True)
class ComparedModule:
    """One call key present in both profiles, with what the panel colours it by in each
    (`ModeValues.colour`)."""

    key: str
    module_type: str
    a: float | None
    b: float | None

    @property
    def ratio(self) -> float | None:
        return ratio(self.a, self.b)


@dataclass(frozen=True)
class Comparison:
    """`matched`: call keys in both, largest |log ratio| first, then those without a ratio
    (a value missing or 0 in either); `only_a` / `only_b`: call keys in one profile only.
    Ties and the calls without a ratio keep the order of A's table (`ModeValues.modules`)."""

    mode: Mode
    label_a: str
    label_b: str
    model_a: str
    model_b: str
    matched: tuple[ComparedModule, ...]
    only_a: tuple[ModuleValue, ...]
    only_b: tuple[ModuleValue, ...]
    total_a: float | None
    total_b: float | None

    @property
    def total_ratio(self) -> float | None:
        return ratio(self.total_a, self.total_b)


def compare(
    a: ProfileData | SupportsSnapshot,
    b: ProfileData | SupportsSnapshot,
    mode_key: str,
    label_a: str = "A",
    label_b: str = "B",
) -> Comparison:
    """Compare profile `b` with the baseline `a` in the analysis mode `mode_key`."""
    va, vb = mode_values(a, mode_key), mode_values(b, mode_key)
    return compare_values(va, vb, label_a, label_b)


def compare_values(va: ModeValues, vb: ModeValues, label_a: str, label_b: str) -> Comparison:
    in_b = {v.key: v for v in vb.modules}
    in_a = {v.key for v in va.modules}
    matched = [
        ComparedModule(v.key, v.module_type, va.colour(v), vb.colour(in_b[v.key]))
        for v in va.modules
        if v.key in in_b
    ]
    with_ratio = [c for c in matched if c.ratio is not None]
    # stable sort: equal |log ratio| keeps the table's order
    with_ratio.sort(key=lambda c: abs(math.log(c.ratio or 1.0)), reverse=True)
    without = [c for c in matched if c.ratio is None]
    return Comparison(
        mode=va.mode,
        label_a=label_a,
        label_b=label_b,
        model_a=va.model_name,
        model_b=vb.model_name,
        matched=tuple(with_ratio + without),
        only_a=tuple(v for v in va.modules if v.key not in in_b),
        only_b=tuple(v for v in vb.modules if v.key not in in_a),
        total_a=va.total,
        total_b=vb.total,
    )


def format_comparison(c: Comparison, top: int) -> str:
    """The comparison as a terminal table: totals, the `top` calls that changed most, then
    the calls found in one profile only (at most `top` each). Names and labels are escaped
    (`escape.escape_text`), as in the summaries."""
    # a mode ranked by something else compares that (`ModeValues.colour`), in its unit
    unit = c.mode.rank_unit if c.mode.rank_by else c.mode.unit
    of = f" of {c.mode.rank_label}" if c.mode.rank_by else ""
    label_a, label_b, model_a, model_b = map(
        escape_text, (c.label_a, c.label_b, c.model_a, c.model_b)
    )
    lines = [
        f"wandb_modprof compare, mode {c.mode.key} ({c.mode.label}): "
        f"A = {label_a} ({model_a}), B = {label_b} ({model_b}); ratio = B / A{of}"
    ]
    if c.model_a != c.model_b:
        lines.append(
            f"NOTE: A and B are different models ({model_a}, {model_b}): "
            f"{len(c.matched)} module calls in common; the totals compare different work"
        )
    if c.mode.total:
        lines.append(
            f"model total: A {format_value(unit, c.total_a)}, B {format_value(unit, c.total_b)}, "
            f"ratio {format_value('ratio', c.total_ratio)}"
        )
    else:
        lines.append(f"model total: mode {c.mode.key} has none")
    shown = c.matched[:top]
    if not shown:
        lines.append("no module call in both: nothing to compare call by call")
    else:
        lines.append(
            f"{len(c.matched)} module calls in both; the {len(shown)} that changed most "
            "(largest |log ratio|; no ratio where a value is missing or 0):"
        )
    rows = [
        [
            m.key,
            m.module_type,
            format_value(unit, m.a),
            format_value(unit, m.b),
            format_value("ratio", m.ratio),
        ]
        for m in shown
    ]
    if rows:
        lines += render_columns(["module", "type", "A", "B", "B / A"], rows, {2, 3, 4})
    for label, only in (("A", c.only_a), ("B", c.only_b)):
        if not only:
            continue
        lines.append(f"only in {label} ({len(only)} module calls):")
        rows = [
            [v.key, v.module_type, format_value(unit, v.rank if c.mode.rank_by else v.value)]
            for v in only[:top]
        ]
        lines += render_columns(["module", "type", label], rows, {2})
        if len(only) > top:
            lines.append(f"  ... and {len(only) - top} more")
    return "\n".join(lines) + "\n"
