"""Ctrl-C inside a sampled window: the process put back before the `KeyboardInterrupt` unwinds.

`Module._call_impl` runs always-call forward hooks on `Exception` only, and the autograd engine
runs no callback of ours after a node raised. So a `KeyboardInterrupt` inside a sampled forward,
backward or structure pass would skip every end of ours: the collector stays off
(`gc_pause`), the saved-tensor hooks and the pass's modes stay pushed, until our code runs
again. While any such window is open in the main thread (the first `gc_pause.hold` to the last
release), SIGINT's handler is ours, if it was Python's default one: it first ends every open
window (`recover`, which `capture.root_hooks` registers) and then raises the
`KeyboardInterrupt` the default handler would. A handler of the user's (or an ignored SIGINT)
is left alone; then, as for a `KeyboardInterrupt` raised by code rather than by a signal, the
windows are ended at our next entry (any watched model's next forward, `profile()`, `watch()`,
`unwatch()`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from types import FrameType

_RECOVER: list[Callable[[], None]] = []  # what ends every open window (`register`)


class _Armed:
    __slots__ = ("body", "on", "pending")

    def __init__(self) -> None:
        self.on = False
        # Inside one of our autograd node hooks (depth): a SIGINT then waits for its end
        # (`pending`), so that the windows are ended with no body of ours half run.
        self.body = 0
        self.pending: tuple[int, FrameType | None] | None = None


# whether our handler is on, and the node hooks' body depth and pending interrupt (read and
# written by `backward.node_stamps` on every node hook)
BODY = _Armed()


def register(recover: Callable[[], None]) -> None:
    """`recover()` ends every open window of ours in this thread (called once, at import)."""
    if recover not in _RECOVER:
        _RECOVER.append(recover)


def arm() -> None:
    """A window opens: SIGINT ours while it is Python's default handler (main thread only:
    `signal.signal` works nowhere else)."""
    if BODY.on or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
            BODY.on = True
    except (ValueError, OSError):  # (an interpreter without signals, a restricted host)
        return


def disarm() -> None:
    """The last window closed: Python's default handler back, unless someone replaced ours."""
    if not BODY.on or threading.current_thread() is not threading.main_thread():
        return
    BODY.on = False
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def body_done() -> None:
    """Called where `BODY.body` dropped to 0 with a SIGINT pending: deliver it now."""
    pending, BODY.pending = BODY.pending, None
    if pending is not None:
        _interrupt(*pending)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if BODY.body:
        BODY.pending = (signum, frame)  # delivered as our hook body ends (`body_done`)
        return
    _interrupt(signum, frame)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    disarm()
    for recover in _RECOVER:
        # Nothing may stop the interrupt the user asked for (a window left open is ended at
        # our next entry instead).
        with contextlib.suppress(Exception):
            recover()
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt
