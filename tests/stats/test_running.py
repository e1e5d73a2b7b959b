"""Running statistics equal batch statistics (Welford vs numpy)."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wandb_modprof.records.sample import InvocationRecord, RunningStat
from wandb_modprof.stats.running import MEDIAN_WINDOW, StatsAccumulator


class _Welford:
    """The scalar reference: one value at a time, as the statistics are defined (Welford for
    mean / m2, the latest `MEDIAN_WINDOW` values for the median). `StatsAccumulator` updates
    arrays for a whole sample at once and must give exactly these numbers."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.minimum, self.maximum, self.last = math.inf, -math.inf, 0.0
        self.values: list[float] = []
        self.varied = False  # no value differed from the one before: the median is the last

    def add(self, value: float) -> None:
        if not self.varied and self.count > 0 and value != self.last:
            # the past of a constant metric is its last value (0.0 and -0.0 compare equal)
            self.varied, self.values = True, [self.last] * len(self.values)
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        self.last = value
        self.values = [*self.values, value][-MEDIAN_WINDOW:]

    def freeze(self) -> RunningStat:
        ordered = sorted(self.values)
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        median = (median if self.varied else self.last) + 0.0  # a zero median is +0.0
        std = math.sqrt(self.m2 / self.count)
        return RunningStat(
            self.count, self.mean, std, self.minimum, self.maximum, self.last, median
        )


def _folded(values, metric="fwd_ms"):
    """The statistic of `metric` after folding one real record per value."""
    base = _reused_record()
    acc = StatsAccumulator()
    for v in values:
        acc.fold((dataclasses.replace(base, **{metric: v}),))
    return acc, acc.snapshot()[base.key].metrics.get(metric)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=200)
)
def test_running_mean_std_min_max_last_match_numpy(values):
    _, stat = _folded(values)
    arr = np.asarray(values, dtype=np.float64)
    assert stat.count == len(values)
    assert math.isclose(stat.mean, arr.mean(), rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(stat.std, arr.std(), rel_tol=1e-6, abs_tol=1e-5)
    assert stat.min == arr.min() and stat.max == arr.max() and stat.last == values[-1]


def test_profile_stats_fold_every_sample():
    import torch
    from helpers import disabled_run
    from models import Reused

    import wandb_modprof

    model = Reused()
    x = torch.randn(16, 32)
    handle = wandb_modprof.watch(model, log_freq=2, structure=False, run=disabled_run())
    fwd = []
    for _ in range(10):
        model(x).sum().backward()
        if handle.steps % 2 == 0:
            fwd.append(handle.profile().invocations()[0].fwd_ms)
    prof = handle.unwatch()
    root = prof.stats()["<root>#0"].metrics["fwd_ms"]
    assert prof.num_samples == 5 and root.count == 5
    assert math.isclose(root.mean, float(np.mean(fwd)), rel_tol=1e-9)
    assert math.isclose(root.std, float(np.std(fwd)), rel_tol=1e-6, abs_tol=1e-9)
    assert root.last == fwd[-1] and root.max == max(fwd) and root.min == min(fwd)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from([0.0, 1.0, 2.5]), st.floats(-1e6, 1e6, allow_nan=False)),
        min_size=1,
        max_size=3 * MEDIAN_WINDOW,
    )
)
def test_running_median_is_exact_up_to_the_window_then_of_the_latest(values):
    _, stat = _folded(values)
    kept = values[-MEDIAN_WINDOW:]  # every value while there are fewer than the window
    assert stat.median == np.median(np.asarray(kept, dtype=np.float64))


def test_a_constant_metric_keeps_no_window_and_a_varying_one_at_most_the_bound():
    from wandb_modprof.records.sample import METRICS

    base = _reused_record()
    acc = StatsAccumulator()
    for i in range(5 * MEDIAN_WINDOW):
        acc.fold((dataclasses.replace(base, act_bytes=4096, fwd_ms=float(i % 7)),))
    stats = acc.snapshot()[base.key].metrics
    assert stats["act_bytes"].median == 4096.0 and stats["fwd_ms"].median == 3.0
    windows = acc._windows  # per metric column, only where some key's value varied
    assert METRICS.index("act_bytes") not in windows
    varying = windows[METRICS.index("fwd_ms")]
    assert varying.shape[1] == MEDIAN_WINDOW and varying.dtype == np.float64


def test_a_window_is_only_as_wide_as_the_samples_so_far():
    from wandb_modprof.records.sample import METRICS

    acc, _ = _folded([1.0, 2.0, 3.0])
    assert acc._windows[METRICS.index("fwd_ms")].shape[1] < MEDIAN_WINDOW


def test_a_metric_that_starts_varying_late_counts_its_constant_past():
    _, stat = _folded([3.0] * 10 + [100.0] * 3)
    assert stat.median == 3.0  # ten 3.0 and three 100.0: not the median of [3, 100]
    _, late = _folded([3.0] * (MEDIAN_WINDOW + 5) + [100.0] * (MEDIAN_WINDOW // 2 + 1))
    assert late.median == 100.0  # the window now holds more 100.0 than 3.0


def test_many_keys_fold_at_once_as_one_by_one():
    """A sample folds every call key in one array update: each key's statistics are what
    folding its values alone gives, keys first seen at different samples included."""
    import random

    base = _reused_record()
    rng = random.Random(0)
    acc, refs = StatsAccumulator(), {}
    for sample in range(3 * MEDIAN_WINDOW // 2):
        keys = [f"k{i}" for i in range(min(40, 5 + sample)) if rng.random() < 0.8]
        recs = []
        for key in keys:
            v = rng.choice([1.0, 2.0, rng.uniform(0, 10), None])
            recs.append(dataclasses.replace(base, key=key, fwd_ms=v, grad_norm=None))
            if v is not None:
                refs.setdefault(key, _Welford()).add(v)
        acc.fold(tuple(recs))
    snap = acc.snapshot()
    for key, ref in refs.items():
        got = snap[key].metrics["fwd_ms"]
        assert repr(dataclasses.astuple(got)) == repr(dataclasses.astuple(ref.freeze())), key
    assert all("grad_norm" not in snap[k].metrics for k in snap)


def test_a_key_twice_in_one_sample_folds_in_order():
    base = _reused_record()
    acc = StatsAccumulator()
    acc.fold(tuple(dataclasses.replace(base, fwd_ms=v) for v in (1.0, 5.0, 3.0)))
    stat = acc.snapshot()[base.key].metrics["fwd_ms"]
    assert (stat.count, stat.last, stat.min, stat.max, stat.median) == (3, 3.0, 1.0, 5.0, 3.0)


def test_a_snapshot_is_a_copy_that_pickles_as_dicts_compare():
    import pickle

    base = _reused_record()
    acc = StatsAccumulator()
    acc.fold((dataclasses.replace(base, fwd_ms=2.0),))
    snap = acc.snapshot()
    acc.fold((dataclasses.replace(base, fwd_ms=4.0),))
    stats = snap[base.key]
    assert stats.metrics["fwd_ms"].count == 1 and stats.metrics["fwd_ms"].last == 2.0
    back = pickle.loads(pickle.dumps(snap))
    assert back == snap and back[base.key].metrics == dict(stats.metrics)
    assert acc.snapshot()[base.key].metrics["fwd_ms"].count == 2


@functools.cache
def _reused_record() -> InvocationRecord:
    """The root call of a real profiled step of the zoo's `Reused` model."""
    import torch
    from models import Reused

    import wandb_modprof

    model = Reused()
    with wandb_modprof.profile(model) as prof:
        model(torch.randn(16, 32, generator=torch.Generator().manual_seed(0))).sum().backward()
    return prof.invocations()[0]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([0, 4096, 2**60 + 1, 0.0, -0.0, 4096.0, None]),
            st.integers(-(2**62), 2**62),
            st.floats(-1e6, 1e6),
        ),
        min_size=1,
        max_size=2 * MEDIAN_WINDOW,
    )
)
@example([-0.0, 0, 0])  # a -0.0 `last` is replaced by the int's 0.0
@example([4096, 4096, 4096.0, 4096, 7, 4096])
@example([2**60 + 1, 2**60 + 1, float(2**60), 2**60 + 1])  # equal as floats, not as ints
def test_fold_gives_exactly_what_adding_each_value_gives(values):
    """`StatsAccumulator.fold` updates arrays for a whole sample: every statistic must still
    be bit for bit what adding the same values one by one gives, -0.0, zeros and ints beyond
    2**53 included."""
    base = _reused_record()
    folded, reference = StatsAccumulator(), _Welford()
    for v in values:
        # one int metric (act_bytes) takes the values; the other metrics stay as measured
        folded.fold((dataclasses.replace(base, act_bytes=v),))
        if v is not None:
            reference.add(float(v))
    got = folded.snapshot()[base.key].metrics.get("act_bytes")
    if reference.count == 0:
        assert got is None
    else:
        assert got is not None
        assert repr(dataclasses.astuple(got)) == repr(dataclasses.astuple(reference.freeze()))


def test_frozen_statistics_are_the_dataclass_own():
    """A snapshot builds `RunningStat` without its `__init__` (`records.frozen`, a fast path):
    an object equal to the one `__init__` builds, with every field, still frozen."""
    import pickle

    _, stat = _folded((3.0, 1.0, 2.0))
    built = RunningStat(3, 2.0, math.sqrt(2 / 3), 1.0, 3.0, 2.0, 2.0)
    assert type(stat) is RunningStat and stat == built and hash(stat) == hash(built)
    assert repr(stat) == repr(built) and pickle.loads(pickle.dumps(stat)) == built
    assert vars(stat) == dataclasses.asdict(built)
    assert list(vars(stat)) == [f.name for f in dataclasses.fields(RunningStat)]
    try:
        stat.count = 4  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a frozen statistic was changed")
