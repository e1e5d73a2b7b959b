"""`watch`: which forwards are steps, the sampling schedule (gradient accumulation included),
hook-free unsampled steps, bad input at the boundary, and `unwatch`.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from helpers import (
    Probed,
    by_key,
    disabled_run,
    hook_counts,
    no_hooks,
    ours,
    recorded_warnings,
    root_only,
    train_step,
)
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError

pytestmark = pytest.mark.usefixtures("isolate_saved_tensor_hooks")


def test_a_refused_watch_leaves_no_optimizer_hook() -> None:
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = disabled_run()
    handle = wandb_modprof.watch(model, log_freq=2, run=run, optimizer=optimizer)
    hooks = len(optimizer._optimizer_step_post_hooks)
    for _ in range(3):
        with pytest.raises(ModProfError, match="already being watched"):
            wandb_modprof.watch(model, log_freq=2, run=run, optimizer=optimizer)
    assert len(optimizer._optimizer_step_post_hooks) == hooks
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ModProfError, match="timing='device'"):  # refused while building
        wandb_modprof.watch(
            nn.Linear(2, 2),
            run=run,
            optimizer=other,
            settings=wandb_modprof.Settings(timing="device"),
        )
    assert len(other._optimizer_step_post_hooks) == 0
    with pytest.warns(UserWarning, match=r"0 optimizer step\(s\)"):
        handle.unwatch()
    assert len(optimizer._optimizer_step_post_hooks) == 0


ROOT = "<root>"


def _sampled_snapshot(snapshot: dict[str, int]) -> bool:
    """A probe snapshot taken while the step was being captured: siblings carry hooks."""
    return snapshot["lin"] == 2 and snapshot["out"] == 2 and snapshot["act"] == 2


# ---- non-training forwards ----------------------------------------------------------------------
@contextmanager
def _non_training(kind: str, model: nn.Module) -> Iterator[None]:
    if kind == "no_grad":
        with torch.no_grad():
            yield
    elif kind == "inference_mode":
        with torch.inference_mode():
            yield
    else:  # eval(), grad enabled: e.g. a validation loss that is even backpropagated
        model.eval()
        try:
            yield
        finally:
            model.train()


@pytest.mark.parametrize("kind", ["no_grad", "inference_mode", "eval"])
def test_non_training_forwards_are_not_steps_and_add_no_hooks(kind):
    model = Probed()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    assert hook_counts(model) == root_only(model)
    x = torch.randn(8, 16)
    for _ in range(3):
        with _non_training(kind, model):
            out = model(x)
            if kind == "eval":
                out.sum().backward()  # a backward outside a sampled step measures nothing
        assert handle.steps == 0
        assert hook_counts(model) == root_only(model)
    assert model.probe.snapshots == [root_only(model)] * 3  # inside the forwards as well
    assert handle.profile().num_samples == 0

    # The next training step is step 1, sampled and measured.
    model.zero_grad(set_to_none=True)
    train_step(model, x)
    assert handle.steps == 1
    assert _sampled_snapshot(model.probe.snapshots[-1])
    prof = handle.profile()
    assert prof.num_samples == 1 and prof.last_sample.step == 1
    keys = by_key(prof.invocations())
    assert set(keys) == {"<root>#0", "lin#0", "act#0", "probe#0", "out#0"}
    assert keys["lin#0"].bwd_ms > 0 and keys["out#0"].bwd_ms > 0
    assert hook_counts(model) == root_only(model)


def test_non_training_forwards_do_not_shift_the_sampling_schedule():
    model = Probed()
    handle = wandb_modprof.watch(model, log_freq=2, structure=False, run=disabled_run())
    x = torch.randn(8, 16)
    train_step(model, x)  # step 1
    with torch.no_grad():
        model(x)
    with torch.inference_mode():
        model(x)
    model.eval()
    model(x)
    model.train()
    assert handle.steps == 1 and handle.profile().num_samples == 0
    train_step(model, x)  # step 2: sampled
    assert handle.steps == 2
    prof = handle.profile()
    assert prof.num_samples == 1 and prof.last_sample.step == 2
    sampled = [_sampled_snapshot(s) for s in model.probe.snapshots]
    assert sampled == [False, False, False, False, True]


def test_unsampled_steps_carry_no_submodule_hooks():
    model = Probed()
    handle = wandb_modprof.watch(model, log_freq=3, structure=False, run=disabled_run())
    x = torch.randn(8, 16)
    for _ in range(7):
        train_step(model, x)
        # between steps (the sampled step's backward has finished): only the root's hooks
        assert hook_counts(model) == root_only(model)
    assert [_sampled_snapshot(s) for s in model.probe.snapshots] == [
        False,
        False,
        True,
        False,
        False,
        True,
        False,
    ]
    for snapshot in model.probe.snapshots:
        if not _sampled_snapshot(snapshot):
            assert snapshot == root_only(model)  # inside the forward: siblings hook-free
    assert handle.profile().num_samples == 2


def test_step_after_a_sampled_forward_without_backward_is_hook_free():
    """A sampled forward may keep its hooks until its backward (a checkpoint recompute needs
    them); if the backward never comes, the next, unsampled, step must still run hook-free."""
    model = Probed()
    handle = wandb_modprof.watch(model, log_freq=2, structure=False, run=disabled_run())
    x = torch.randn(8, 16)
    train_step(model, x)  # step 1
    model(x)  # step 2: sampled, its output dropped
    assert _sampled_snapshot(model.probe.snapshots[-1])
    train_step(model, x)  # step 3: unsampled
    assert model.probe.snapshots[-1] == root_only(model)
    assert hook_counts(model) == root_only(model)
    train_step(model, x)  # step 4: sampled and measured
    assert _sampled_snapshot(model.probe.snapshots[-1])
    assert hook_counts(model) == root_only(model)
    assert handle.profile().last_sample.step == 4


def test_forwards_without_backward_do_not_become_backward_samples():
    """Sampled training forwards whose output is dropped (a skipped step) must not be
    completed by the next step's backward: one backward ran, so one backward measurement."""
    model = Probed()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    x = torch.randn(8, 16)
    for _ in range(3):
        model(x)  # steps 1-3: forward only, output dropped
    train_step(model, x)  # step 4: forward and backward
    prof = handle.profile()
    assert prof.last_sample is not None
    assert prof.last_sample.step == 4
    stats = prof.stats()
    assert stats["<root>#0"].metrics["bwd_ms"].count == 1
    assert stats["lin#0"].metrics["bwd_ms"].count == 1
    assert hook_counts(model) == root_only(model)


# ---- gradient accumulation -------------------------------------------------------------------
def test_gradient_accumulation_counts_optimizer_steps_and_samples_first_micro_batch():
    model = Probed()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    handle = wandb_modprof.watch(
        model, log_freq=2, optimizer=opt, structure=False, run=disabled_run()
    )
    micro_batches, optimizer_steps = 3, 4
    sizes = [8, 4, 2]  # distinct batch sizes tell the micro-batches apart in the records
    for step in range(optimizer_steps):
        for size in sizes:
            train_step(model, torch.randn(size, 16))
            assert hook_counts(model) == root_only(model)
            assert handle.steps == step
        opt.step()
        opt.zero_grad(set_to_none=True)
        assert handle.steps == step + 1
        prof = handle.profile()
        if step + 1 == 2:
            assert prof.num_samples == 1 and prof.last_sample.step == 2
    prof = handle.profile()
    assert prof.num_samples == 2
    assert prof.last_sample.step == 4
    sampled = [_sampled_snapshot(s) for s in model.probe.snapshots]
    expected = [
        (step in (1, 3) and micro == 0)
        for step in range(optimizer_steps)
        for micro in range(micro_batches)
    ]
    assert sampled == expected
    # The sample is of the 8-row micro-batch: lin saves its 8x16 fp32 output... through ReLU.
    keys = by_key(prof.invocations())
    assert keys["<root>#0"].act_bytes is not None
    assert keys["act#0"].act_bytes == 8 * 16 * 4  # ReLU saves its output: 8 rows
    handle.unwatch()
    assert opt._optimizer_step_post_hooks == {}  # the optimizer hook is gone too
    assert hook_counts(model) == no_hooks(model)


# ---- bad input at the public boundary --------------------------------------------------------
def _assert_error(excinfo: pytest.ExceptionInfo[ModProfError], *needles: str) -> None:
    msg = str(excinfo.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"


def test_watch_rejects_a_non_module():
    with pytest.raises(ModProfError) as excinfo:
        wandb_modprof.watch(object(), structure=False, run=disabled_run())  # type: ignore[arg-type]
    _assert_error(excinfo, "expected a torch.nn.Module", "got", "object")
    with pytest.raises(ModProfError) as excinfo:
        wandb_modprof.profile(lambda x: x, structure=False)  # type: ignore[arg-type]
    _assert_error(excinfo, "expected a torch.nn.Module", "got", "function")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_watch_rejects_bad_log_freq(bad):
    model = nn.Linear(2, 2)
    with pytest.raises(ModProfError) as excinfo:
        wandb_modprof.watch(model, log_freq=bad, structure=False, run=disabled_run())
    _assert_error(excinfo, "log_freq", "int >= 1", f"got {bad!r}")
    assert hook_counts(model) == no_hooks(model)
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    with pytest.warns(UserWarning, match=r"0 training step\(s\)"):
        handle.unwatch()  # nothing half-registered


def test_bad_timing_and_optimizer():
    model = nn.Linear(2, 2)
    with pytest.raises(ModProfError) as excinfo:
        wandb_modprof.watch(
            model,
            settings=wandb_modprof.Settings(timing="gpu"),
            structure=False,
            run=disabled_run(),
        )
    _assert_error(excinfo, "timing must be one of", "'auto'", "'cpu'", "'device'", "got 'gpu'")
    with pytest.raises(ModProfError) as excinfo:
        wandb_modprof.profile(model, settings=wandb_modprof.Settings(timing="gpu"), structure=False)
    _assert_error(excinfo, "timing must be one of", "got 'gpu'")
    with pytest.raises(ModProfError) as excinfo:
        wandb_modprof.watch(model, optimizer="adam", structure=False, run=disabled_run())  # type: ignore[arg-type]
    _assert_error(excinfo, "optimizer must be a torch.optim.Optimizer", "got str")
    assert hook_counts(model) == no_hooks(model)


def test_watching_twice_and_profiling_a_watched_model():
    model = Probed()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    with pytest.raises(ModProfError) as excinfo:
        wandb_modprof.watch(model, log_freq=5, structure=False, run=disabled_run())
    _assert_error(excinfo, "Probed", "already being watched", "expected a model that is not hooked")
    with pytest.raises(ModProfError) as excinfo, wandb_modprof.profile(model, structure=False):
        pass
    _assert_error(excinfo, "Probed", "already being watched", "expected a model that is not hooked")
    # The failed calls changed nothing: the first watch still works, hooks not doubled.
    assert hook_counts(model) == root_only(model)
    train_step(model, torch.randn(4, 16))
    assert handle.profile().num_samples == 1

    with (
        wandb_modprof.profile(other := Probed(), structure=False),
        pytest.raises(ModProfError) as excinfo,
    ):
        wandb_modprof.watch(other, structure=False, run=disabled_run())
    _assert_error(excinfo, "already being profiled")
    assert hook_counts(other) == no_hooks(other)


def test_unwatch_of_an_unwatched_model():
    model = nn.Linear(2, 2)
    with pytest.raises(ModProfError) as excinfo:
        wandb_modprof.unwatch(model)
    _assert_error(excinfo, "unwatch() expected a model passed to watch()", "Linear is not watched")
    with pytest.raises(ModProfError) as excinfo:
        wandb_modprof.unwatch("model")  # type: ignore[arg-type]
    _assert_error(excinfo, "expected a torch.nn.Module", "got builtins.str")
    handle = wandb_modprof.watch(model, structure=False, run=disabled_run())
    with pytest.warns(UserWarning, match=r"0 training step\(s\)"):
        handle.unwatch()
    with pytest.raises(ModProfError):
        wandb_modprof.unwatch(model)  # already unwatched
    handle.unwatch()  # the handle's own unwatch is idempotent


# ---- unwatch ---------------------------------------------------------------------------------
def test_unwatch_removes_every_hook():
    model = Probed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = wandb_modprof.watch(
        model, log_freq=2, optimizer=opt, structure=False, run=disabled_run()
    )
    x = torch.randn(4, 16)
    for _ in range(5):
        train_step(model, x)
        opt.step()
        opt.zero_grad(set_to_none=True)
    prof = handle.unwatch()
    assert prof.num_samples == 2
    assert hook_counts(model) == no_hooks(model)
    assert opt._optimizer_step_post_hooks == {}
    assert not handle.active
    n = len(model.probe.snapshots)
    train_step(model, x)
    assert model.probe.snapshots[n] == no_hooks(model)  # inside the forward too
    assert prof.num_samples == 2
    again = wandb_modprof.watch(model, structure=False, run=disabled_run())  # can be watched again
    with pytest.warns(UserWarning, match=r"0 training step\(s\)"):
        again.unwatch()


def test_unwatch_between_sampled_forward_and_backward():
    base = Probed()
    x = torch.randn(4, 16)
    ref = copy.deepcopy(base)
    train_step(ref, x)

    model = copy.deepcopy(base)
    model.probe.root_ref = weakref.ref(model)
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    with recorded_warnings() as caught:
        loss = model(x).pow(2).mean()
        assert _sampled_snapshot(model.probe.snapshots[-1])
        prof = handle.unwatch()
        assert hook_counts(model) == no_hooks(model)
        loss.backward()  # the abandoned sample's node hooks must stay inert
    (notice,) = ours(caught)  # no internal error: only unwatch() saying nothing was measured
    assert "1 training step(s) with log_freq=1 and no sample completed (a sample" in str(
        notice.message
    )
    assert prof.num_samples == 0
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    # A second backward-bearing step on the unwatched model, and a fresh watch, both work.
    model.zero_grad(set_to_none=True)
    train_step(model, x)
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    train_step(model, x)
    assert handle.profile().num_samples == 1


def test_unwatch_all():
    a, b = Probed(), Probed()
    wandb_modprof.watch(a, log_freq=1, structure=False, run=disabled_run())
    wandb_modprof.watch(b, log_freq=1, structure=False, run=disabled_run())
    with pytest.warns(UserWarning, match=r"0 training step\(s\)") as said:
        wandb_modprof.unwatch()
    assert len(said) == 2  # one per model
    assert hook_counts(a) == no_hooks(a) and hook_counts(b) == no_hooks(b)


# ---- a watch that ends before any sample says so at unwatch() ---------------------------------
def test_unwatch_before_any_sample_warns_at_the_callers_line_with_what_to_change():
    model = Probed()
    handle = wandb_modprof.watch(model, log_freq=100, run=disabled_run())
    for _ in range(7):
        train_step(model, torch.randn(4, 16))
    with recorded_warnings() as caught:
        handle.unwatch()
    (notice,) = ours(caught)
    assert notice.filename == __file__  # this line's unwatch(), not ours
    assert str(notice.message) == (
        "wandb_modprof: Probed was watched for 7 training step(s) with log_freq=100: steps "
        "100, 200, ... are sampled, so none was, nothing logged.\n"
        "To measure a run this short, pass a log_freq below its length, e.g. "
        "watch(model, log_freq=2)."
    )
    with recorded_warnings() as caught:
        handle.unwatch()  # already removed: said once
    assert ours(caught) == []


def test_unwatch_without_training_steps_says_what_a_step_is():
    model = Probed()
    handle = wandb_modprof.watch(model, log_freq=4, run=disabled_run())
    with torch.no_grad():
        model(torch.randn(4, 16))  # not a training step
    with recorded_warnings() as caught:
        wandb_modprof.unwatch(model)
    (notice,) = ours(caught)
    assert notice.filename == __file__
    assert "watched for 0 training step(s) with log_freq=4 and no sample was taken: no " in str(
        notice.message
    )
    assert "a forward in training mode with grad enabled" in str(notice.message)
    assert handle.profile().num_samples == 0


def test_unwatch_after_a_sample_says_nothing():
    model = Probed()
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
    for _ in range(4):
        train_step(model, torch.randn(4, 16))
    with recorded_warnings() as caught:
        prof = handle.unwatch()
    assert prof.num_samples >= 1 and ours(caught) == []
