"""The private and experimental W&B APIs the package uses (`sinks/wandb/wandb_private.py`)
exist in the installed SDK, and a missing one costs a warning, never a crash. Real W&B SDK."""

from __future__ import annotations

import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import wandb
from helpers import disabled_run, run_double

from wandb_modprof.sinks.wandb import wandb_private as wp
from wandb_modprof.sinks.wandb.wandb_run import call_at_finish


class Owner:
    """What `watch` hands `call_at_finish`: weakly referenceable."""


LEAD = "wandb_modprof: a private W&B API is missing from wandb "


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the once-per-process warnings anew (and leaves the process's alone)."""
    monkeypatch.setattr(wp, "_WARNED", set())


@pytest.mark.parametrize("name", list(wp.REGISTRY))
def test_every_entry_resolves_on_this_wandb(name: str) -> None:
    assert wp.resolves(name), f"wandb {wandb.__version__} lacks {name}"


def test_check_is_quiet_on_this_wandb() -> None:
    wp._check_once.cache_clear()
    wp.check()  # (filterwarnings = error: a warning fails here)


def test_a_missing_api_warns_once_naming_the_version_the_api_and_the_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(wp.REGISTRY, "wandb.sdk.wandb_run.Run._no_such_hooks", "a loss")
    wp._check_once.cache_clear()
    try:
        with pytest.warns(RuntimeWarning) as seen:
            wp.check()
            wp.check()
        assert [str(w.message) for w in seen] == [
            f"{LEAD}{wandb.__version__}: wandb.sdk.wandb_run.Run._no_such_hooks; a loss"
        ]
    finally:
        wp._check_once.cache_clear()


def test_a_run_without_teardown_hooks_gets_one_warning_and_no_crash() -> None:
    owner = Owner()
    called: list[object] = []
    fake = SimpleNamespace(log=lambda *a, **k: None, id="fake")  # no `_teardown_hooks`
    with pytest.warns(RuntimeWarning) as seen:
        call_at_finish(fake, owner, called.append)
        call_at_finish(fake, owner, called.append)  # once per process
    assert [str(w.message) for w in seen] == [
        f"{LEAD}{wandb.__version__}: wandb.sdk.wandb_run.Run._teardown_hooks (the run object, "
        "a SimpleNamespace, has none); run.finish() does not unwatch the model first: call "
        "unwatch() before run.finish()"
    ]
    assert called == []


def test_a_disabled_run_without_teardown_hooks_is_left_alone() -> None:
    run = disabled_run()  # (it logs nothing: nothing to unwatch first)
    call_at_finish(run, Owner(), lambda owner: None)
    run.finish()


def test_a_run_with_teardown_hooks_runs_ours_first_while_the_owner_lives() -> None:
    run = run_double()
    owner = Owner()
    called: list[object] = []
    call_at_finish(run, owner, called.append)
    (hook,) = run._teardown_hooks
    assert hook.stage == wandb.sdk.wandb_run.TeardownStage.EARLY
    hook.call()
    assert called == [owner]
    ref = weakref.ref(owner)
    del owner
    called.clear()
    assert ref() is None
    hook.call()  # the owner is gone: nothing to do
    assert called == []


def test_a_teardown_hook_class_wandb_changed_is_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: Any) -> None:
        raise TypeError("another signature")

    monkeypatch.setattr(wandb.sdk.wandb_run, "TeardownHook", refuse)
    run = run_double()
    with pytest.warns(RuntimeWarning, match="wandb.sdk.wandb_run.TeardownHook; run.finish"):
        assert not wp.add_teardown_hook(run, lambda: None)
    assert run._teardown_hooks == []


def test_the_attach_helpers_use_the_registered_names() -> None:
    assert wp.has_attach(wandb)
    assert wp.SERVICE_ENV == wandb.env.SERVICE
    settings = wp.files_dir_settings(wandb, "/tmp/files")
    assert settings.x_files_dir == "/tmp/files"
