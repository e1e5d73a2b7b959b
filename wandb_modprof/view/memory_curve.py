"""The memory curve of the step's timeline (`mem` rows) and the meta triples that describe it:
the curve (`Sample.memory`) downsampled to a budget of points, the peak always kept exactly,
and its source, its peak and the call running at the peak (`view/call_times.py`).
`view/timeline.py` says how many points the curve may keep.
"""

from __future__ import annotations

import numpy as np

from wandb_modprof.records.sample import MemoryCurve, Sample
from wandb_modprof.view.call_times import running_at


def downsample(curve: MemoryCurve, points: int) -> tuple[tuple[float, int], ...]:
    """At most `points` (t, bytes) of the curve: each of `points // 2` equal time buckets keeps
    its lowest and highest point (the first of equals), in time order (the peak is kept
    exactly)."""
    pairs = list(zip(curve.t_ms, curve.live_bytes, strict=True))
    if len(pairs) <= points:
        return tuple(pairs)
    buckets = max(points // 2, 1)
    t = np.asarray(curve.t_ms, dtype=np.float64)
    live = np.asarray(curve.live_bytes)
    t0, t1 = t[0], t[-1]
    width = (t1 - t0) / buckets or 1.0
    if live.dtype.kind not in "iuf" or not np.isfinite(t).all() or not np.isfinite(width):
        return _downsample_loop(pairs, buckets, t0, width)  # a damaged or huge-valued file
    bucket = np.minimum(np.trunc((t - t0) / width), buckets - 1)
    index = np.arange(len(t))
    # per bucket the first lowest and the first highest point: sort by (bucket, value, index)
    lowest = np.lexsort((index, live, bucket))
    highest = np.lexsort(
        (index, -live.astype(np.float64) if live.dtype.kind == "u" else -live, bucket)
    )
    starts = np.flatnonzero(np.r_[True, np.diff(bucket[lowest]) != 0])
    chosen = np.union1d(lowest[starts], highest[starts])
    return tuple(pairs[i] for i in chosen.tolist())


def _downsample_loop(
    pairs: list[tuple[float, int]], buckets: int, t0: float, width: float
) -> tuple[tuple[float, int], ...]:
    kept: dict[int, list[int]] = {}  # bucket -> [index of its lowest, index of its highest]
    for i, (t, b) in enumerate(pairs):
        k = min(int((t - t0) / width), buckets - 1)
        have = kept.get(k)
        if have is None:
            kept[k] = [i, i]
            continue
        if b < pairs[have[0]][1]:
            have[0] = i
        if b > pairs[have[1]][1]:
            have[1] = i
    chosen = sorted({i for pair in kept.values() for i in pair})
    return tuple(pairs[i] for i in chosen)


def curve_meta(
    sample: Sample | None, curve: MemoryCurve | None
) -> tuple[tuple[str, str, float | None], ...]:
    """`timeline` (text: the curve's source, "" without one; number: the sample's step),
    `mem_peak` (text: the key of the call running at the curve's peak, "" if none was;
    number: the peak's live bytes) and `mem_peak_ms` (text: "forward" or "backward"; number:
    when)."""
    if sample is None or curve is None or not curve.live_bytes:
        step = float(sample.step) if sample is not None else None
        return (("timeline", "", step), ("mem_peak", "", None), ("mem_peak_ms", "", None))
    top = max(range(len(curve.live_bytes)), key=curve.live_bytes.__getitem__)
    at = curve.t_ms[top]
    key, phase = running_at(sample, at)
    return (
        ("timeline", curve.source, float(sample.step)),
        ("mem_peak", key, float(curve.live_bytes[top])),
        ("mem_peak_ms", phase, at),
    )
