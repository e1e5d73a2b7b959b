"""The user's random generators, as our own work found them.

A watched run must draw the same dropout masks and data as the unwatched run, so nothing of
ours may draw from a global generator in the training process: torch's CPU generator, each
initialised CUDA device's, numpy's global state, Python's `random`. Measurement code that needs
data uses constants or a private `torch.Generator` (building an `nn.Module` draws too: its
initialisers use the global generator; `torch.nn.utils.skip_init` does not).

`kept(where)` is the guard around our own work that runs in the training process (table builds,
calibrations, plans): where the work moved a generator after all (a torch function that draws
internally, a future change), the states are put back before the user's next line and the
process's first such event warns once, naming `where`. `moved()` lists the events, for the
test suite, which fails on any. Never around the user's model: a structure pass or a sampled
step runs the user's own forward, whose draws are the user's.

>>> import torch
>>> before = torch.random.get_rng_state()
>>> with kept("a doctest"):
...     _ = torch.randn(3)           # a draw the guard undoes (and reports)
>>> torch.equal(before, torch.random.get_rng_state())
True
>>> moved()[-1]
'a doctest'
>>> forget_moved()
"""

from __future__ import annotations

import contextlib
import functools
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from wandb_modprof._warn import warn_safely

_F = TypeVar("_F", bound=Callable[..., Any])

_MOVED: list[str] = []  # every `where` whose work moved a generator, in order


class _States:
    """One reading of every global generator (CUDA only on devices already initialised:
    reading another would initialise CUDA; numpy only where the user imported it)."""

    __slots__ = ("cpu", "cuda", "numpy", "python")

    def __init__(self) -> None:
        self.cpu = torch.random.get_rng_state()
        self.cuda: list[torch.Tensor] = (
            [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
            else []
        )
        numpy = sys.modules.get("numpy")
        self.numpy: Any = numpy.random.get_state() if numpy is not None else None
        self.python = random.getstate()

    def differs(self, other: _States) -> bool:
        if not torch.equal(self.cpu, other.cpu) or len(self.cuda) != len(other.cuda):
            return True
        if any(not torch.equal(a, b) for a, b in zip(self.cuda, other.cuda, strict=True)):
            return True
        if self.python != other.python:
            return True
        return not _same_numpy(self.numpy, other.numpy)

    def restore(self) -> None:
        torch.random.set_rng_state(self.cpu)
        for i, state in enumerate(self.cuda):
            torch.cuda.set_rng_state(state, i)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy is not None:
            numpy.random.set_state(self.numpy)
        random.setstate(self.python)


def _same_numpy(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    # ('MT19937', keys array, pos, has_gauss, cached_gaussian)
    return bool(a[0] == b[0] and (a[1] == b[1]).all() and tuple(a[2:]) == tuple(b[2:]))


@contextlib.contextmanager
def kept(where: str) -> Iterator[None]:
    """Run our own work with every global generator as it found them (see the module)."""
    before = _States()
    try:
        yield
    finally:
        if before.differs(_States()):
            before.restore()
            _MOVED.append(where)
            if len(_MOVED) == 1:
                warn_safely(
                    f"wandb_modprof: internal: {where} drew from a global random generator; "
                    "the generators were put back as they were (training draws the same numbers "
                    "as without the profiler). Please report this.",
                    RuntimeWarning,
                )


def keeping(where: str) -> Callable[[_F], _F]:
    """`kept(where)` around every call of the decorated function."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with kept(where):
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


def moved() -> tuple[str, ...]:
    """Where our own work moved a global generator in this process (put back each time)."""
    return tuple(_MOVED)


def forget_moved() -> None:
    _MOVED.clear()
