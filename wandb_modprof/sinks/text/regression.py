"""A regression gate: did any module call of profile B get slower (or bigger) than profile A
allows? What `wandb-modprof compare A B --fail-above 1.10` and `wandb_modprof.check_regression`
decide.

>>> check = regression_check(base, new, fail_above=1.10, mode_key="fwd_bwd")   # doctest: +SKIP
>>> check.passed, [m.key for m in check.regressed]                            # doctest: +SKIP
(False, ['encoder.layer.3.attn#0', 'encoder.layer.3#0'])

The rules, in order, for the model total and every module call found in both profiles:

1. Only modes whose values add up to a model total take part (time, memory, FLOPs): a share of
   the step exists there, and bigger is worse. Each side has two values of a call: the one the
   panel colours by (`values.mode_values`: the median over the samples) and its fastest sample
   (the minimum over the samples; a mode that sums two columns, fwd + bwd, sums their minima).
2. The call holds at least `min_share` of the model total in A or in B (a call that grew from
   nothing to a large share counts).
3. Its fastest ratio, fastest B / fastest A, is above `fail_above` (a value that went from 0 to
   more than 0 is an infinite ratio; a value missing on either side is not compared).

In the time modes the step's phases measured in both profiles (`records.phases`: between steps,
forward, loss, backward, optimizer) are rows too, keyed "(phase) <name>", by the same rules;
a phase's share is of the sum of the phases' medians.

Why the fastest sample decides: what disturbs a measurement (another process on the core, a
garbage collection, a page fault, a host hiccup) only ever adds time, so the fastest sample of
each side is the one nearest the work itself, and one slow outlier, or a whole profile taken
on a busy machine, moves it far less than the median or the spread. A call whose median ratio
is above the limit while its fastest ratio is not is listed as "within the samples' spread",
not counted: some samples got slower, the work did not. Counts, FLOPs and bytes that do not
vary have equal median and minimum. Calls found in one profile only are listed, not counted:
their cost shows in their parent's and in the model total, which are checked.

Limits: a sample faster than the work it measures is not expected; where a call's work itself
varies between steps (data-dependent routing sends fewer tokens to an expert in one step), its
fastest sample is its lightest step: profile the same inputs on both sides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.modes import MODES, Mode, Unit
from wandb_modprof.records.phases import PHASE_LABELS, PHASES, PhaseStats
from wandb_modprof.records.snapshot import as_data
from wandb_modprof.sinks.escape import escape_text
from wandb_modprof.sinks.text.summary import render_columns
from wandb_modprof.sinks.text.values import ModeValues, check_mode, mode_values, total_metrics
from wandb_modprof.view.units import format_value

if TYPE_CHECKING:
    from wandb_modprof.records.sample import ModuleStats
    from wandb_modprof.records.snapshot import ProfileData, SupportsSnapshot

GATED_MODES: tuple[str, ...] = tuple(m.key for m in MODES if m.total)
TOTAL_KEY = "(model total)"
PHASE_KEY = "(phase) "  # a step phase's row: "(phase) between steps" (`records.phases`)
DEFAULT_MIN_SHARE = 0.01


@dataclass(frozen=True)
class Side:
    """One side's values of a call: the median the panel shows and the fastest sample."""

    value: float
    fastest: float  # the sum of the mode's columns' minima (`value` where it is not sampled)
    samples: int  # samples of the call (0: a value that is not sampled, e.g. FLOPs)


def ratio(a: float, b: float) -> float:
    """b / a; a value that went from 0 to more than 0 is an infinite ratio, 0 to 0 is 1."""
    if a <= 0:
        return math.inf if b > a else 1.0
    return b / a


@dataclass(frozen=True)
class CheckedCall:
    """A call above the limit: counted when its fastest ratio is (rule 3), listed as within
    the samples' spread when only its median ratio is."""

    key: str  # call key, or TOTAL_KEY for the model total
    module_type: str
    share: float  # the larger of its shares of the model total in A and in B
    a: Side
    b: Side

    @property
    def ratio(self) -> float:
        """Median B / median A: the ratio the panel's compare mode colours by."""
        return ratio(self.a.value, self.b.value)

    @property
    def fastest_ratio(self) -> float:
        """Fastest B / fastest A: what decides."""
        return ratio(self.a.fastest, self.b.fastest)


@dataclass(frozen=True)
class RegressionCheck:
    """The verdict of `check_regression` (and `compare --fail-above`): `passed` unless
    `regressed` holds a call; `format()` is the text the command line prints. `compared`
    counts the model total and the calls checked (in both profiles, measured, holding at least
    `min_share`); `within_noise` the calls whose median ratio is above the limit and whose
    fastest ratio is not (not counted); `only_a` / `only_b` the calls found in one profile
    only."""

    mode: Mode
    fail_above: float
    min_share: float
    label_a: str
    label_b: str
    model_a: str
    model_b: str
    samples_a: int
    samples_b: int
    compared: int  # calls (and the total) compared: in both, measured, share >= min_share
    regressed: tuple[CheckedCall, ...]  # largest fastest ratio first
    within_noise: tuple[CheckedCall, ...]  # median above the limit, fastest sample not
    only_a: int  # calls in one profile only (not counted)
    only_b: int

    @property
    def passed(self) -> bool:
        return not self.regressed

    def format(self) -> str:
        return format_check(self)


def check_limits(fail_above: object, min_share: object, mode_key: object) -> Mode:
    """The gate's settings, or a ModProfError naming the one that is wrong."""
    if isinstance(fail_above, bool) or not isinstance(fail_above, (int, float)):
        raise ModProfError(f"fail_above expected a ratio >= 1 (e.g. 1.10); got {fail_above!r}")
    if not (math.isfinite(fail_above) and fail_above >= 1.0):
        raise ModProfError(f"fail_above expected a finite ratio >= 1 (e.g. 1.10); got {fail_above}")
    if isinstance(min_share, bool) or not isinstance(min_share, (int, float)):
        raise ModProfError(f"min_share expected a fraction in [0, 1]; got {min_share!r}")
    if not 0.0 <= min_share <= 1.0:  # (NaN fails too)
        raise ModProfError(f"min_share expected a fraction in [0, 1]; got {min_share}")
    m = check_mode(mode_key)  # type: ignore[arg-type]  # (a non-string is refused there)
    if m.key not in GATED_MODES:
        raise ModProfError(
            f"mode {m.key!r} has no model total to take shares of, so it cannot gate a "
            f"regression; expected one of {', '.join(GATED_MODES)}"
        )
    return m


def regression_check(
    a: ProfileData | SupportsSnapshot,
    b: ProfileData | SupportsSnapshot,
    fail_above: float = 1.10,
    mode_key: str = "fwd_bwd",
    min_share: float = DEFAULT_MIN_SHARE,
    label_a: str = "A",
    label_b: str = "B",
) -> RegressionCheck:
    """Check profile `b` against the baseline `a` (rules in the module docstring)."""
    m = check_limits(fail_above, min_share, mode_key)
    da, db = as_data(a, "regression_check()"), as_data(b, "regression_check()")
    va, vb = mode_values(da, m.key), mode_values(db, m.key)
    total_a = _spread(va.total, da.stats.get(va.root_key), total_metrics(m))
    total_b = _spread(vb.total, db.stats.get(vb.root_key), total_metrics(m))
    in_b = {v.key: v for v in vb.modules}
    pairs: list[tuple[str, str, Side | None, Side | None]] = [(TOTAL_KEY, "", total_a, total_b)]
    for v in va.modules:
        w = in_b.get(v.key)
        if w is not None:
            pairs.append((
                v.key,
                v.module_type,
                _spread(v.value, da.stats.get(v.key), m.columns),
                _spread(w.value, db.stats.get(v.key), m.columns),
            ))  # fmt: skip
    if m.unit == Unit.MS:  # the step's phases beside the calls, as their shares of the step
        pairs += phase_pairs(da.phases, db.phases)
    compared = 0
    regressed: list[CheckedCall] = []
    noise: list[CheckedCall] = []
    for key, module_type, sa, sb in pairs:
        if sa is None or sb is None:
            continue
        if key == TOTAL_KEY:
            share = 1.0
        elif key.startswith(PHASE_KEY):
            share = max(phase_share(sa.value, da.phases), phase_share(sb.value, db.phases))
        else:
            share = max(_share(sa.value, va), _share(sb.value, vb))
        if share < min_share:
            continue
        compared += 1
        call = CheckedCall(key, module_type, share, sa, sb)
        if call.fastest_ratio > fail_above:
            regressed.append(call)
        elif call.ratio > fail_above:
            noise.append(call)
    # stable: ties keep the table's order
    regressed.sort(key=lambda c: c.fastest_ratio, reverse=True)
    noise.sort(key=lambda c: c.ratio, reverse=True)
    keys_a = {v.key for v in va.modules}
    return RegressionCheck(
        mode=m,
        fail_above=float(fail_above),
        min_share=float(min_share),
        label_a=label_a,
        label_b=label_b,
        model_a=da.model_name,
        model_b=db.model_name,
        samples_a=da.num_samples,
        samples_b=db.num_samples,
        compared=compared,
        regressed=tuple(regressed),
        within_noise=tuple(noise),
        only_a=sum(1 for v in va.modules if v.key not in in_b),
        only_b=sum(1 for v in vb.modules if v.key not in keys_a),
    )


def _spread(
    value: float | None, stats: ModuleStats | None, columns: tuple[str, ...]
) -> Side | None:
    """`value` with the fastest sample of the metrics it is made of (None: not measured)."""
    if value is None or not math.isfinite(value):
        return None
    sampled = [stats.metrics.get(c) for c in columns] if stats is not None else []
    stats_known = [s for s in sampled if s is not None]
    if not stats_known:
        return Side(value, value, 0)  # FLOPs: a count, not a sample statistic
    fastest = sum(s.min for s in stats_known)
    if not math.isfinite(fastest):
        fastest = value  # a column with no measured sample: the median is all there is
    return Side(value, fastest, min(s.count for s in stats_known))


def _share(value: float, values: ModeValues) -> float:
    share = values.share(value)
    return 0.0 if share is None else share


def format_check(c: RegressionCheck) -> str:
    """The verdict as terminal text: the settings, the calls counted, those within noise."""
    unit = c.mode.unit
    label_a, label_b = escape_text(c.label_a), escape_text(c.label_b)
    lines = [
        f"regression check, mode {c.mode.key} ({c.mode.label}): B = {label_b} against "
        f"A = {label_a}; fail above {c.fail_above:g}x for calls holding >= "
        f"{100 * c.min_share:g}% of the model total in A or B; {c.compared} compared"
    ]
    if c.model_a != c.model_b:
        lines.append(
            f"NOTE: A and B are different models ({escape_text(c.model_a)}, "
            f"{escape_text(c.model_b)})"
        )
    if min(c.samples_a, c.samples_b) < 2:
        lines.append(
            f"NOTE: {min(c.samples_a, c.samples_b)} sample on one side: its fastest sample is "
            "its only one, so one disturbed step decides; profile 3 or more steps"
        )

    def table(calls: tuple[CheckedCall, ...]) -> list[str]:
        rows = [
            [
                x.key,
                x.module_type,
                f"{100 * x.share:.1f}%",
                format_value(unit, x.a.value),
                format_value(unit, x.b.value),
                _ratio_text(x.ratio),
                format_value(unit, x.a.fastest),
                format_value(unit, x.b.fastest),
                _ratio_text(x.fastest_ratio),
            ]
            for x in calls
        ]
        head = ["module", "type", "share", "A", "B", "B / A", "fastest A", "fastest B", "B / A"]
        return render_columns(head, rows, {2, 3, 4, 5, 6, 7, 8})

    if c.regressed:
        lines.append(
            f"FAILED: {len(c.regressed)} regressed (their fastest samples; A, B: medians):"
        )
        lines += table(c.regressed)
    else:
        lines.append("PASSED: no call regressed")
    if c.within_noise:
        lines.append(
            f"{len(c.within_noise)} above {c.fail_above:g}x in their medians but not in their "
            "fastest samples: within the samples' spread, not counted:"
        )
        lines += table(c.within_noise)
    if c.only_a or c.only_b:
        lines.append(
            f"not compared: {c.only_a} calls only in A, {c.only_b} only in B "
            "(their cost shows in their parents' and the model total)"
        )
    return "\n".join(lines) + "\n"


def _ratio_text(value: float) -> str:
    return "inf" if math.isinf(value) else format_value("ratio", value)


def phase_pairs(
    a: PhaseStats | None, b: PhaseStats | None
) -> list[tuple[str, str, Side | None, Side | None]]:
    """The phases measured in both profiles as the gate's rows: (key, kind, side A, side B),
    each side its median and its fastest sample."""
    if a is None or b is None:
        return []
    return [
        (
            PHASE_KEY + PHASE_LABELS[p],
            "step phase",
            Side(a.median_ms[p], a.min_ms[p], a.samples[p]),
            Side(b.median_ms[p], b.min_ms[p], b.samples[p]),
        )
        for p in PHASES
        if p in a.median_ms and p in b.median_ms
    ]


def phase_share(value: float, phases: PhaseStats | None) -> float:
    """`value`'s share of the step as its phases tell it (0: no phases)."""
    step = phases.step_ms() if phases is not None else 0.0
    return value / step if step > 0 else 0.0
