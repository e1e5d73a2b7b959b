"""Room on Python's stack for the frames our module hooks add to every nested module call.

A module with hooks runs through the slow path of `nn.Module._call_impl`, which calls the
forward from a nested `inner()` closure: one more frame per nesting level than an unhooked
call, plus our hook's own frames at the deepest call. A 200-deep chain of modules trains
unhooked at Python's default recursion limit (1000; up to about 245 levels) but raises
`RecursionError` with any hook on every module (about 198 levels), so while the submodules
carry our hooks the recursion limit is raised by what the hooks add, and put back when they
are taken off. Frames of the user's own code are not counted twice: a model that does not
train unwatched at the limit does not train watched either.

The limit is one per interpreter, so the claims of every `Capture` are kept in one ledger:
the limit is the one found before the first claim plus the sum of the claims. A limit the
user set while a claim was held is left alone (and becomes the new base).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterable

FRAMES_PER_LEVEL = 2  # the `inner()` frame, and one more for a C-level call (measured: 1)
HOOK_FRAMES = 150  # our hooks, the structure pass and the dispatch modes at the deepest call
_MAX_EXTRA = 20_000  # beyond that the C stack, not the limit, is what runs out


def extra_frames(names: Iterable[str]) -> int:
    """The frames hooks on every module add to a forward of modules with these qualified
    names (nested as deep as the most dotted one)."""
    nesting = max((name.count(".") + 1 for name in names if name), default=0)
    return min(FRAMES_PER_LEVEL * nesting + HOOK_FRAMES, _MAX_EXTRA)


class _Ledger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: dict[int, int] = {}
        self.base = 0  # the limit before the first claim
        self.set_to = 0  # the limit we set last (0: none)


_LEDGER = _Ledger()  # one per interpreter, like the limit it mirrors


def claim(owner: object, extra: int) -> None:
    """Raise the recursion limit by `extra` frames for `owner` (a second claim replaces the
    first)."""
    with _LEDGER.lock:
        current = sys.getrecursionlimit()
        if not _LEDGER.claims or current != _LEDGER.set_to:
            _LEDGER.base = current if not _LEDGER.claims else current - sum(_LEDGER.claims.values())
        _LEDGER.claims[id(owner)] = extra
        _apply()


def release(owner: object) -> None:
    """Take `owner`'s claim back; the limit returns to the base plus the other claims."""
    with _LEDGER.lock:
        if _LEDGER.claims.pop(id(owner), None) is None:
            return
        if sys.getrecursionlimit() != _LEDGER.set_to:
            # The user set a limit meanwhile: theirs stands.
            _LEDGER.base = sys.getrecursionlimit() - sum(_LEDGER.claims.values())
            _LEDGER.set_to = sys.getrecursionlimit()
            return
        _apply()


def _apply() -> None:
    target = max(_LEDGER.base + sum(_LEDGER.claims.values()), 1)
    # Lowering it below the current depth is refused: the higher limit stays for now, and the
    # next claim or release tries again.
    with contextlib.suppress(RecursionError):
        sys.setrecursionlimit(target)
    _LEDGER.set_to = sys.getrecursionlimit()
