"""A regression gate: did any module call of profile B get slower (or bigger) than profile A
allows? What `wandb-modprof compare A B --fail-above 1.10` and `wandb_modprof.check_regression`
decide.

>>> check = regression_check(base, new, fail_above=1.10, mode_key="fwd_bwd")   # doctest: +SKIP
>>> check.passed, [m.key for m in check.regressed]                            # doctest: +SKIP
(False, ['encoder.layer.3.attn#0', 'encoder.layer.3#0'])

The rules, in order, for the model total and every module call found in both profiles:

1. The value is the one the panel colours by in the mode (`values.mode_values`: the median over
   the samples). Only modes whose values add up to a model total take part (time, memory,
   FLOPs): a share of the step exists there, and bigger is worse.
2. The call holds at least `min_share` of the model total in A or in B (a call that grew from
   nothing to a large share counts).
3. Its ratio B / A is above `fail_above` (a value that went from 0 to more than 0 is an
   infinite ratio; a value missing on either side is not compared).
4. Noise: where both profiles hold at least two samples of the call, the change of the median,
   B - A, must exceed `NOISE_Z` standard errors of that difference, estimated from each side's
   own sample spread: `1.2533 * sqrt(sd_A^2 / n_A + sd_B^2 / n_B)` (1.2533 sd / sqrt(n) is the
   standard error of a median of normal samples; combined as in Welch's test). A mode that sums
   two columns (fwd + bwd) takes the sum of their standard deviations, the largest the spread of
   the sum can be. A call with one sample on either side has no spread to go by: rule 3 alone
   decides, and the check says so. Counts, FLOPs and bytes that do not vary pass rule 4 as soon
   as they change.

A call that passes rules 1-3 but not 4 is listed as "within noise", not counted. Calls found in
one profile only are listed, not counted: their cost shows in their parent's and in the model
total, which are checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.modes import MODES, Mode
from wandb_modprof.records.snapshot import as_data
from wandb_modprof.sinks.escape import escape_text
from wandb_modprof.sinks.summary import render_columns
from wandb_modprof.sinks.units import format_value
from wandb_modprof.sinks.values import ModeValues, check_mode, mode_values, total_metrics

if TYPE_CHECKING:
    from wandb_modprof.records.sample import ModuleStats
    from wandb_modprof.records.snapshot import ProfileData, SupportsSnapshot

NOISE_Z = 3.0  # standard errors a change must exceed (one-sided, ~0.13 % per call if normal)
MEDIAN_SE = 1.2533  # sqrt(pi / 2): the standard error of a median over that of a mean
GATED_MODES: tuple[str, ...] = tuple(m.key for m in MODES if m.total)
TOTAL_KEY = "(model total)"
DEFAULT_MIN_SHARE = 0.01


@dataclass(frozen=True)
class Spread:
    """One side's value of a call and the spread it was measured with."""

    value: float
    samples: int  # samples of the call (0: a value that is not sampled, e.g. FLOPs)
    sd: float  # standard deviation over the samples (0 for a value that is not sampled)


@dataclass(frozen=True)
class CheckedCall:
    """A call whose ratio is above the limit (rules 1-3), counted or not (rule 4)."""

    key: str  # call key, or TOTAL_KEY for the model total
    module_type: str
    share: float  # the larger of its shares of the model total in A and in B
    a: Spread
    b: Spread
    z: float | None  # (B - A) in standard errors; None: no spread known (one sample)

    @property
    def ratio(self) -> float:
        return math.inf if self.a.value <= 0 else self.b.value / self.a.value


@dataclass(frozen=True)
class RegressionCheck:
    """The verdict of `check_regression` (and `compare --fail-above`): `passed` unless
    `regressed` holds a call; `format()` is the text the command line prints. `compared`
    counts the model total and the calls checked (in both profiles, measured, holding at least
    `min_share`); `within_noise` the calls above the ratio whose change their samples' spread
    explains (not counted); `only_a` / `only_b` the calls found in one profile only."""

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
    regressed: tuple[CheckedCall, ...]  # largest ratio first
    within_noise: tuple[CheckedCall, ...]  # above the ratio, explained by the spread
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
    pairs: list[tuple[str, str, Spread | None, Spread | None]] = [(TOTAL_KEY, "", total_a, total_b)]
    for v in va.modules:
        w = in_b.get(v.key)
        if w is not None:
            pairs.append((
                v.key,
                v.module_type,
                _spread(v.value, da.stats.get(v.key), m.columns),
                _spread(w.value, db.stats.get(v.key), m.columns),
            ))  # fmt: skip
    compared = 0
    regressed: list[CheckedCall] = []
    noise: list[CheckedCall] = []
    for key, module_type, sa, sb in pairs:
        if sa is None or sb is None:
            continue
        share = max(_share(sa.value, va), _share(sb.value, vb)) if key != TOTAL_KEY else 1.0
        if share < min_share:
            continue
        compared += 1
        call = CheckedCall(key, module_type, share, sa, sb, _z(sa, sb))
        if not call.ratio > fail_above:
            continue
        (regressed if call.z is None or call.z > NOISE_Z else noise).append(call)
    regressed.sort(key=lambda c: c.ratio, reverse=True)  # stable: ties keep the table's order
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
) -> Spread | None:
    """`value` with the spread of the metrics it is made of (None: not measured)."""
    if value is None or not math.isfinite(value):
        return None
    sampled = [stats.metrics.get(c) for c in columns] if stats is not None else []
    stats_known = [s for s in sampled if s is not None]
    if not stats_known:
        return Spread(value, 0, 0.0)  # FLOPs: a count, not a sample statistic
    samples = min(s.count for s in stats_known)
    sd = sum(s.std for s in stats_known if math.isfinite(s.std))
    return Spread(value, samples, sd)


def _share(value: float, values: ModeValues) -> float:
    share = values.share(value)
    return 0.0 if share is None else share


def _z(a: Spread, b: Spread) -> float | None:
    """(B - A) in standard errors of the difference of medians; None where either side was
    sampled once (no spread known); inf where neither varies and they differ."""
    if a.samples == 1 or b.samples == 1:
        return None
    var = (a.sd**2 / a.samples if a.samples else 0.0) + (b.sd**2 / b.samples if b.samples else 0.0)
    diff = b.value - a.value
    if var <= 0:
        return math.inf if diff > 0 else 0.0
    return diff / (MEDIAN_SE * math.sqrt(var))


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
            f"NOTE: {min(c.samples_a, c.samples_b)} sample on one side: no sample spread to "
            "tell a change from noise, the ratio alone decides; profile 3 or more steps"
        )

    def table(calls: tuple[CheckedCall, ...]) -> list[str]:
        rows = [
            [
                x.key,
                x.module_type,
                f"{100 * x.share:.1f}%",
                format_value(unit, x.a.value),
                format_value(unit, x.b.value),
                "inf" if math.isinf(x.ratio) else format_value("ratio", x.ratio),
                "-" if x.z is None else ("inf" if math.isinf(x.z) else f"{x.z:.1f}"),
            ]
            for x in calls
        ]
        head = ["module", "type", "share", "A", "B", "B / A", "z"]
        return render_columns(head, rows, {2, 3, 4, 5, 6})

    if c.regressed:
        lines.append(f"FAILED: {len(c.regressed)} regressed (z: change in standard errors):")
        lines += table(c.regressed)
    else:
        lines.append("PASSED: no call regressed")
    if c.within_noise:
        lines.append(
            f"{len(c.within_noise)} above {c.fail_above:g}x but within their sample spread "
            f"(z <= {NOISE_Z:g}), not counted:"
        )
        lines += table(c.within_noise)
    if c.only_a or c.only_b:
        lines.append(
            f"not compared: {c.only_a} calls only in A, {c.only_b} only in B "
            "(their cost shows in their parents' and the model total)"
        )
    return "\n".join(lines) + "\n"
