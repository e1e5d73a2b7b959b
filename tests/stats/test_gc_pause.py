"""One pause must not paint a module red (issue 15, item 3): a full garbage collection forced
inside one call on one of several samples leaves that call's colour statistic (the median)
among its clean samples' values, while the mean jumps; the sample is flagged as holding a
collection, and the callback that watched for it is gone after the profile."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from helpers import gc_paused_profile
from models import PausedStack

import wandb_modprof
from wandb_modprof.sinks.text.values import mode_values
from wandb_modprof.stats.running import held_collection

PAUSED = "middle#0"


@pytest.fixture(scope="module")
def paused() -> tuple[Any, list[Any]]:
    return gc_paused_profile()


def _record(sample: Any, key: str) -> Any:
    return next(i for i in sample.invocations if i.key == key)


def test_the_forced_collection_does_not_move_the_colour_statistic(
    paused: tuple[Any, list[Any]],
) -> None:
    prof, samples = paused
    assert len(samples) >= 3
    held = [s for s in samples if _record(s, PAUSED).gc_ms > 5.0]
    assert len(held) == 1, [_record(s, PAUSED).gc_ms for s in samples]
    clean = [_record(s, PAUSED) for s in samples if s is not held[0]]
    stats = prof.stats()[PAUSED]
    for metric in ("fwd_ms", "fwd_self_ms"):
        values = [getattr(r, metric) for r in clean]
        stat = stats.metrics[metric]
        assert min(values) <= stat.typical <= max(values), (metric, stat, values)
        # the mean is what the panel coloured by before: the pause drags it past every clean
        # sample, so this test fails for a statistic that a pause moves
        assert stat.mean > max(values), (metric, stat, values)
    # the panel's value (table and `summary --mode`) is that statistic
    table = {r["node_key"]: r for r in prof.table().resolved() if r["row_kind"] == "node"}
    assert table[PAUSED]["fwd_ms"] == stats.metrics["fwd_ms"].median
    assert table[PAUSED]["fwd_ms_mean"] == stats.metrics["fwd_ms"].mean
    fwd = {v.key: v for v in mode_values(prof, "fwd").modules}
    assert fwd[PAUSED].value == stats.metrics["fwd_ms"].median
    # ... and its peers, doing the same work, are not outranked by orders of magnitude
    peers = max(prof.stats()[k].metrics["fwd_ms"].typical for k in ("first#0", "last#0"))
    assert stats.metrics["fwd_ms"].typical < 20 * peers + 1.0


def test_the_sample_is_flagged_as_holding_a_collection(paused: tuple[Any, list[Any]]) -> None:
    prof, samples = paused
    stats = prof.stats()
    pause = max(_record(s, PAUSED).gc_ms for s in samples)
    forced = next(s for s in samples if _record(s, PAUSED).gc_ms == pause)
    assert held_collection(_record(forced, PAUSED))

    def flagged(key: str) -> int:
        # A natural young collection (tens of µs) can land in a 0.3 ms call of another sample
        # and is flagged too, rightly: count what each sample says, not an assumed 1.
        return sum(held_collection(_record(s, key)) for s in samples)

    assert stats[PAUSED].gc_samples == flagged(PAUSED) >= 1
    assert stats[PAUSED].metrics["gc_ms"].max == pause
    # charged to the open calls: the paused call and its ancestor, not its siblings
    assert stats["<root>#0"].gc_samples == flagged("<root>#0") >= 1
    assert stats["<root>#0"].metrics["gc_ms"].max >= pause
    for key in ("first#0", "last#0", "middle.fc#0"):
        assert stats[key].metrics["gc_ms"].max < pause / 10, key
        assert stats[key].gc_samples == flagged(key), key
        assert not held_collection(_record(forced, key)), key
    table = {r["node_key"]: r for r in prof.table().resolved() if r["row_kind"] == "node"}
    assert table[PAUSED]["gc_samples"] == float(flagged(PAUSED))
    assert table[PAUSED]["gc_ms_max"] == pause
    assert table["first#0"]["gc_samples"] == float(flagged("first#0"))


def test_summary_names_the_sample_that_held_a_collection(paused: tuple[Any, list[Any]]) -> None:
    prof, samples = paused
    text = prof.summary()
    assert "(medians over samples; self = excluding child modules)" in text
    notes = [line for line in text.splitlines() if line.startswith("garbage collection")]
    n = len(samples)
    # innermost only: the root holds it too, through the paused call
    held = prof.stats()[PAUSED].gc_samples
    assert len(notes) == 1 and f"in {held} of {n} sample(s) of {PAUSED}" in notes[0], notes
    from wandb_modprof.sinks.text.summary import format_mode_summary

    mode_text = format_mode_summary(mode_values(prof, "fwd"), 10)
    assert "(medians over samples)" in mode_text
    assert f"{PAUSED} ({held} of {n})" in mode_text


def test_young_collections_alone_do_not_flag_a_sample() -> None:
    """Collections of generation 0 run every few hundred allocations, tens of µs each: the
    time is recorded, the sample is not said to be paused by them."""
    from wandb_modprof.records.sample import InvocationRecord

    fields = dict.fromkeys(InvocationRecord.__dataclass_fields__, None)
    base = {**fields, "fwd_ms": 10.0, "bwd_ms": 20.0}
    assert not held_collection(InvocationRecord(**{**base, "gc_ms": 0.05}))
    assert held_collection(InvocationRecord(**{**base, "gc_ms": 1.5}))  # 5 % of 30 ms
    assert not held_collection(InvocationRecord(**{**base, "gc_ms": 0.0}))


def test_the_collection_callback_lives_only_while_a_sample_is_open() -> None:
    before = list(gc.callbacks)
    model = PausedStack()
    x = torch.randn(4, 64)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            out = model(x)
            assert len(gc.callbacks) <= len(before) + 1  # ours, during the sampled step
            out.sum().backward()
            assert gc.callbacks == before  # removed at the end of the backward
        model(x)  # a forward whose backward never comes: removed when the profile ends
    assert gc.callbacks == before
    assert prof.num_samples >= 2
    # a forward that raises drops its sample and its callback
    with wandb_modprof.profile(model):
        model(x).sum().backward()
        with pytest.raises(RuntimeError):
            model(torch.randn(4, 3))
    assert gc.callbacks == before
