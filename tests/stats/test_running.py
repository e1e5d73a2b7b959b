"""Running statistics equal batch statistics (Welford vs numpy)."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from wandb_modprof.records.sample import InvocationRecord
from wandb_modprof.stats.running import MEDIAN_WINDOW, StatsAccumulator, _Welford


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=200)
)
def test_running_mean_std_min_max_last_match_numpy(values):
    acc = _Welford()
    for v in values:
        acc.add(v)
    stat = acc.freeze()
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
    acc = _Welford()
    for v in values:
        acc.add(v)
    kept = values[-MEDIAN_WINDOW:]  # every value while there are fewer than the window
    assert acc.freeze().median == np.median(np.asarray(kept, dtype=np.float64))


def test_a_constant_metric_keeps_no_window_and_a_varying_one_at_most_the_bound():
    constant, varying = _Welford(), _Welford()
    for i in range(5 * MEDIAN_WINDOW):
        constant.add(4096.0)
        varying.add(float(i % 7))
    assert constant.window is None and constant.freeze().median == 4096.0
    assert varying.window is not None and len(varying.window) == MEDIAN_WINDOW
    assert varying.window.itemsize == 8  # C doubles, not Python floats


def test_a_metric_that_starts_varying_late_counts_its_constant_past():
    acc = _Welford()
    for v in [3.0] * 10 + [100.0] * 3:
        acc.add(v)
    assert acc.freeze().median == 3.0  # ten 3.0 and three 100.0: not the median of [3, 100]


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
    """`StatsAccumulator.fold` inlines `_Welford.add` and skips the update of a constant
    integer metric (only its count moves): every statistic must still be bit for bit what
    adding the same values one by one gives, -0.0, zeros and ints beyond 2**53 included."""
    base = _reused_record()
    folded, reference = StatsAccumulator(), _Welford()
    for v in values:
        # one int metric (act_bytes) takes the values; the other metrics stay as measured
        folded.fold((dataclasses.replace(base, act_bytes=v),))
        if v is not None:
            reference.add(float(v))
    got, want = folded.snapshot()[base.key].metrics.get("act_bytes"), reference.freeze()
    if reference.count == 0:
        assert got is None
    else:
        assert got is not None
        assert repr(dataclasses.astuple(got)) == repr(dataclasses.astuple(want))


def test_frozen_statistics_are_the_dataclass_own():
    """`freeze` builds `RunningStat` without its `__init__` (`records.frozen`, a fast path):
    an object equal to the one `__init__` builds, with every field, still frozen."""
    import pickle

    from wandb_modprof.records.sample import RunningStat

    acc = _Welford()
    for v in (3.0, 1.0, 2.0):
        acc.add(v)
    stat = acc.freeze()
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
