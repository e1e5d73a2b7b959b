"""The compiled node stamps (`native_stamps.cpp`): built once per torch version, cached, loaded.

Per autograd node a Python hook costs ~10 us to run and a few more to register; the compiled
hooks do the same work in well under a microsecond, and walk a call's new nodes without making
a Python object per node. They are an optimisation, never a requirement: the first `watch` or
`profile` in a process loads them from the cache, or starts one build in a background thread
(`torch.utils.cpp_extension`: a C++ compiler, ninja and torch's headers) and prints one line;
samples use them from the first step after they are ready. No compiler, a failed build, an
accelerator clock or `MODPROF_NATIVE=0`: the Python node hooks, with the same records.

The cache is `$XDG_CACHE_HOME/wandb_modprof/native/` (default `~/.cache/...`), one folder per
source, torch version, C++ ABI and Python version; `MODPROF_NATIVE_DIR` moves it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

_SOURCE = Path(__file__).with_name("native_stamps.cpp")


class _Build:
    """This process's one load or build."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.module: Any = None
        self.thread: threading.Thread | None = None
        self.failure: str | None = None  # why there is no module


_BUILD = _Build()


def enabled() -> bool:
    """False when the user turned the compiled hooks off (`MODPROF_NATIVE=0`)."""
    return os.environ.get("MODPROF_NATIVE", "1").strip().lower() not in ("0", "false", "off", "no")


def module() -> Any:
    """The loaded extension, or None (not enabled, not built yet, or the build failed)."""
    if _BUILD.module is None or not enabled():
        return None
    return _BUILD.module


def failure() -> str | None:
    """Why the compiled hooks are not available (the build's error), or None."""
    return _BUILD.failure


@functools.cache
def name() -> str:
    """The extension's module name: one per source, torch build and Python."""
    key = "|".join(
        (
            _SOURCE.read_text(encoding="utf-8"),
            torch.__version__,
            str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", "")),
            sys.version,
            platform.machine(),
        )
    )
    return "wandb_modprof_native_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    root = os.environ.get("MODPROF_NATIVE_DIR")
    if root:
        return Path(root) / name()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "wandb_modprof" / "native" / name()


def start(wait: bool = False) -> bool:
    """Make the compiled hooks available: load them from the cache now, or build them in a
    background thread (`wait=True`: until it ends). True once they are loaded."""
    if not enabled():
        return False
    with _BUILD.lock:
        if _BUILD.module is None and _BUILD.failure is None and _BUILD.thread is None:
            built = cache_dir() / (name() + ".so")
            if built.is_file():
                _load_cached(built)
            else:
                sys.stderr.write(
                    "wandb_modprof: compiling the native node hooks in the background, once "
                    f"per torch version (cache: {cache_dir()}; MODPROF_NATIVE=0 turns this off)\n"
                )
                thread = threading.Thread(target=_build, name="wandb_modprof-native", daemon=True)
                _BUILD.thread = thread
                thread.start()
        running = _BUILD.thread
    if wait and running is not None:
        running.join()
    return _BUILD.module is not None


def _load_cached(path: Path) -> None:
    try:
        spec = importlib.util.spec_from_file_location(name(), path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        _BUILD.module = loaded
    except Exception as error:  # a stale or foreign file: the Python hooks
        _BUILD.failure = f"{type(error).__name__}: {error}"


def _find_ninja() -> None:
    """torch looks for `ninja` on PATH only; `pip install ninja` puts it beside this Python,
    which is not on PATH when a virtual environment's interpreter is run without activating it.
    That folder (this interpreter's own scripts) is appended to PATH, nothing else."""
    if shutil.which("ninja") is not None:
        return
    scripts = sysconfig.get_path("scripts")
    if scripts and shutil.which("ninja", path=scripts) is not None:
        os.environ["PATH"] = os.pathsep.join(p for p in (os.environ.get("PATH"), scripts) if p)


_SCRATCH = "build-"  # a process's own build folder, inside the cache folder
_ABANDONED_AFTER_S = 3600.0  # a build folder this old belongs to a process that ended


def _remove_abandoned_builds(folder: Path) -> None:
    now = time.time()
    for old in folder.glob(_SCRATCH + "*"):
        try:
            if now - old.stat().st_mtime > _ABANDONED_AFTER_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # (another process removed it first)


def _build() -> None:
    try:
        from torch.utils import cpp_extension

        _find_ninja()
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_builds(folder)
        # Each process builds in a folder of its own and moves the result into the cache in
        # one rename: torch's shared build folder has a lock file that a process ended during
        # the build (a short script, Ctrl-C) leaves behind, and every later build would wait
        # on it forever.
        scratch = Path(tempfile.mkdtemp(prefix=_SCRATCH, dir=folder))
        try:
            built = cpp_extension.load(
                name=name(),
                sources=[str(_SOURCE)],
                build_directory=str(scratch),
                extra_cflags=["-O2"],
                verbose=False,
            )
            os.replace(scratch / (name() + ".so"), folder / (name() + ".so"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        _BUILD.module = built
    except BaseException as error:  # never into the training run: the Python hooks stay
        reason = " ".join(str(error).split())[:300]
        _BUILD.failure = f"{type(error).__name__}: {reason}"
        sys.stderr.write(
            f"wandb_modprof: the native node hooks were not built ({_BUILD.failure}); "
            "using the Python node hooks\n"
        )
