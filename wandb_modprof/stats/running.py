"""Running statistics per call key across samples: Welford (stable, O(1) memory) for the
mean, std, min and max, and a bounded window of sample values for the median, kept as arrays
(a row per call key, a column per metric) and updated for a whole sample at once.

The median is what the profile colours and ranks by (`RunningStat.typical`): with a handful
of samples one pause inside one call (a full garbage collection, a host hiccup) moves the mean
by a third of the pause, and the median not at all. It is exact over the first
`MEDIAN_WINDOW` samples, then the median of the latest `MEDIAN_WINDOW`: a bounded, deterministic
choice (a reservoir would need a random draw per sample and could not follow a run whose speed
changes). Windows are kept per metric, only for the call keys whose value has varied, and
only as wide as the samples so far: a constant metric (parameter bytes, most activation
sizes) keeps no window at all.

Why arrays: a 28,000-call sample folds ~400,000 values and freezing built one object per call
key and metric; per value in Python that was ~120 ms a fold and ~300 ms a freeze for 10,000
calls. The arithmetic is the scalar update's, in the same order, element by element (IEEE
doubles either way): the statistics are bit for bit the same.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from operator import attrgetter
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from wandb_modprof.records.sample import METRICS, InvocationRecord, ModuleStats
from wandb_modprof.records.stat_columns import METRIC_INDEX, ColumnMetrics, StatColumns

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


Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
_G = TypeVar("_G", bound=np.generic)
_N = len(METRICS)
_metric_values_of = attrgetter(*METRICS)  # every metric of a record, in `METRICS` order


def _grown(arr: npt.NDArray[_G], rows: int, fill: object) -> npt.NDArray[_G]:
    """`arr` with `rows` rows, the new ones set to `fill`."""
    out = np.full((rows, *arr.shape[1:]), fill, arr.dtype)
    out[: len(arr)] = arr
    return out


class StatsAccumulator:
    """Folds samples into per-key running statistics. Size grows with distinct keys only
    (and, per key and varying metric, at most `MEDIAN_WINDOW` values)."""

    def __init__(self) -> None:
        self._rows: dict[str, int] = {}  # call key -> row, in the order keys were first seen
        self._meta: list[InvocationRecord] = []  # per row, the key's latest record
        cap = 0
        self._count: Ints = np.zeros((cap, _N), np.int64)
        self._mean: Floats = np.zeros((cap, _N))
        self._m2: Floats = np.zeros((cap, _N))
        self._min: Floats = np.full((cap, _N), np.inf)
        self._max: Floats = np.full((cap, _N), -np.inf)
        self._last: Floats = np.zeros((cap, _N))
        self._varied: npt.NDArray[np.bool_] = np.zeros((cap, _N), bool)  # differed once
        self._gc_samples: Ints = np.zeros(cap, np.int64)
        # per metric column that has varied anywhere: (capacity, width) sample values, the
        # latest `min(count, MEDIAN_WINDOW)` of a varied key at [:count], oldest overwritten
        self._windows: dict[int, Floats] = {}

    def fold(self, records: Sequence[InvocationRecord]) -> None:
        if not records:
            return
        rows = self._rows_of(records)
        if len(set(rows)) < len(rows):  # a key twice in one sample: fold in order, one by one
            for rec in records:
                self.fold((rec,))
            return
        for rec, row in zip(records, rows, strict=True):
            self._meta[row] = rec
        held = [row for rec, row in zip(records, rows, strict=True) if held_collection(rec)]
        self._gc_samples[held] += 1
        # None (not measured) reads as NaN: skipped like a NaN or an infinity
        values = np.array([_metric_values_of(rec) for rec in records], dtype=np.float64)
        self._update(np.asarray(rows, np.intp), values)

    def _rows_of(self, records: Sequence[InvocationRecord]) -> list[int]:
        index, rows = self._rows, []
        for rec in records:
            row = index.get(rec.key)
            if row is None:
                row = index[rec.key] = len(index)
                self._meta.append(rec)
            rows.append(row)
        self._reserve(len(index))
        return rows

    def _reserve(self, n: int) -> None:
        cap = len(self._count)
        if n <= cap:
            return
        grown = max(n, 2 * cap, 64)
        self._count, self._gc_samples = (
            _grown(self._count, grown, 0),
            _grown(self._gc_samples, grown, 0),
        )
        self._mean, self._m2 = _grown(self._mean, grown, 0.0), _grown(self._m2, grown, 0.0)
        self._last = _grown(self._last, grown, 0.0)
        self._min, self._max = _grown(self._min, grown, np.inf), _grown(self._max, grown, -np.inf)
        self._varied = _grown(self._varied, grown, False)
        self._windows = {col: _grown(w, grown, 0.0) for col, w in self._windows.items()}

    def _update(self, rows: npt.NDArray[np.intp], values: Floats) -> None:
        ok = np.isfinite(values)
        count = self._count[rows]
        mean, last = self._mean[rows], self._last[rows]
        new_count = count + ok
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = values - mean
            new_mean = np.where(ok, mean + delta / new_count, mean)
            m2 = self._m2[rows]
            new_m2 = np.where(ok, m2 + delta * (values - new_mean), m2)
        minimum, maximum = self._min[rows], self._max[rows]
        self._min[rows] = np.where(ok & (values < minimum), values, minimum)
        self._max[rows] = np.where(ok & (values > maximum), values, maximum)
        self._count[rows], self._mean[rows], self._m2[rows] = new_count, new_mean, new_m2
        self._last[rows] = np.where(ok, values, last)
        varied = self._varied[rows]
        starts = ok & ~varied & (count > 0) & (values != last)  # a key's first differing value
        self._varied[rows] = varied | starts
        keep = ok & (varied | starts)  # values that go into a window
        for c in np.flatnonzero(keep.any(axis=0)).tolist():
            self._windowed(c, rows, values[:, c], count[:, c], last[:, c], keep[:, c], starts[:, c])

    def _windowed(
        self,
        col: int,
        rows: npt.NDArray[np.intp],
        values: Floats,
        count: npt.NDArray[np.int64],
        last: Floats,
        keep: npt.NDArray[np.bool_],
        starts: npt.NDArray[np.bool_],
    ) -> None:
        width = int(min(int(count[keep].max()) + 1, MEDIAN_WINDOW))
        window = self._windows.get(col)
        if window is None or window.shape[1] < width:
            wider = np.zeros((len(self._count), max(width, min(2 * width, MEDIAN_WINDOW))))
            if window is not None:
                wider[:, : window.shape[1]] = window
            window = self._windows[col] = wider
        # a key that starts varying: its past values all equalled its last one
        window[rows[starts], :] = last[starts, None]
        window[rows[keep], count[keep] % MEDIAN_WINDOW] = values[keep]

    def _columns(self) -> StatColumns:
        n = len(self._rows)
        count = self._count[:n].copy()
        with np.errstate(invalid="ignore", divide="ignore"):
            std = np.sqrt(self._m2[:n] / count)  # population std: 0 with one sample
        median = self._last[:n].copy()  # every value of a key that never varied was its last
        for col, window in self._windows.items():
            varied = np.flatnonzero(self._varied[:n, col])
            if not len(varied):
                continue
            kept = np.minimum(count[varied, col], MEDIAN_WINDOW)
            width = window.shape[1]
            values = np.where(np.arange(width) < kept[:, None], window[varied], np.inf)
            values.sort(axis=1)
            lo = np.take_along_axis(values, ((kept - 1) // 2)[:, None], axis=1)[:, 0]
            hi = np.take_along_axis(values, (kept // 2)[:, None], axis=1)[:, 0]
            median[varied, col] = np.where(kept % 2 == 1, hi, (lo + hi) / 2)
        # A zero median is +0.0: which of 0.0 and -0.0 sorts first is not defined.
        median += 0.0
        return StatColumns(
            count=count, mean=self._mean[:n].copy(), std=std, min=self._min[:n].copy(),
            max=self._max[:n].copy(), last=self._last[:n].copy(), median=median,
        )  # fmt: skip

    def snapshot(self, exclude: Collection[str] = ()) -> dict[str, ModuleStats]:
        """The statistics of every call key but those in `exclude`."""
        columns = self._columns()
        gc_samples = self._gc_samples[: len(self._rows)].tolist()
        out: dict[str, ModuleStats] = {}
        for row, rec in enumerate(self._meta):
            if rec.key in exclude:
                continue
            out[rec.key] = ModuleStats(
                key=rec.key,
                module_name=rec.module_name,
                module_type=rec.module_type,
                call_index=rec.call_index,
                parent_key=rec.parent_key,
                depth=rec.depth,
                order=rec.order,
                metrics=ColumnMetrics(columns, row),
                gc_samples=gc_samples[row],
            )
        return out

    def means(
        self, metrics: tuple[str, ...]
    ) -> tuple[dict[str, tuple[float | None, ...]], dict[str, int]]:
        """Per key the running means of `metrics` (None: not measured) and the sample count
        (of fwd_ms), without freezing every statistic."""
        n = len(self._rows)
        where = [METRIC_INDEX[m] for m in metrics]
        picked = np.where(self._count[:n, where] > 0, self._mean[:n, where], np.nan).tolist()
        counts = self._count[:n, METRIC_INDEX["fwd_ms"]].tolist()
        means: dict[str, tuple[float | None, ...]] = {}
        out_counts: dict[str, int] = {}
        for key, row in self._rows.items():
            means[key] = tuple(None if math.isnan(v) else v for v in picked[row])
            out_counts[key] = counts[row]
        return means, out_counts
