"""The measured cost of sampling (`api.overhead`) and `watch(log_freq="auto", overhead=)`."""

from __future__ import annotations

import pytest
import wandb
from helpers import RecordingRun, train_step
from models import TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof._errors import ModProfError
from wandb_modprof.api.overhead import OverheadMeter


def _run(meter: OverheadMeter, kinds: list[tuple[str, float]], own: dict[int, float]) -> float:
    """Steps of the given kinds and lengths on a synthetic clock; `own[i]`: our work (s) at
    the start of step i (a delivery), inside its length. Returns the clock at the end."""
    now = 0.0
    for i, (kind, length) in enumerate(kinds):
        meter.step(now)
        if kind != "plain":
            meter.mark(kind)
        if i in own:
            meter.own(own[i])
        now += length
    meter.step(now)
    return now


def test_a_sampled_step_costs_its_length_beyond_the_median_plain_step_plus_our_later_work():
    meter = OverheadMeter()
    # plain steps of 1 s; a sample of 3 s; its delivery (0.5 s) inside the next step's 1.5 s
    kinds = [("plain", 1.0)] * 4 + [("sampled", 3.0), ("plain", 1.5)] + [("plain", 1.0)] * 3
    end = _run(meter, kinds, own={5: 0.5})
    over = meter.overhead()
    assert over.wall_s == end == 11.5
    assert over.cost_s == pytest.approx(2.0 + 0.5)  # the delivery's step was a plain 1 s one
    assert over.share == pytest.approx(2.5 / 11.5)
    assert (over.steps, over.samples) == (10, 1)  # 9 steps + the start of a 10th
    assert meter.last_cost_s() == pytest.approx(2.5)


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
    assert meter.due(0.1, now=0.0)  # the first sample: its cost is not known before
    _run(meter, [("sampled", 3.0), ("plain", 1.0)], own={})
    # without a plain step's median the cost could not be known; now it is 2 s
    assert meter.cost_s() == pytest.approx(2.0)
    # cost so far (2) + the last sample's (2) <= 0.1 x elapsed: from 40 s after the first step
    assert not meter.due(0.1, now=39.0)
    assert meter.due(0.1, now=40.0)


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
    assert f"sampling overhead: {100 * over.share:.2f} % of training time" in prof.summary()
    table = prof.table()
    key, number = table.columns.index("meta_key"), table.columns.index("meta_number")
    meta = {r[key]: r[number] for r in table.rows if r[0] == "meta"}
    assert meta["overhead_pct"] == pytest.approx(100 * over.share)
    logged = [data for data, _, _ in run.calls if "modprof/TinyGPT/overhead_pct" in data]
    assert logged and all(0 <= d["modprof/TinyGPT/overhead_pct"] <= 100 for d in logged)


def test_log_freq_auto_keeps_a_tight_budget_by_sampling_less():
    """With a budget far below one sample's cost, auto samples once (the first sample) and
    then waits; with a generous one it samples often."""
    model, x = TinyGPT(), gpt_input()
    tight = wandb_modprof.watch(model, log_freq="auto", overhead=1e-6, run=RecordingRun())
    for _ in range(12):
        train_step(model, x)
    assert tight.unwatch().num_samples == 1
    # a sample costs a few plain steps here: within 99 %, one every few steps
    loose = wandb_modprof.watch(model, log_freq="auto", overhead=0.99, run=RecordingRun())
    for _ in range(30):
        train_step(model, x)
    prof = loose.unwatch()
    assert prof.num_samples >= 4
    assert loose.overhead.share <= 0.99


@pytest.mark.parametrize("overhead", [0, 1, 1.5, -0.1, "1%", True, None])
def test_overhead_must_be_a_share(overhead):
    with pytest.raises(ModProfError, match=r"overhead expected a number in \(0, 1\); got"):
        wandb_modprof.watch(TinyGPT(), run=wandb.init(mode="disabled"), overhead=overhead)


@pytest.mark.parametrize("log_freq", ["sometimes", "Auto", 0])
def test_log_freq_is_an_int_or_auto(log_freq):
    with pytest.raises(ModProfError, match="log_freq must be an int >= 1"):
        wandb_modprof.watch(TinyGPT(), run=wandb.init(mode="disabled"), log_freq=log_freq)
