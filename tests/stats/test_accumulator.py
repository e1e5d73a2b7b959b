"""Stamps are resolved after the step, and only once the device says they are complete.

On CPU the host clock is always ready; this drives the same code path with a clock whose
stamps behave like CUDA events (`ready()` false until the "device" completes, `wait()` blocks),
so deferral and forced resolution are checked without a GPU.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import pytest
import torch
from helpers import disabled_run
from models import Reused

import wandb_modprof
from wandb_modprof.api.sample_message import sample_message
from wandb_modprof.capture.memory.static_memory import StaticReadings
from wandb_modprof.capture.session import StepSession
from wandb_modprof.capture.session_record import SessionRecord


class FakeEvent:
    def __init__(self) -> None:
        self.t = time.perf_counter_ns()
        self.done = False


class FakeEventClock:
    def __init__(self) -> None:
        self.stamps: list[FakeEvent] = []
        self.waits = 0

    def stamp(self) -> FakeEvent:
        event = FakeEvent()
        self.stamps.append(event)
        return event

    def ready(self, stamp: FakeEvent) -> bool:
        return stamp.done

    def wait(self, stamp: FakeEvent) -> None:
        self.waits += 1
        for event in self.stamps:
            event.done = True

    def offsets_ms(self, ref, stamps):
        return [float("nan") if s is None else (s.t - ref.t) / 1e6 for s in stamps]

    # Device events take nothing out for our own hook time (as `clock.EventClock`).
    def own_enter(self) -> None:
        return None

    def own_leave(self) -> None:
        return None

    def own_leave_call(self) -> None:
        return None

    def own_leave_pack(self) -> None:
        return None

    def own_leave_node(self) -> None:
        return None

    def own_at(self, stamp: FakeEvent) -> int:
        return 0

    def complete_all(self) -> None:
        for event in self.stamps:
            event.done = True


def test_resolution_waits_for_the_device_only_when_results_are_read():
    model = Reused()
    clock = FakeEventClock()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    handle._capture.clock = clock
    x = torch.randn(8, 32)
    for _ in range(3):
        model(x).sum().backward()
    acc = handle._capture.sink
    # Three finished samples, none resolved: nothing waited on the device during training.
    assert acc.pending_count == 3 and acc.num_samples == 0
    assert clock.waits == 0
    acc.resolve_pending(force=False)
    assert acc.num_samples == 0  # events not complete: still deferred
    clock.complete_all()
    acc.resolve_pending(force=False)
    assert acc.num_samples == 3 and clock.waits == 0
    model(x).sum().backward()
    # Reading the profile forces the remaining sample: one wait, at read time.
    assert handle.profile().num_samples == 4
    assert clock.waits == 1
    assert handle.profile().invocations()[0].bwd_ms > 0


def test_on_a_device_a_sample_waits_for_its_optimizer_and_next_forward_events():
    """The phases' stamps after the backward (the optimizer step's, the next forward's) are
    device events too: a sample resolves once they have completed (or, read, after a wait
    for them), so its optimizer phase is timed rather than named as incomplete."""
    model = Reused()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    clock = FakeEventClock()
    handle = wandb_modprof.watch(
        model, log_freq=1, structure=False, run=disabled_run(), optimizer=opt
    )
    handle._capture.clock = clock
    x = torch.randn(8, 32)
    model(x).sum().backward()
    opt.step()
    acc = handle._capture.sink
    record = acc.first_pending()
    assert record is not None
    for event in clock.stamps:  # the step's own events complete; the optimizer's do not
        event.done = event is not record.phase_stamps.optimizer_end
    model(x)  # the next forward: its stamp is new, not complete
    acc.resolve_pending(force=False)
    assert acc.num_samples == 0 and clock.waits == 0
    acc.resolve_pending(force=True)  # reading the results: one wait, for the newest event
    assert acc.num_samples == 1 and clock.waits == 1
    phases = acc.snapshot().phases
    assert phases is not None and "optimizer" in phases.median_ms, phases
    handle.unwatch()


def _handed(
    monkeypatch: pytest.MonkeyPatch, clock: FakeEventClock | None, steps: int
) -> tuple[Any, list[tuple[Any, ...]]]:
    """What the capture hands its sink in `steps` sampled steps of a `Reused` (on the host
    clock, or on `clock`), each passed on to the sink."""
    model = Reused()
    optimizer = torch.optim.Adam(model.parameters())
    handle = wandb_modprof.watch(
        model, log_freq=1, structure=False, run=disabled_run(), optimizer=optimizer
    )
    if clock is not None:
        handle._capture.clock = clock
    acc = handle._capture.sink
    handed: list[tuple[Any, ...]] = []
    add = acc.add

    def keep(*args: Any) -> None:
        handed.append(args)
        add(*args)

    monkeypatch.setattr(acc, "add", keep)
    x = torch.randn(8, 32)
    for _ in range(steps):
        model(x).sum().backward()
        optimizer.step()
    return handle, handed


def test_the_sink_takes_plain_records_of_host_timed_steps(monkeypatch: pytest.MonkeyPatch):
    """The capture hands over a `SessionRecord` per finished step, never the live session,
    with static readings (the index's tables, the optimizer's bytes read later); the record
    pickles (the worker's path) and resolves to the same calls there."""
    handle, handed = _handed(monkeypatch, None, 3)
    assert len(handed) == 3
    for record, gradients, static in handed:
        assert isinstance(record, SessionRecord) and not isinstance(record, StepSession)
        assert isinstance(static, StaticReadings) and gradients is not None
        assert record.movable and record.ready()
        travelled = pickle.loads(pickle.dumps(record))
        assert [i.key for i in travelled.invocations] == [i.key for i in record.invocations]
    message = sample_message(*handed[0])
    assert message is not None and message[0] == "reading"
    # Adam's moments, read when handed over: at the end of the first backward there were none
    assert sum(message[2]) > 0
    profile = handle.unwatch()
    assert profile.num_samples == 3


def test_device_timed_records_keep_their_clock_and_stay_here(monkeypatch: pytest.MonkeyPatch):
    """A device-timed step's record keeps the clock and its event stamps: it cannot leave the
    process (the worker is never sent one) and waits for its events where it is resolved."""
    clock = FakeEventClock()
    handle, handed = _handed(monkeypatch, clock, 2)
    assert len(handed) == 2
    for record, gradients, static in handed:
        assert isinstance(record, SessionRecord) and record.clock is clock
        assert not record.movable and not record.ready()
        assert sample_message(record, gradients, static) is None
    assert handle.unwatch().num_samples == 2 and clock.waits >= 1


def test_backlog_is_resolved_when_ready_without_waiting():
    model = Reused()
    clock = FakeEventClock()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    handle._capture.clock = clock
    x = torch.randn(8, 32)
    for _ in range(12):
        model(x).sum().backward()
        clock.complete_all()
    acc = handle._capture.sink
    # The unread backlog is bounded: ready samples beyond 8 were folded without a wait.
    assert acc.pending_count <= 8
    assert acc.num_samples >= 4 and clock.waits == 0
    assert handle.unwatch().num_samples == 12


def test_resolving_pauses_the_collector_and_restores_it_as_it_was() -> None:
    """Resolution and the table run with the cyclic collector off (`stats/quiet_gc.py`): it is
    on again afterwards if it was on, stays off if the user had turned it off, and a cycle made
    meanwhile is still collected."""
    import gc
    import weakref

    from wandb_modprof.stats.quiet_gc import paused_gc

    seen: list[bool] = []
    model = Reused()
    with wandb_modprof.profile(model) as prof:
        model(torch.randn(2, 32)).sum().backward()
    was_on = gc.isenabled()
    try:
        for user_on in (True, False):
            gc.enable() if user_on else gc.disable()

            class Node:
                pass

            with paused_gc():
                seen.append(gc.isenabled())
                a, b = Node(), Node()
                a.other, b.other = b, a  # type: ignore[attr-defined]
                gone = weakref.ref(a)
                del a, b
            prof.table()
            assert gc.isenabled() is user_on
            gc.collect()
            assert gone() is None
    finally:
        gc.enable() if was_on else gc.disable()
    assert seen == [False, False]


def test_a_pickled_profile_is_decoded_at_its_first_read_and_equals_the_loaded_one() -> None:
    """`load_pickled` (the final answer of `watch`'s worker): the count at once, the contents
    decoded when first read, the same profile as `load`."""
    import pickle

    from wandb_modprof.stats.accumulator import ProfileAccumulator

    model = Reused()
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(torch.randn(2, 32)).sum().backward()
    data = prof.snapshot()
    loaded, deferred = ProfileAccumulator(data.model_name), ProfileAccumulator(data.model_name)
    loaded.load(data)
    deferred.load_pickled(data.num_samples, pickle.dumps(data))
    assert deferred.num_samples == data.num_samples > 0
    assert deferred._deferred is not None  # nothing decoded for the count
    assert deferred.snapshot() == loaded.snapshot() == data
    assert deferred._deferred is None
    # a read of any part decodes it: the last sample, then the structures
    for read in (lambda a: a.last, lambda a: a.structures(), lambda a: a.means(("fwd_ms",))):
        again = ProfileAccumulator(data.model_name)
        again.load_pickled(data.num_samples, pickle.dumps(data))
        assert read(again) == read(loaded)
