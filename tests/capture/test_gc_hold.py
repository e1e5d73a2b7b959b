"""The garbage collector is held off inside a sampled step's timed windows and the work of
ours around them (the hooks' attachment before the forward, closing the forward, the gradients'
read-out after the backward), and only there (`capture/step/gc_pause.py`): no natural
collection lands inside a timed call, nor inside the user's sampled forward or backward call;
the collector is on
again between the forward and the backward, after the backward, after a forward that raises,
after a forward whose backward never comes, and after a backward that raised (at the next
step); a collector the user turned off stays off; unsampled steps are left alone."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from helpers import disabled_run
from torch import nn

import wandb_modprof
from wandb_modprof.capture.step import gc_pause


class Allocating(nn.Module):
    """Records whether the collector is on while it runs, and makes many tracked objects (far
    past the 700-allocation threshold of a young collection)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.seen: list[bool] = []
        self.keep: list[Any] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(gc.isenabled())
        self.keep = [{"i": i} for i in range(5000)]  # tracked dicts, alive until next call
        return self.fc(x)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Allocating()
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).relu())


class Seen(torch.autograd.Function):
    """Identity whose backward records whether the collector is on (and may raise)."""

    seen: list[bool] = []  # noqa: RUF012 (a test's record)
    fail = False

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        Seen.seen.append(gc.isenabled())
        if Seen.fail:
            raise RuntimeError("backward failed on purpose")
        return grad


class WithSeen(Model):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Seen.apply(super().forward(x))


@pytest.fixture(autouse=True)
def _collector_on() -> Any:
    was = gc.isenabled()
    gc.enable()
    Seen.seen, Seen.fail = [], False
    yield
    assert not gc_pause.holding()
    if not was:
        gc.disable()


def test_off_inside_the_sampled_windows_on_between_and_after() -> None:
    model = WithSeen()
    x = torch.randn(4, 8)
    with wandb_modprof.profile(model) as prof:
        for _ in range(4):
            out = model(x)
            between = gc.isenabled()  # the user's loss code
            out.sum().backward()
            assert between and gc.isenabled()
    assert prof.num_samples >= 2
    # held in every sampled forward and backward, and in the structure pass's (an untimed
    # step that makes many objects of ours), never between them
    assert prof.num_samples == 3 and len(model.a.seen) == 4
    assert not any(model.a.seen), model.a.seen
    assert [not on for on in Seen.seen] == [not on for on in model.a.seen], Seen.seen


def test_no_natural_collection_lands_inside_a_timed_call() -> None:
    model = Model()
    x = torch.randn(4, 8)
    with wandb_modprof.profile(model) as prof:
        for _ in range(4):
            model(x).sum().backward()
    # Each forward made 5,000 tracked dicts: without the hold, several young collections ran
    # inside `a` in every sample (gc_ms > 0).
    gc_ms = [s.metrics["gc_ms"].max for s in prof.stats().values()]
    assert max(gc_ms) == 0.0, prof.stats()
    # an explicit collection inside a call still runs and is still charged (`gc_watch`)


class Collections:
    """Garbage collections counted while `counting` is set (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.counting = False
        self.count = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if self.counting and phase == "stop":
            self.count += 1

    def __enter__(self) -> Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def test_no_collection_inside_the_sampled_forward_and_backward_calls() -> None:
    """A sampled step's own work outside its timed windows makes many objects too: attaching a
    hook pair to every module before the forward, closing the forward (saved storages, the
    owners of the autograd nodes) and reading the gradients out after the backward. Held as
    well: no collection runs inside the user's `model(x)` or `loss.backward()` call."""
    model = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(600)))
    x = torch.randn(2, 4)
    with wandb_modprof.profile(model, structure=False) as prof, Collections() as seen:
        for _ in range(3):
            gc.collect()  # each call starts with an empty young generation (outside the count)
            seen.counting = True
            out = model(x)
            seen.counting = False
            loss = out.sum()
            gc.collect()
            seen.counting = True
            loss.backward()
            seen.counting = False
    assert prof.num_samples == 3
    assert seen.count == 0, seen.count


def test_releasing_the_collector_does_not_start_a_collection_in_the_step() -> None:
    """Re-enabled after a window, the collector would start with a collection of everything
    made while it was held (the step's records and hooks): inside the sampled step, between
    the forward and the backward or after it. Those objects move to the oldest generation
    instead (`gc_pause.promote_young`): the whole sampled step runs without a collection."""
    model = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(600)))
    x = torch.randn(2, 4)
    with wandb_modprof.profile(model, structure=False) as prof, Collections() as seen:
        for _ in range(3):
            gc.collect()
            seen.counting = True
            model(x).sum().backward()
            for _ in range(200):  # the next statements' allocations: no collection either
                [object() for _ in range(4)]
            seen.counting = False
    assert prof.num_samples == 3
    assert seen.count == 0, seen.count


class Cyclic(nn.Module):
    """Leaves a reference cycle behind in every forward (garbage only a collection frees)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.dropped: list[Any] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cycle: dict[str, Any] = {}
        cycle["self"] = cycle
        holder = Holder()
        holder.cycle = cycle
        self.dropped.append(weakref.ref(holder))
        return self.fc(x)


class Holder:
    cycle: Any = None


def test_garbage_made_while_held_is_still_collected_and_a_user_freeze_is_kept() -> None:
    model = Cyclic()
    x = torch.randn(4, 8)
    with wandb_modprof.profile(model, structure=False):
        for _ in range(3):
            model(x).sum().backward()
    gc.collect()
    assert model.dropped and all(ref() is None for ref in model.dropped)
    marker = Holder()
    gc.freeze()  # the user's own freeze (before forking workers, say): left as it is
    try:
        with wandb_modprof.profile(model, structure=False):
            model(x).sum().backward()
        # frozen objects are in no generation `get_objects` lists
        assert gc.get_freeze_count() > 0
        assert not any(o is marker for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is marker for o in gc.get_objects())


def test_unsampled_steps_are_left_alone() -> None:
    model = WithSeen()
    x = torch.randn(4, 8)
    handle = wandb_modprof.watch(model, log_freq=3, run=disabled_run())
    try:
        for _ in range(7):
            model(x).sum().backward()
    finally:
        handle.unwatch()
    sampled = [not on for on in model.a.seen]
    assert 1 <= sum(sampled) < len(sampled) - 2, model.a.seen
    assert sum(not on for on in Seen.seen) == sum(sampled)


def test_a_collector_the_user_turned_off_stays_off() -> None:
    model = Model()
    x = torch.randn(4, 8)
    with wandb_modprof.profile(model):
        model(x).sum().backward()
        gc.disable()
        for _ in range(2):
            out = model(x)
            assert not gc.isenabled()
            out.sum().backward()
            assert not gc.isenabled()
    assert not gc.isenabled()
    gc.enable()


def test_on_again_after_a_forward_that_raises_or_has_no_backward() -> None:
    model = Model()
    x = torch.randn(4, 8)
    with wandb_modprof.profile(model):
        model(x).sum().backward()
        with pytest.raises(RuntimeError):
            model(torch.randn(4, 3))  # the user's shape error, inside a sampled forward
        assert gc.isenabled()
        model(x)  # its backward never comes
        assert gc.isenabled()
        model(x).sum().backward()
        assert gc.isenabled()


def test_on_again_after_a_backward_that_raised() -> None:
    model = WithSeen()
    x = torch.randn(4, 8)
    with wandb_modprof.profile(model):
        for _ in range(3):  # past the structure pass: every step now is sampled
            model(x).sum().backward()
        Seen.fail = True
        with pytest.raises(RuntimeError, match="on purpose"):
            model(x).sum().backward()
        Seen.fail = False
        assert Seen.seen[-1] is False  # the failing backward ran held
        out = model(x)  # the next step's start releases the hold the failed backward left
        assert gc.isenabled() and not gc_pause.holding()
        out.sum().backward()
    assert gc.isenabled()
