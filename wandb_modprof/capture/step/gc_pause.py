"""Python's cyclic garbage collector held off while a sampled step's forward or backward runs.

A sampled step allocates many small tracked objects of ours (records, node-hook closures, and
torch's own hook dicts and handles: about eight per autograd node), so the collector, which
runs every 700 net allocations and walks every older object at its full runs, ran ~465 times
inside one sampled step of an 8-layer, 128-expert MoE (1-2 of them full, over ~660,000 objects
of the process): 1.2 s of a 3.5 s step, landing inside whichever call crossed the threshold
(a module read 119 ms where its peers read 5.5 ms; `gc_watch.py`). Held off, no collection
runs inside a timed call; when the window closes, the objects made meanwhile move to the
oldest generation (`promote_young`), so the collector does not start with one collection of
all of them either (that collection was the last one left in a sampled step: 0.19 s of a
10,000-call one). They are walked at the next full collection, as every object is.

Held only inside the timed windows and our own work around them: from the sampled step's start
(before the model walk and the hooks' attachment, each of which makes many objects) through the
root forward to the end of closing it, and from the first backward node of the sampled graph to
the end of that backward and of the gradients' read-out after it (or the sample's drop).
Never between them, so a forward whose backward never comes cannot leave the collector off;
and any hold still standing when a watched model's next step starts is released then (a
backward that raised never reaches its end callback). A collector the user turned off stays
off: we switch it back on only if we switched it off. `gc.collect()` still runs while held
(`gc_watch` charges it to the open calls).

>>> was_on = gc.isenabled()
>>> hold(1)
>>> gc.isenabled()
False
>>> release(1)
>>> gc.isenabled() == was_on
True
"""

from __future__ import annotations

import gc

from wandb_modprof.capture.step import interrupt_guard


class _State:
    __slots__ = ("holds", "paused_by_us")

    def __init__(self) -> None:
        self.holds: set[int] = set()  # the sessions (by id) inside a timed window now
        self.paused_by_us = False


_STATE = _State()


def hold(token: int) -> None:
    """`token` (a session's id) enters a timed window: the collector off if it is on."""
    if not _STATE.holds:
        interrupt_guard.arm()  # a Ctrl-C now ends the window before it unwinds
        if gc.isenabled():
            gc.disable()
            _STATE.paused_by_us = True
    _STATE.holds.add(token)


def release(token: int) -> None:
    """`token` left its window; the last one out switches the collector back on (if ours)."""
    _STATE.holds.discard(token)
    if not _STATE.holds:
        _resume()


def release_all() -> None:
    """Every hold dropped (a step starts: any window still open was left without its end)."""
    _STATE.holds.clear()
    _resume()


def holding() -> bool:
    return bool(_STATE.holds)


def _resume() -> None:
    interrupt_guard.disarm()
    if _STATE.paused_by_us:
        _STATE.paused_by_us = False
        promote_young()
        gc.enable()


def promote_young() -> None:
    """The objects made while the collector was held, moved to the oldest generation, the
    young generation's count set to 0: re-enabled, the collector does not start with a
    collection of them, which would land in the sampled step (it walked ~500,000 objects of a
    10,000-call step: 0.19 s of it; 0.7 s for a 28,000-call step). What is left of them is
    walked at the next full collection, which walks every object anyway; most are freed by
    their reference count before it (the session's records once resolved). `freeze` then
    `unfreeze` is how CPython exposes that move (two list splices, O(1)); skipped when the
    user froze objects themselves (`unfreeze` would thaw theirs too)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
