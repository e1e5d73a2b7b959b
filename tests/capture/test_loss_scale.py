"""Gradient norms under loss scaling (`capture/memory/loss_scale.py`), with a real
`torch.amp.GradScaler` on the CPU (bfloat16 autocast).

Every sample's gradient norms are the unscaled ones: the root's equals what
`clip_grad_norm_` after `scaler.unscale_` returns, sample by sample while the scale doubles
each step (`growth_interval=1`), with or without `optimizer=`, for a foreach and a fused
optimizer, with gradient accumulation and read before the step. A step whose gradients
overflowed reads None; without a scaler nothing changes (an inf norm stays inf). Training is
bitwise that of an unwatched twin, and the process-global step pre-hook is registered only
while a step is awaited, never on an unsampled step.
"""

from __future__ import annotations

import math
import pickle
import statistics
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers import disabled_run
from torch import nn
from torch.optim.optimizer import _global_optimizer_pre_hooks, register_optimizer_step_pre_hook

import wandb_modprof
from wandb_modprof.capture.memory import loss_scale
from wandb_modprof.capture.memory.gradient_readings import GradientReading
from wandb_modprof.capture.step_phases import PhaseWatch

ROOT = "<root>#0"


def _pre_hooks() -> int:
    """Global optimizer pre-hooks other than the step phases' (`capture/step_phases.py`: on
    from a sampled backward to the next forward, and kept by a capture another test left
    attached): the loss scale's, and a user's."""
    hooks = _global_optimizer_pre_hooks.values()
    return sum(1 for h in hooks if not isinstance(getattr(h, "__self__", None), PhaseWatch))


def _model() -> nn.Module:
    with torch.random.fork_rng(devices=[]):  # (the user's stream is not ours to draw from)
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 1)
        )


def _batches(seed: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)


def _scaler(**kwargs: Any) -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", growth_interval=1, **kwargs)


def _backward(
    model: nn.Module, scaler: torch.amp.GradScaler, x: torch.Tensor, y: torch.Tensor
) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()


def _norm(tensors: Iterator[torch.Tensor | None]) -> float:
    return math.sqrt(sum(float(t.double().square().sum()) for t in tensors if t is not None))


def _step(
    model: nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler
) -> tuple[float, float, float]:
    """Unscale, clip, step, update: (the scale of this step, the total norm clip_grad_norm_
    returned, the first layer's unscaled gradient norm)."""
    scale = scaler.get_scale()
    scaler.unscale_(opt)
    first = _norm(p.grad for p in model[0].parameters())
    total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5))
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return scale, total, first


def _records(prof: wandb_modprof.Profile) -> dict[str, wandb_modprof.InvocationRecord]:
    return {r.key: r for r in prof.invocations()}


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.parametrize("given", [False, True], ids=["no-optimizer", "optimizer"])
def test_grad_norms_are_unscaled_while_the_scale_changes(fused: bool, given: bool) -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)
    scaler = _scaler()
    data = _batches()
    scales, totals = [], []
    with wandb_modprof.profile(model, optimizer=opt if given else None, structure=False) as prof:
        for _ in range(5):
            _backward(model, scaler, *next(data))
            scale, total, first = _step(model, opt, scaler)
            recs = _records(prof)  # read after the step
            assert recs[ROOT].grad_norm == pytest.approx(total, rel=1e-5)
            assert recs["0#0"].grad_norm == pytest.approx(first, rel=1e-5)
            scales.append(scale)
            totals.append(total)
    assert scales == [65536.0 * 2**i for i in range(5)]  # 5 scales, one norm scale
    # the statistics fold unscaled norms (the model's first step is left out of them)
    median = prof.stats()[ROOT].metrics["grad_norm"].median
    assert median == pytest.approx(statistics.median(totals[1:]), rel=1e-5)
    assert _pre_hooks() == 0


def test_watched_training_with_accumulation_is_bitwise_its_twin_and_unscaled() -> None:
    """`watch` (optimizer steps counted, two micro-batches a step): each sample is read at the
    next micro-batch's forward, before its step, with the scale of the scaler seen at the
    first step. Parameters and the scaler's state end bitwise equal to an unwatched twin."""
    model, twin = _model(), _model()
    runs = []
    for net, watched in ((model, True), (twin, False)):
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        scaler = _scaler()
        handle = None
        if watched:
            handle = wandb_modprof.watch(
                net, log_freq=2, optimizer=opt, structure=False, run=disabled_run()
            )
        data = _batches()
        firsts = []
        for _ in range(6):
            _backward(net, scaler, *next(data))
            first = _norm(p.grad for p in net[0].parameters()) / scaler.get_scale()
            firsts.append(first)
            _backward(net, scaler, *next(data))
            _step(net, opt, scaler)
        if handle is not None:
            prof = handle.profile()
            # steps 2, 4, 6 sampled; the last one's first micro-batch
            assert prof.num_samples == 3
            assert _records(prof)["0#0"].grad_norm == pytest.approx(firsts[5], rel=1e-5)
            handle.unwatch()
        runs.append(([p.detach().clone() for p in net.parameters()], scaler.state_dict()))
    (params, state), (twin_params, twin_state) = runs
    assert all(torch.equal(a, b) for a, b in zip(params, twin_params, strict=True))
    assert state == twin_state
    assert _pre_hooks() == 0


def test_a_sample_read_before_its_step_uses_the_scaler_seen_before() -> None:
    """Results read between the backward and the step: from the second step on, the scale is
    the remembered scaler's; the first sample had none to go by (its norm is the scaled one,
    as read) and that is warned once, at the step that finds the scaler."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = _scaler()
    data = _batches()
    with wandb_modprof.profile(model, structure=False) as prof:
        for i in range(4):
            _backward(model, scaler, *next(data))
            raw = _norm(p.grad for p in model.parameters())
            read = _records(prof)[ROOT].grad_norm  # before the step
            if i == 0:
                assert read == pytest.approx(raw, rel=1e-5)
                with pytest.warns(RuntimeWarning, match="read before the first optimizer step"):
                    _step(model, opt, scaler)
            else:
                assert read == pytest.approx(raw / scaler.get_scale(), rel=1e-5)
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    _step(model, opt, scaler)


def test_an_overflowed_step_has_no_grad_norms_and_the_next_is_unscaled() -> None:
    """Scaled gradients that overflow float32: the GradScaler skips that step (the parameters
    stay) and no module of that sample has a gradient norm (None), never inf or NaN, nor the
    finite ones of a step whose gradients were discarded; the next step, backed off, is
    unscaled as usual."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = _scaler(init_scale=2.0**40, backoff_factor=2.0**-30)
    data = _batches()
    with wandb_modprof.profile(model, structure=False) as prof:
        _backward(model, scaler, *next(data))
        _, total, _ = _step(model, opt, scaler)
        assert _records(prof)[ROOT].grad_norm == pytest.approx(total, rel=1e-5)
        x, y = next(data)
        _backward(model, scaler, x, y * 1e30)  # (2 (out - y) / 16 x 2**41: over float32's max)
        assert not all(torch.isfinite(p.grad).all() for p in model.parameters())
        before = [p.detach().clone() for p in model.parameters()]
        _step(model, opt, scaler)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        assert all(r.grad_norm is None for r in prof.invocations())
        _backward(model, scaler, *next(data))
        scale, total, _ = _step(model, opt, scaler)
        assert scale == 2.0**11
        assert _records(prof)[ROOT].grad_norm == pytest.approx(total, rel=1e-5)


def test_overflowed_first_steps_are_settled_by_the_first_step_taken() -> None:
    """The first steps overflow before any step was taken (so no scaler is known yet): the
    skipped steps call no `optimizer.step()`, and the first one taken settles their samples,
    which then have no gradient norms; nothing scaled reaches the statistics."""
    model = _model()
    for p in model.parameters():  # (not the model's first step: every sample is folded)
        p.grad = torch.zeros_like(p)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = _scaler(init_scale=2.0**127, backoff_factor=2.0**-50)
    data = _batches()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with wandb_modprof.profile(model, structure=False) as prof:
            for factor in (1e20, 1e20, 1.0):
                x, y = next(data)
                _backward(model, scaler, x, y * factor)
                scale, total, _ = _step(model, opt, scaler)
    assert scale == 2.0**27  # two steps skipped
    stat = prof.stats()[ROOT].metrics
    assert stat["fwd_ms"].count == 3
    assert stat["grad_norm"].count == 1
    assert stat["grad_norm"].mean == pytest.approx(total, rel=1e-5)


def test_without_a_scaler_norms_are_as_read_and_inf_stays_inf() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = _batches()
    with wandb_modprof.profile(model, structure=False) as prof:
        x, y = next(data)
        nn.functional.mse_loss(model(x), y).backward()
        total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9))
        opt.step()
        opt.zero_grad()
        assert _records(prof)[ROOT].grad_norm == pytest.approx(total, rel=1e-5)
        (nn.functional.mse_loss(model(x), y) * math.inf).backward()
        opt.zero_grad()  # (a step of nothing: the scaler-less step is seen)
        opt.step()
        assert not math.isfinite(_records(prof)[ROOT].grad_norm or 0.0)
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    with wandb_modprof.profile(model, structure=False) as prof:
        _backward(model, disabled, *next(data))
        raw = _norm(p.grad for p in model.parameters())
        disabled.step(opt)
        assert _records(prof)[ROOT].grad_norm == pytest.approx(raw, rel=1e-5)


def test_the_step_hook_is_registered_only_while_a_step_is_awaited() -> None:
    """From attach to the first step, and from a sampled backward to the step after it; an
    unsampled step runs none of our code. A hook of the user's after ours makes ours stay
    (removing it there would break the step: torch iterates the live dict), inert, until our
    next call outside a step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = _scaler()
    data = _batches()
    handle = wandb_modprof.watch(
        model, log_freq=3, optimizer=opt, structure=False, run=disabled_run()
    )
    try:
        registered = []
        for _ in range(7):
            _backward(model, scaler, *next(data))
            registered.append(_pre_hooks())
            _step(model, opt, scaler)
            registered.append(_pre_hooks())
        # attach: registered until step 1; sampled steps 3 and 6: from backward to the next
        # forward (the step phases' hook, registered after ours, keeps ours there, inert, as a
        # user's hook does below)
        assert registered == [1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0]
        _backward(model, scaler, *next(data))  # step 8
        _step(model, opt, scaler)
        _backward(model, scaler, *next(data))  # step 9, sampled: ours registered
        seen = []
        user = register_optimizer_step_pre_hook(lambda o, a, k: seen.append(1))
        try:
            _step(model, opt, scaler)  # ours is not the last hook: it stays, inert
            assert seen == [1]
            assert _pre_hooks() == 2
            model(next(data)[0])  # the sample is handed over at the next forward: tidied
            assert _pre_hooks() == 1
        finally:
            user.remove()
        assert handle.profile().num_samples == 3
    finally:
        handle.unwatch()
    assert _pre_hooks() == 0


def test_only_an_optimizer_of_the_models_parameters_is_read() -> None:
    """Another model's optimizer, stepped by its own scaler first, says nothing about ours."""
    model, other = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.05)
    scaler, other_scaler = _scaler(), _scaler(init_scale=2.0**10)
    data = _batches()
    with wandb_modprof.profile(model, structure=False) as prof:
        for _ in range(2):
            x, y = next(data)
            _backward(model, scaler, x, y)
            _backward(other, other_scaler, x, y)
            _step(other, other_opt, other_scaler)
            _, total, _ = _step(model, opt, scaler)
            assert _records(prof)[ROOT].grad_norm == pytest.approx(total, rel=1e-5)


def test_an_optimizer_is_found_holding_the_model_once_until_its_parameters_change() -> None:
    """The model is walked once per optimizer, not at every sampled step; an optimizer whose
    parameters were swapped for another model's is asked again."""
    model, other = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    class Owner:
        def on_error(self, where: str, error: Exception) -> None:
            raise AssertionError(where, error)

    owner = Owner()  # (the watch holds its warn-once weakly)
    watch = loss_scale.LossScaleWatch(model, owner.on_error)
    assert watch._holds_model(opt)
    walks = []
    real = model.parameters
    model.parameters = lambda *a, **k: (walks.append(1), real(*a, **k))[1]  # type: ignore[method-assign]
    assert watch._holds_model(opt)
    assert walks == []  # (remembered)
    opt.param_groups[0]["params"] = list(other.parameters())
    assert not watch._holds_model(opt)
    assert walks == [1]
    assert not watch._holds_model(torch.optim.SGD(other.parameters(), lr=0.05))


def test_a_failure_finding_the_scaler_warns_once_and_the_step_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Our step pre-hook never breaks the user's step: an error inside it warns once (as an
    internal error at '<loss scale>'), the step runs, and nothing stays registered."""

    def broken(frame: object) -> None:
        raise RuntimeError("no frames here")

    monkeypatch.setattr(loss_scale, "_stepping_scaler", broken)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = _scaler()
    data = _batches()
    with wandb_modprof.profile(model, structure=False) as prof:
        _backward(model, scaler, *next(data))
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.warns(RuntimeWarning, match="'<loss scale>'"):
            _step(model, opt, scaler)
        assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        _backward(model, scaler, *next(data))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (once)
            _step(model, opt, scaler)
        assert prof.num_samples == 2
    assert _pre_hooks() == 0


def test_a_reading_marks_overflow_only_under_a_scaler() -> None:
    """A non-finite gradient in a loss-scaled reading is the scaler's overflow: no module has a
    gradient norm in that sample (parameter norms stay). The same without a scaler is the
    model's own, kept per module. The worker gets the reading pickled."""
    members = {"<root>": [0, 1], "a": [0], "b": [1]}
    names = set(members)
    scaled = GradientReading([4, 4], None, [1.0, 1.0], [math.inf, 4.0], loss_scaled=True)
    state = pickle.loads(pickle.dumps(scaled)).resolve(members, names)
    assert state.grad_norm == dict.fromkeys(names, None)
    assert state.param_norm["a"] == 1.0
    plain = GradientReading([4, 4], None, [1.0, 1.0], [math.inf, 4.0])
    state = pickle.loads(pickle.dumps(plain)).resolve(members, names)
    assert state.grad_norm == {"<root>": math.inf, "a": math.inf, "b": 2.0}
    finite = GradientReading([4, 4], None, [1.0, 1.0], [9.0, None], loss_scaled=True)
    assert finite.resolve(members, names).grad_norm == {"<root>": 3.0, "a": 3.0, "b": None}


def test_the_grad_scaler_internals_relied_on() -> None:
    """`loss_scale.py` reads a GradScaler's scale without a sync and finds the scaler in the
    frames of its `step` / `_maybe_opt_step`: pinned here, so a torch that changes them fails
    loudly instead of reporting scaled norms."""
    scaler = _scaler()
    scaler.scale(torch.ones((), requires_grad=True))
    scale = scaler._get_scale_async()
    assert isinstance(scale, torch.Tensor) and scale is scaler._scale
    assert float(scale) == 65536.0
    assert callable(torch.amp.GradScaler.step) and callable(torch.amp.GradScaler._maybe_opt_step)
