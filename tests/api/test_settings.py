"""`wandb_modprof.Settings`: what experts change, out of `watch` and `profile`'s signatures.

`watch` and `profile` keep the arguments every user sets (at most 10 each); the rest are
`Settings` fields. The keyword arguments they replaced still work, warn once each with the
replacement, and do what they did; a value given both ways, a wrong type, or a field of a
W&B run given to `profile` is refused."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from helpers import disabled_run
from models import TinyGPT, gpt_input
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError, Settings
from wandb_modprof.api import settings as settings_mod


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the once-per-process warnings afresh."""
    monkeypatch.setattr(settings_mod, "_told", set())


def test_watch_and_profile_take_at_most_ten_parameters() -> None:
    watch = inspect.signature(wandb_modprof.watch).parameters
    profile = inspect.signature(wandb_modprof.profile).parameters
    assert len(watch) <= 10 and len(profile) <= 10
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert not fields & set(watch) and not fields & set(profile)
    assert "settings" in watch and "settings" in profile


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))


def _steps(model: nn.Module, n: int) -> None:
    for _ in range(n):
        model(torch.ones(2, 4)).sum().backward()


def test_settings_reach_profile() -> None:
    model = _mlp()
    with wandb_modprof.profile(model, structure=False) as plain:
        _steps(model, 3)
    with wandb_modprof.profile(model, structure=False, settings=Settings(warmup=2)) as warm:
        _steps(model, 3)
    assert (plain.num_samples, warm.num_samples) == (3, 1)


def test_a_moved_argument_warns_once_and_still_works() -> None:
    model = _mlp()
    with (
        pytest.warns(FutureWarning, match=r"profile\(warmup=\.\.\.\) is deprecated") as told,
        wandb_modprof.profile(model, structure=False, warmup=2) as prof,
    ):
        _steps(model, 3)
    assert prof.num_samples == 1  # warmup=2 took effect
    assert "settings=wandb_modprof.Settings(warmup=...)" in str(told[0].message)
    assert told[0].filename == __file__  # reported at the user's line
    with wandb_modprof.profile(model, structure=False, warmup=1) as again:  # no second warning
        _steps(model, 2)
    assert again.num_samples == 1


def test_watch_takes_settings_and_the_moved_arguments() -> None:
    model = TinyGPT()
    handle = wandb_modprof.watch(
        model, log_freq=1, run=disabled_run(), settings=Settings(offload=False, overhead=0.05)
    )
    try:
        assert handle._handoff is None  # offload=False: no worker
        assert handle._counter.budget == 0.05
    finally:
        handle.unwatch()
    with pytest.warns(FutureWarning, match=r"watch\(default_mode=\.\.\.\)"):
        handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run(), default_mode="bwd")
    try:
        model(gpt_input()).float().pow(2).mean().backward()
        assert handle._wandb_log is not None
        assert handle._wandb_log.string_fields["mode"] == "bwd"
    finally:
        handle.unwatch()


def test_bad_settings_are_refused() -> None:
    model = _mlp()
    with pytest.raises(ModProfError, match=r"watch\(\) settings expected a wandb_modprof"):
        wandb_modprof.watch(model, run=disabled_run(), settings={"timing": "cpu"})  # type: ignore[arg-type]
    with pytest.raises(ModProfError, match=r"profile\(\) settings expected only fields"):
        wandb_modprof.profile(model, settings=Settings(offload=False))
    with pytest.raises(ModProfError, match="timing must be one of"):
        wandb_modprof.profile(model, settings=Settings(timing="gpu"))
    with (
        pytest.warns(FutureWarning),
        pytest.raises(ModProfError, match="expected warmup once, in settings=Settings"),
    ):
        wandb_modprof.profile(model, warmup=1, settings=Settings(warmup=2))


def test_framework_callbacks_pass_settings_on() -> None:
    from wandb_modprof.integrations import check_watch_options

    assert check_watch_options("ModProfCallback", 5, {"settings": Settings(warmup=1)}) == 5
    assert check_watch_options("ModProfCallback", 5, {"offload": False}) == 5  # (watch warns)
    with pytest.raises(ModProfError, match=r"expected options of wandb_modprof\.watch"):
        check_watch_options("ModProfCallback", 5, {"ofload": False})
