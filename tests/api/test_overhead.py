"""The measured cost of sampling (`api.overhead`) and `watch(log_freq="auto", overhead=)`."""

from __future__ import annotations

import warnings

import pytest
import wandb
from helpers import RecordingRun, train_step
from models import TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof._errors import ModProfError
from wandb_modprof.api.overhead import OverheadMeter


def _run(
    meter: OverheadMeter,
    kinds: list[tuple[str, float]],
    own: dict[int, float],
    hooks: float | None = None,
) -> float:
    """Steps of the given kinds and lengths on a synthetic clock; `own[i]`: our work (s) in
    step i's root hook before the step's clock is read (a delivery, as in
    `Capture._root_pre`), so inside the previous step's length; `hooks`: the root hooks' own
    seconds of every step besides. Returns the clock at the end."""
    now, total = 0.0, 0.0
    for i, (kind, length) in enumerate(kinds):
        if i in own:
            meter.own(own[i])
        # (the hooks' clock adds a hook's time when it returns: after `step` read it)
        meter.step(now, hooks_s=total if hooks is not None else None)
        total += (hooks or 0.0) + own.get(i, 0.0)
        if kind != "plain":
            meter.mark(kind)
        now += length
    meter.step(now, hooks_s=total if hooks is not None else None)
    return now


def test_a_sampled_step_costs_its_length_beyond_the_median_plain_step_plus_our_later_work():
    meter = OverheadMeter()
    # plain steps of 1 s; a sample of 3 s; its delivery (0.5 s) at the next root forward
    kinds = [("plain", 1.0)] * 4 + [("sampled", 3.5)] + [("plain", 1.0)] * 4
    end = _run(meter, kinds, own={5: 0.5})
    over = meter.overhead()
    assert over.wall_s == end == 11.5
    assert over.cost_s == pytest.approx(2.0 + 0.5)  # the delivery's step was a plain 1 s one
    assert over.share == pytest.approx(2.5 / 11.5)
    assert (over.steps, over.samples) == (10, 1)  # 9 steps + the start of a 10th
    assert meter.last_cost_s() == pytest.approx(2.5)
    assert (over.step_s, over.sample_s, over.once_s) == pytest.approx((1.0, 2.5, 0.0))


def test_the_floor_of_every_step_counts_and_our_work_inside_a_hook_counts_once():
    meter = OverheadMeter()
    meter.reach_s = 0.01
    # root hooks of 0.05 s on every step (+ the reach 0.01); a sample's delivery of 0.5 s runs
    # inside the next step's root hook
    kinds = [("plain", 1.0)] * 4 + [("sampled", 3.5)] + [("plain", 1.0)] * 4
    _run(meter, kinds, own={5: 0.5}, hooks=0.05)
    over = meter.overhead()
    # the hooks' own time, as much again for what they evicted (EVICTION), and the reach
    assert over.floor_s == pytest.approx(2 * 0.05 + 0.01)
    # the sampled step's extra (2) and delivery (0.5, once), the hooks of the 9 steps that
    # ended, the eviction and the reach cost of all 10 that started
    assert over.cost_s == pytest.approx(2.0 + 0.5 + 9 * 0.05 + 10 * (0.05 + 0.01))
    assert over.at_log_freq(100) == pytest.approx((0.11 + over.sample_s / 100) / 1.0)


def test_the_work_a_sample_leaves_to_the_next_step_is_counted():
    meter = OverheadMeter()
    # the step after the sample is 0.4 s slower (garbage, caches) without any timed work
    kinds = [("plain", 1.0)] * 4 + [("sampled", 3.0), ("plain", 1.4)] + [("plain", 1.0)] * 3
    _run(meter, kinds, own={})
    assert meter.cost_s() == pytest.approx(2.0 + 0.4)


def test_a_structure_pass_is_ours_and_a_sampled_step_it_took_is_not_a_sample():
    meter = OverheadMeter()
    meter.step(0.0)
    meter.mark("sampled")  # due for sampling ...
    meter.mark("structure")  # ... but the structure pass took it
    for t in (4.0, 5.0, 6.0):
        meter.step(t)
    over = meter.overhead()
    assert over.samples == 0
    assert over.cost_s == pytest.approx(3.0)  # 4 s against plain steps of 1 s


def test_auto_samples_again_only_when_the_budget_allows_it():
    meter = OverheadMeter()
    assert not meter.due(0.1, now=0.0)  # nothing known yet: no plain step, no floor
    _run(meter, [("plain", 1.0)] * 30, own={}, hooks=0.0)
    # the first sample is taken to cost FIRST_SAMPLE_STEPS plain steps: 3 <= 0.1 x 30
    assert not meter.due(0.1, now=29.0)
    assert meter.due(0.1, now=30.0)
    meter.mark("sampled")
    meter.step(33.0, hooks_s=0.0)  # a sampled step of 3 s: 2 s beyond the plain 1 s
    meter.step(34.0, hooks_s=0.0)
    assert meter.cost_s() == pytest.approx(2.0)
    # cost so far (2) + the last sample's (2) <= 0.1 x elapsed: from 40 s after the first step
    assert not meter.due(0.1, now=39.0)
    assert meter.due(0.1, now=40.0)


def test_auto_samples_nothing_where_the_floor_is_over_the_budget():
    meter = OverheadMeter()
    _run(meter, [("plain", 1.0)] * 9, own={}, hooks=0.02)  # the floor: 2 x 2 % of every step
    assert not meter.due(0.01, now=1e6) and meter.floor_over == pytest.approx((0.04, 1.0))
    assert meter.due(0.05, now=1e6) and meter.floor_over is None


def test_watch_reports_its_measured_overhead_in_summary_table_and_wandb():
    model, x = TinyGPT(), gpt_input()
    run = RecordingRun()
    handle = wandb_modprof.watch(model, log_freq=2, run=run)
    for _ in range(6):
        train_step(model, x)
    prof = handle.unwatch()
    over = handle.overhead
    assert over.samples == 3 and over.steps == 6
    assert 0 < over.cost_s < over.wall_s
    summary = prof.summary()
    assert f"watch overhead: {100 * over.share:.2f} % of this run's training time" in summary
    assert "per step on every step" in summary and "per sample" in summary
    assert f"at log_freq=100 about {100 * over.at_log_freq(100):.2f} %" in summary
    assert over.floor_s > 0 and over.sample_s > 0 and over.once_s > 0
    table = prof.table()
    key, number = table.columns.index("meta_key"), table.columns.index("meta_number")
    meta = {r[key]: r[number] for r in table.rows if r[0] == "meta"}
    assert meta["overhead_pct"] == pytest.approx(100 * over.share)
    logged = [data for data, _, _ in run.calls if "modprof/TinyGPT/overhead_pct" in data]
    assert logged and all(0 <= d["modprof/TinyGPT/overhead_pct"] <= 100 for d in logged)


def test_log_freq_auto_keeps_a_tight_budget_by_sampling_less():
    """With a budget below the floor of `watch` on this model, auto samples nothing and
    says so once, with the figures; with a generous one it samples often."""
    model, x = TinyGPT(), gpt_input()
    tight = wandb_modprof.watch(
        model, log_freq="auto", settings=wandb_modprof.Settings(overhead=1e-6), run=RecordingRun()
    )
    with pytest.warns(RuntimeWarning, match=r"watching TinyGPT costs [\d.]+ us of each") as told:
        for _ in range(12):
            train_step(model, x)
    assert len([w for w in told if "wandb_modprof" in str(w.message)]) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tight.unwatch().num_samples == 0
    assert any("no sample" in str(w.message) for w in caught)
    # a sample costs a few plain steps here: within 99 %, one every few steps
    loose = wandb_modprof.watch(
        model, log_freq="auto", settings=wandb_modprof.Settings(overhead=0.99), run=RecordingRun()
    )
    for _ in range(30):
        train_step(model, x)
    prof = loose.unwatch()
    assert prof.num_samples >= 4
    assert loose.overhead.share <= 0.99


@pytest.mark.parametrize("overhead", [0, 1, 1.5, -0.1, "1%", True, None])
def test_overhead_must_be_a_share(overhead):
    with pytest.raises(ModProfError, match=r"overhead expected a number in \(0, 1\); got"):
        wandb_modprof.watch(
            TinyGPT(),
            run=wandb.init(mode="disabled"),
            settings=wandb_modprof.Settings(overhead=overhead),
        )


@pytest.mark.parametrize("log_freq", ["sometimes", "Auto", 0])
def test_log_freq_is_an_int_or_auto(log_freq):
    with pytest.raises(ModProfError, match="log_freq must be an int >= 1"):
        wandb_modprof.watch(TinyGPT(), run=wandb.init(mode="disabled"), log_freq=log_freq)


def test_auto_runs_the_structure_pass_when_the_budget_allows_it():
    meter = OverheadMeter()
    assert not meter.pass_due(0.1, calibrating=False, now=0.0)  # no plain step timed yet
    _run(meter, [("plain", 1.0)] * 90, own={}, hooks=0.0)
    # a pass is taken to cost PASS_STEPS (8) plain steps, and the roofline's calibration
    # (CALIBRATION_S, 0.3 s) where the process has not calibrated yet
    assert not meter.pass_due(0.1, calibrating=False, now=79.0)
    assert meter.pass_due(0.1, calibrating=False, now=80.0)
    assert not meter.pass_due(0.1, calibrating=True, now=82.0)
    assert meter.pass_due(0.1, calibrating=True, now=83.0)


def test_auto_defers_the_structure_pass_to_the_budget():
    model, x = TinyGPT(), gpt_input()
    tight = wandb_modprof.watch(
        model, log_freq="auto", settings=wandb_modprof.Settings(overhead=1e-4), run=RecordingRun()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(12):
            train_step(model, x)
        assert tight.overhead.passes == 0  # a pass would cost far more than 0.01 % of 12 steps
        tight.unwatch()
    loose = wandb_modprof.watch(
        model, log_freq="auto", settings=wandb_modprof.Settings(overhead=0.99), run=RecordingRun()
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(12):
            train_step(model, x)
        assert loose.overhead.passes >= 1  # once 8 plain steps were timed
        loose.unwatch()
