"""Running statistics per call key across samples: Welford (stable, O(1) memory) for the
mean, std, min and max, and a bounded window of sample values for the median.

The median is what the profile colours and ranks by (`RunningStat.typical`): with a handful
of samples one pause inside one call (a full garbage collection, a host hiccup) moves the mean
by a third of the pause, and the median not at all. It is exact over the first
`MEDIAN_WINDOW` samples, then the median of the latest `MEDIAN_WINDOW`: a bounded, deterministic
choice (a reservoir would need a random draw per sample and could not follow a run whose speed
changes). Values are kept as C doubles (`array('d')`, 8 bytes each), and only once a metric
varies: a constant metric (parameter bytes, most activation sizes) keeps no window at all.
"""

from __future__ import annotations

import math
from array import array
from operator import attrgetter

from wandb_modprof.records.frozen import frozen
from wandb_modprof.records.sample import METRICS, InvocationRecord, ModuleStats, RunningStat

MEDIAN_WINDOW = 64  # sample values kept per key and metric (at most 512 bytes each)
# A sample "held a garbage collection" (`ModuleStats.gc_samples`) when collections took at
# least this share of the call's forward + backward time in it. Young collections run every
# 700 net allocations (about one per sampled TinyGPT step, ~2 ms per sampled step of the demo's
# GPT-2 in all): counting every one would flag calls for pauses of no consequence. All
# collection time is in `gc_ms`.
GC_FLAG_SHARE = 0.05


def held_collection(rec: InvocationRecord) -> bool:
    """Collections inside this call took a noticeable share (`GC_FLAG_SHARE`) of its time."""
    if not rec.gc_ms:
        return False
    spent = rec.fwd_ms + (rec.bwd_ms or 0.0)
    return not rec.gc_ms < GC_FLAG_SHARE * spent  # (NaN times: flagged, a pause is known)


class _Welford:
    __slots__ = ("count", "last", "m2", "maximum", "mean", "minimum", "pos", "window")

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.minimum = math.inf
        self.maximum = -math.inf
        self.last = 0.0
        # None while every value so far equals `last`: the window would only repeat it.
        self.window: array[float] | None = None
        self.pos = 0  # where the next value goes once the window is full (oldest first)

    def add(self, value: float) -> None:
        if self.window is None and self.count and value != self.last:
            self.window = array("d", [self.last]) * min(self.count, MEDIAN_WINDOW)
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        self.last = value
        window = self.window
        if window is not None:
            if len(window) < MEDIAN_WINDOW:
                window.append(value)
            else:
                window[self.pos] = value
                self.pos = (self.pos + 1) % MEDIAN_WINDOW

    def median(self) -> float:
        if self.window is None:
            return self.last  # every value so far was this one
        ordered = sorted(self.window)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    def freeze(self) -> RunningStat:
        # Population std: with one sample it is 0, not undefined.
        std = math.sqrt(self.m2 / self.count) if self.count else 0.0
        median = self.median() if self.count else None
        # (`frozen`: the dataclass's own __init__ was half the time of freezing a profile)
        return frozen(
            RunningStat,
            {
                "count": self.count, "mean": self.mean, "std": std, "min": self.minimum,
                "max": self.maximum, "last": self.last, "median": median,
            },
        )  # fmt: skip


class StatsAccumulator:
    """Folds samples into per-key running statistics. Size grows with distinct keys only
    (and, per key and varying metric, at most `MEDIAN_WINDOW` values)."""

    def __init__(self) -> None:
        self._meta: dict[str, InvocationRecord] = {}
        # per key, one accumulator per metric in `METRICS` order (None: never measured)
        self._stats: dict[str, list[_Welford | None]] = {}
        self._gc_samples: dict[str, int] = {}

    def fold(self, records: tuple[InvocationRecord, ...]) -> None:
        # The hot loop of resolving a sample (a 28,500-call MoE step folds ~400,000 values):
        # the metric values are read in one C call (`attrgetter`) and `_Welford.add` is inlined
        # (same arithmetic, same order), which halves its time.
        window_size = MEDIAN_WINDOW
        stats, meta, held_by_key = self._stats, self._meta, self._gc_samples
        n = len(METRICS)
        for rec in records:
            key = rec.key
            meta[key] = rec
            accs = stats.get(key)
            if accs is None:
                accs = stats[key] = [None] * n
            held = held_by_key.get(key, 0)
            held_by_key[key] = held + 1 if held_collection(rec) else held
            for i, raw in enumerate(_metric_values_of(rec)):
                if raw is None:
                    continue
                acc = accs[i]
                if (
                    type(raw) is int
                    and acc is not None
                    and acc.window is None
                    and acc.count
                    and raw == acc.last
                    and (raw or math.copysign(1.0, acc.last) > 0.0)
                ):
                    # A constant integer metric (parameter, buffer, most activation bytes):
                    # every value so far was this one, so the mean is it exactly and m2, min,
                    # max and last would not change: only the count moves (the full update
                    # gives the same numbers; the sign test keeps a -0.0 `last` exact).
                    acc.count += 1
                    continue
                value = float(raw)
                if isinstance(raw, float) and value - value != 0.0:  # NaN or +-inf: skipped
                    continue
                if acc is None:
                    acc = accs[i] = _Welford()
                count = acc.count
                window = acc.window
                if window is None and count and value != acc.last:
                    window = acc.window = array("d", [acc.last]) * min(count, window_size)
                count += 1
                acc.count = count
                mean = acc.mean
                delta = value - mean
                mean += delta / count
                acc.mean = mean
                acc.m2 += delta * (value - mean)
                acc.minimum = min(acc.minimum, value)
                acc.maximum = max(acc.maximum, value)
                acc.last = value
                if window is not None:
                    if len(window) < window_size:
                        window.append(value)
                    else:
                        window[acc.pos] = value
                        acc.pos = (acc.pos + 1) % window_size

    def snapshot(self) -> dict[str, ModuleStats]:
        out: dict[str, ModuleStats] = {}
        for key, rec in self._meta.items():
            out[key] = ModuleStats(
                key=key,
                module_name=rec.module_name,
                module_type=rec.module_type,
                call_index=rec.call_index,
                parent_key=rec.parent_key,
                depth=rec.depth,
                order=rec.order,
                metrics={
                    m: acc.freeze()
                    for m, acc in zip(METRICS, self._stats[key], strict=True)
                    if acc is not None
                },
                gc_samples=self._gc_samples[key],
            )
        return out

    def means(
        self, metrics: tuple[str, ...]
    ) -> tuple[dict[str, tuple[float | None, ...]], dict[str, int]]:
        """Per key the running means of `metrics` (None: not measured) and the sample count
        (of fwd_ms), without freezing every statistic."""
        means: dict[str, tuple[float | None, ...]] = {}
        counts: dict[str, int] = {}
        where = [_INDEX[m] for m in metrics]
        fwd_at = _INDEX["fwd_ms"]
        for key, accs in self._stats.items():
            picked = [accs[i] for i in where]
            means[key] = tuple(None if a is None else a.mean for a in picked)
            fwd = accs[fwd_at]
            counts[key] = fwd.count if fwd is not None else 0
        return means, counts


_metric_values_of = attrgetter(
    *METRICS
)  # every metric of a record, in `METRICS` order, in one call
_INDEX = {m: i for i, m in enumerate(METRICS)}
