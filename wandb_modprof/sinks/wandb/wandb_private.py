"""Every private or experimental W&B API wandb_modprof touches, in one place.

>>> from wandb_modprof.sinks.wandb import wandb_private as wp
>>> wp.check()  # at watch: one warning per API the installed wandb lacks, saying what is lost

W&B's SDK may change any of these in a release. Each is named in `REGISTRY` with what the user
loses without it; `check()` looks them up once, at the first watch that has wandb imported (a
W&B run), and warns once per missing API naming the wandb version. The code using one then
does without it: nothing raises. W&B is imported by the caller, never here at import.
Known limitation: `_validate.check_run` (the lowest stage of the package, which may not import
this module) reads `Run._is_finished` itself; it is registered and checked here all the same.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import sys
from collections.abc import Callable
from typing import Any

from wandb_modprof._lookup import NOT_FOUND, lookup_dotted
from wandb_modprof._warn import warn_at_user

_TEARDOWN = "run.finish() does not unwatch the model first: call unwatch() before run.finish()"
_ATTACH = "the worker process cannot log to the run: the training thread logs the tables"
REGISTRY: dict[str, str] = {  # name -> what the user loses without it
    "wandb.sdk.wandb_run.Run._teardown_hooks": _TEARDOWN,
    "wandb.sdk.wandb_run.TeardownHook": _TEARDOWN,
    "wandb.sdk.wandb_run.TeardownStage.EARLY": _TEARDOWN,
    "wandb.attach": _ATTACH,  # (public, but not in W&B's type stubs)
    "wandb.Settings.x_files_dir": _ATTACH,  # (an experimental setting: `x_`)
    "wandb.env.SERVICE": _ATTACH,  # the environment variable holding the service's address
    "wandb.sdk.wandb_run.Run._is_finished": "watch() accepts a finished run, whose first log "
    "then fails",
}
SERVICE_ENV = "WANDB_SERVICE"  # (`wandb.env.SERVICE`)


def wandb_version() -> str:
    try:
        return importlib.metadata.version("wandb")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _setting(owner: str, found: Any, part: str) -> Any:
    # a setting (pydantic field): on instances only
    return None if part in getattr(found, "model_fields", {}) else NOT_FOUND


def lookup(name: str) -> Any:
    """The object `name` names (None for an attribute only the class's code or its settings
    fields show); AttributeError or ImportError where this wandb lacks it."""
    found = lookup_dotted(name, _setting)
    if name == "wandb.env.SERVICE" and found != SERVICE_ENV:
        raise AttributeError(f"wandb.env.SERVICE is {found!r}, not {SERVICE_ENV!r}")
    return found


def resolves(name: str) -> bool:
    try:
        lookup(name)
    except (AttributeError, ImportError, OSError):
        return False
    return True


def check() -> None:
    """Warn once for each registered API the installed wandb lacks, naming what is lost; a
    watch without wandb imported (a stand-in run) checks nothing yet."""
    if "wandb" in sys.modules:
        _check_once()


@functools.cache
def _check_once() -> None:
    for name in REGISTRY:
        if not resolves(name):
            warn_missing(name)


_WARNED: set[str] = set()  # the APIs warned about, once per process


def warn_missing(name: str, where: str = "") -> None:
    """The one warning about `name` (missing from wandb, or from the run object `where`)."""
    if name in _WARNED:
        return
    _WARNED.add(name)
    warn_at_user(
        f"wandb_modprof: a private W&B API is missing from wandb {wandb_version()}: "
        f"{name}{where}; {REGISTRY[name]}",
        RuntimeWarning,
    )


# ---- teardown hooks: our last log runs inside run.finish() ----------------------------------
def add_teardown_hook(run: Any, fn: Callable[[], None]) -> bool:
    """`run.finish()` calls `fn` first, before the run is marked finished (W&B's teardown
    hooks, stage EARLY); False, and the one warning, where the run or wandb has none (a
    disabled run, which logs nothing, is left alone without a warning)."""
    try:
        hooks = run._teardown_hooks
    except Exception:  # a stand-in without them, or a run object that refuses the read
        hooks = None
    if not isinstance(hooks, list):
        if not getattr(run, "disabled", False):
            where = f" (the run object, a {type(run).__name__}, has none)"
            warn_missing("wandb.sdk.wandb_run.Run._teardown_hooks", where)
        return False
    try:
        from wandb.sdk.wandb_run import TeardownHook, TeardownStage

        hook = TeardownHook(fn, TeardownStage.EARLY)
    except (ImportError, AttributeError, TypeError):  # renamed, or another signature
        warn_missing("wandb.sdk.wandb_run.TeardownHook")
        return False
    hooks.append(hook)
    return True


# ---- attaching a worker process to the run --------------------------------------------------
def has_attach(wandb: Any) -> bool:
    return hasattr(wandb, "attach")


def files_dir_settings(wandb: Any, files_dir: str) -> Any:
    """Settings that make W&B write the run's files (the tables) into `files_dir`."""
    return wandb.Settings(x_files_dir=files_dir)


def attach(wandb: Any, run_id: str) -> Any:
    """The run `run_id`, attached to from this process (its service: `SERVICE_ENV`)."""
    return wandb.attach(attach_id=run_id)
