"""A later sample's table reuses what did not change (`view/rows.py` fixed rows,
`view/group_nodes.py` merged views, `records/stat_columns.py` value columns; the curve downsampled
as arrays in `view/memory_curve.py`) and is equal, row for row, to the same profile's table built
with nothing kept."""

from __future__ import annotations

import random

import torch
from torch import nn

import wandb_modprof
from wandb_modprof.records.sample import MemoryCurve
from wandb_modprof.records.stat_columns import ColumnMetrics
from wandb_modprof.view import graphs, group_nodes, layout, rows
from wandb_modprof.view.columns import SPREAD_METRICS
from wandb_modprof.view.memory_curve import _downsample_loop, downsample


def _wide() -> nn.Module:
    # 6 stages of 30 blocks: too many rows for a 400-row table, so views are capped and merged
    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    return nn.Sequential(*(nn.Sequential(*(block() for _ in range(30))) for _ in range(6)))


def _clear() -> None:
    for cache in (layout._LAYOUTS, graphs._GRAPHS, rows._FIXED, group_nodes._MERGED):
        cache.clear()


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).pow(2).mean().backward()
    model.zero_grad(set_to_none=True)


def test_a_later_table_equals_one_built_from_nothing_and_reuses_the_fixed_rows() -> None:
    torch.manual_seed(0)
    model, x = _wide(), torch.randn(3, 4)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            _step(model, x)
        _clear()
        first = prof.table(max_rows=400)
        assert first.reduced  # the views were fitted to the budget
        assert group_nodes._MERGED  # some views merged their cheapest modules
        fixed_before = dict(rows._FIXED)
        _step(model, x)
    later = prof.table(max_rows=400)
    reused = [k for k, v in fixed_before.items() if rows._FIXED.get(k) is v]
    assert reused  # the fixed rows of unchanged views were not rebuilt
    _clear()
    fresh = prof.table(max_rows=400)
    assert later.rows == fresh.rows and later.reduced == fresh.reduced
    assert later.rows != first.rows  # (the statistics moved: the comparison can fail)


def test_the_value_columns_read_from_the_arrays_equal_the_running_statistics() -> None:
    model, x = _wide(), torch.randn(3, 4)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            _step(model, x)
    stats = prof.stats()
    checked = 0
    for s in stats.values():
        metrics = s.metrics
        assert isinstance(metrics, ColumnMetrics)
        want: dict[str, float] = {}
        for name, stat in dict(metrics.items()).items():
            want[name] = stat.typical
            if name in SPREAD_METRICS:
                for field in ("mean", "std", "min", "max", "last"):
                    want[f"{name}_{field}"] = getattr(stat, field)
            assert s.typical(name) == stat.typical and s.count(name) == stat.count
            checked += 1
        assert metrics.value_columns(SPREAD_METRICS) == want
    assert checked > 1000
    some = next(iter(stats.values()))
    assert some.typical("not_a_metric") is None and some.count("not_a_metric") == 0


def test_the_vectorised_curve_keeps_the_same_points_as_the_loop() -> None:
    rng = random.Random(3)
    for trial in range(300):
        n = rng.randint(2, 2000)
        if trial % 3:
            t = sorted(rng.uniform(0, 50) for _ in range(n))
        else:  # equal times and equal values: ties keep the first
            t = [float(i // 7) for i in range(n)]
        live = [rng.randint(0, 40) for _ in range(n)]
        points = rng.choice([1, 2, 3, 10, 100, 1000])
        if n <= points:
            continue
        curve = MemoryCurve(source="test", t_ms=tuple(t), live_bytes=tuple(live))
        buckets = max(points // 2, 1)
        width = (t[-1] - t[0]) / buckets or 1.0
        want = _downsample_loop(list(zip(t, live, strict=True)), buckets, t[0], width)
        assert downsample(curve, points) == want
        assert max(live) in [b for _, b in want]  # the peak is kept
