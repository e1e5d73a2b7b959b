"""Python's cyclic garbage collector paused while wandb_modprof builds many short-lived objects
at once (resolving a sample, freezing the statistics, the table and its W&B log).

Those steps allocate hundreds of thousands of objects that form no reference cycles (records,
statistics, rows), and every 700 net allocations the collector runs; each full collection also
walks every object of the user's process, the model's modules and tensors included (~80 ms for
a GPT-2 process, see README, Layout). On a 28,500-call mixture of experts that was a large part
of resolving a sample. The collector is switched back on (if it was on) when the block ends,
with the objects made meanwhile moved to the oldest generation (`gc_pause.promote_young`):
it does not start with a collection of all of them (0.25 s after a 10,000-call table, mostly
of rows that live on), and any cycles among them are collected at its next full run: nothing
is leaked.

>>> with paused_gc():
...     rows = [(i, str(i)) for i in range(1000)]
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from wandb_modprof.capture.step.gc_pause import promote_young


@contextmanager
def paused_gc() -> Iterator[None]:
    """The collector off inside the block; on again after it only if it was on before (a
    user who turned it off keeps it off)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            promote_young()
            gc.enable()
