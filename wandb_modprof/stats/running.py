"""Running statistics per call key across samples (Welford: stable, O(1) memory)."""

from __future__ import annotations

import math

from wandb_modprof.records.sample import METRICS, InvocationRecord, ModuleStats, RunningStat


class _Welford:
    __slots__ = ("count", "last", "m2", "maximum", "mean", "minimum")

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.minimum = math.inf
        self.maximum = -math.inf
        self.last = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        self.last = value

    def freeze(self) -> RunningStat:
        # Population std: with one sample it is 0, not undefined.
        std = math.sqrt(self.m2 / self.count) if self.count else 0.0
        return RunningStat(self.count, self.mean, std, self.minimum, self.maximum, self.last)


class StatsAccumulator:
    """Folds samples into per-key running statistics. Size grows with distinct keys only."""

    def __init__(self) -> None:
        self._meta: dict[str, InvocationRecord] = {}
        self._stats: dict[str, dict[str, _Welford]] = {}

    def fold(self, records: tuple[InvocationRecord, ...]) -> None:
        for rec in records:
            self._meta[rec.key] = rec
            per_metric = self._stats.setdefault(rec.key, {})
            for metric in METRICS:
                value = getattr(rec, metric)
                if value is None or (isinstance(value, float) and not math.isfinite(value)):
                    continue
                acc = per_metric.get(metric)
                if acc is None:
                    acc = per_metric[metric] = _Welford()
                acc.add(float(value))

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
                metrics={m: acc.freeze() for m, acc in self._stats[key].items()},
            )
        return out

    def means(
        self, metrics: tuple[str, ...]
    ) -> tuple[dict[str, tuple[float | None, ...]], dict[str, int]]:
        """Per key the running means of `metrics` (None: not measured) and the sample count
        (of fwd_ms), without freezing every statistic."""
        means: dict[str, tuple[float | None, ...]] = {}
        counts: dict[str, int] = {}
        for key, per_metric in self._stats.items():
            accs = [per_metric.get(m) for m in metrics]
            means[key] = tuple(None if a is None else a.mean for a in accs)
            fwd = per_metric.get("fwd_ms")
            counts[key] = fwd.count if fwd is not None else 0
        return means, counts
