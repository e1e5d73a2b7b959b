from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import wandb_modprof


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite tests/golden/* from the current output instead of comparing with it",
    )


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the whole session (playwright's sync API allows one per
    thread): the panel's and the report's browser tests share it. Skips where the browser or
    the vendored Vega is missing, fails instead under MODPROF_REQUIRE_BROWSER (CI)."""
    import browser

    try:
        launched = browser.launch()
        started = launched.__enter__()
    except browser.BrowserUnavailableError as e:
        if os.environ.get("MODPROF_REQUIRE_BROWSER"):
            pytest.fail(str(e))
        pytest.skip(str(e))
    try:
        yield started
    finally:
        launched.__exit__(None, None, None)


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens"))


@pytest.fixture(autouse=True)
def _hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Deterministic seeds, W&B kept offline inside the test's tmp dir, no leftover hooks."""
    torch.manual_seed(0)
    for var in (
        "WANDB_DIR",
        "WANDB_CACHE_DIR",
        "WANDB_DATA_DIR",
        "WANDB_CONFIG_DIR",
        "WANDB_ARTIFACT_DIR",
    ):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB_DISABLE_CODE", "true")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    # The offline-run notice is once per process: as if given already, so that which test sees
    # it does not depend on the order the tests ran in; a test that expects it resets the set.
    from wandb_modprof.sinks.wandb import wandb_names

    monkeypatch.setattr(wandb_names, "_NOTICES", {"offline"})
    process_before = _process_state()
    yield
    with warnings.catch_warnings():
        # A test that watches to check something else (an error, the hooks, a key) and leaves
        # the model watched, short of a sample, gets the short-run notice here, at cleanup:
        # expected, and no part of what it tests. Any other warning still fails the test.
        warnings.filterwarnings("ignore", r"wandb_modprof: .* was watched for \d+ ", UserWarning)
        wandb_modprof.unwatch()
    # A run a test left open is `wandb.run` for the next test: transformers' WandbCallback
    # would log into it instead of starting its own.
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.run.finish()
    _assert_process_unchanged(process_before)


def _process_state() -> dict[str, object]:
    """What nothing of ours may leave changed once a test's models are unwatched: the
    collector, the saved-tensor hooks, torch's modes, SIGINT's handler."""
    import gc
    import signal

    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return {
        "the collector on": gc.isenabled(),
        "saved-tensor hooks": torch._C._autograd._top_saved_tensors_default_hooks(False),
        "dispatch modes": len(_get_current_dispatch_mode_stack()),
        "function modes": len(_get_current_function_mode_stack()),
        "SIGINT handler": signal.getsignal(signal.SIGINT),
    }


def _assert_process_unchanged(before: dict[str, object]) -> None:
    """Guards for every test, not cases: the process as the test found it, and no global random
    generator moved by our own work (`capture.step.random_state` puts a moved one back and
    records where). Put right before failing, so that one test's leak fails that test only."""
    import gc
    import signal

    from wandb_modprof.capture.step import random_state

    after = _process_state()
    moved = random_state.moved()
    random_state.forget_moved()
    if after["the collector on"] != before["the collector on"]:
        (gc.enable if before["the collector on"] else gc.disable)()
    if after["SIGINT handler"] != before["SIGINT handler"]:
        signal.signal(signal.SIGINT, before["SIGINT handler"])  # type: ignore[arg-type]
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not changed, f"the test left the process changed: {changed}"
    assert not moved, f"our own work drew from a global random generator: {moved}"


if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make unit` runs one worker per core: one intra-op thread each, so that OpenMP threads
    # do not wait for a core the other worker holds (a test that sets its own count still may)
    torch.set_num_threads(1)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Offline from the start, not only inside each test (`_hermetic`): W&B keeps the settings of
# the process's first `wandb.init`, and a module-scoped fixture's init runs before any
# function-scoped fixture (a later test's `wandb.init()` then went online and asked for a key).
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_SILENT"] = "true"
os.environ.pop("WANDB_API_KEY", None)


@pytest.fixture
def isolate_saved_tensor_hooks() -> Iterator[None]:
    """Keep a test that leaves saved-tensor hooks pushed (a bug it reports) from changing the
    tests after it: the default-hooks stack is process-global (per thread)."""
    from wandb_modprof.capture.step import torch_private as tp

    assert not tp.saved_tensors_hooks_active()
    yield
    while tp.saved_tensors_hooks_active():
        torch._C._autograd._pop_saved_tensors_default_hooks()
