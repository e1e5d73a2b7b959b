"""When a watched model's table goes to W&B: the first sample's at once, later ones at growing
intervals, the last one at `unwatch()` (and `run.finish()`, which unwatches first).

Every logged table is a full file in the run (about 2.5 KB per module call), while each holds
running statistics that differ little from the one before; the per-sample trend goes to W&B as
scalars at every sample instead (`wandb_entry`). So a table is logged at the 1st, 2nd, 4th,
8th, ... sample (the gap doubles), and also whenever `table_interval` seconds have passed since
the last one, so the panel never lags the run by more than that.

The bound, for a run of `n` samples over `t` seconds: at most `2 + log2(n) + t /
table_interval` tables (the doubling, the interval, the final one). With the default of one
hour: a few hundred samples in a fast loop log about 10 tables; a week-long run of 10,000
samples at most 2 + 13 + 168 = 183. `table_interval=None` drops the interval: at most
`2 + log2(n)` tables whatever the run's length (15 for 10,000 samples).

>>> s = TableSchedule(None)
>>> [n for n in range(1, 40) if s.take(n, now=0.0)]
[1, 2, 4, 8, 16, 32]
"""

from __future__ import annotations

import math
import time

DEFAULT_INTERVAL_S = 3600.0


class TableSchedule:
    """Whether the table of `count` samples is due (`take`); counts what was logged."""

    __slots__ = ("_gap", "_last_count", "_last_s", "interval_s", "tables")

    def __init__(self, interval_s: float | None = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._gap = 1  # samples from the last table to the next one: doubles at each table
        self._last_count = 0
        self._last_s = -math.inf
        self.tables = 0  # tables logged so far

    def due(self, count: int, now: float | None = None) -> bool:
        """Whether a log of `count` samples (more than the last table's) carries the table."""
        if count <= self._last_count:
            return False
        if self.tables == 0 or count - self._last_count >= self._gap:
            return True
        now = time.monotonic() if now is None else now
        return self.interval_s is not None and now - self._last_s >= self.interval_s

    def logged(self, count: int, now: float | None = None) -> None:
        """The table of `count` samples was logged (scheduled or final)."""
        if self.tables:
            self._gap = max(self._gap * 2, 1)
        self.tables += 1
        self._last_count = count
        self._last_s = time.monotonic() if now is None else now

    def behind(self, count: int) -> bool:
        """Samples came since the last table (the final log carries one then)."""
        return count > self._last_count

    def take(self, count: int, now: float | None = None) -> bool:
        """`due`, and when it is, `logged`."""
        if not self.due(count, now):
            return False
        self.logged(count, now)
        return True

    @staticmethod
    def bound(samples: int, seconds: float, interval_s: float | None) -> int:
        """The most tables a run of `samples` samples over `seconds` logs (the module's bound)."""
        doubling = 1 + (math.floor(math.log2(samples)) if samples > 0 else 0)
        timed = 0 if interval_s is None else math.floor(seconds / interval_s)
        return 1 + doubling + timed
