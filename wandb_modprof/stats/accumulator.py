"""The live side of a profile: finished step sessions, as plain records, wait here until they
are resolved into samples, which fold into running statistics; structure passes and per-rank
data are kept beside them. `snapshot()` freezes all of it into one `ProfileData` for the readers.

The capture pushes into it (it satisfies `capture.sink.SampleSink` without importing it);
`api.profile.Profile` reads it. Resolution is lazy (when results are read) to keep it off the
sampled step; a long backlog is resolved at `add` so memory stays bounded in loops that never
read results.
"""

from __future__ import annotations

import pickle
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from wandb_modprof.capture.resolve import resolve
from wandb_modprof.records.snapshot import Overhead, ProfileData
from wandb_modprof.stats.phase_stats import PhaseFold
from wandb_modprof.stats.quiet_gc import paused_gc
from wandb_modprof.stats.running import StatsAccumulator

if TYPE_CHECKING:
    from wandb_modprof.capture.memory.gradient_readings import PendingGradientState
    from wandb_modprof.capture.memory.static_memory import StaticReadings
    from wandb_modprof.capture.session_record import SessionRecord
    from wandb_modprof.records.calls import Structure
    from wandb_modprof.records.phases import PhaseStats, StepPhases
    from wandb_modprof.records.ranks import RankData
from wandb_modprof.records.sample import ModuleStats, Sample

MAX_UNRESOLVED = 8
# a finished session's record with its readings (`capture.sink.SampleSink.add`)
Pending = tuple["SessionRecord", "PendingGradientState | None", "StaticReadings"]


class Remote(Protocol):
    """Resolves an accumulator's pending records elsewhere (`watch`'s worker process,
    `api.sample_handoff`): takes them with `take_pending` and, when forced, installs the
    profile resolved there with `load`."""

    def resolve(self, acc: ProfileAccumulator, force: bool) -> None: ...


class ProfileAccumulator:
    """Sessions to resolve, running statistics, structures and rank data of one profile."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._acc = StatsAccumulator()
        # The model's first step in the process (`Sample.cold_start`), folded on its own: the
        # statistics while it is the only sample; once a later sample exists it is left out
        # (counted) and only gives the calls no later sample made (none is lost).
        self._cold: StatsAccumulator | None = None
        self._cold_left_out = 0
        self._last: Sample | None = None
        self._num_samples = 0
        # the step's phases per sample (a first step's only while it is alone, as above)
        self._phases = PhaseFold()
        self._cold_phases: StepPhases | None = None
        self._loaded_phases: PhaseStats | None = None  # a profile read from a file
        self._pending: deque[Pending] = deque()
        self._lock = threading.Lock()
        self._structures: dict[str, Structure] = {}  # by call-sequence signature, in order
        self._loaded_stats: dict[str, ModuleStats] | None = None  # a profile read from a file
        # ((samples, left out), stats): frozen once per folded sample
        self._stats_cache: tuple[tuple[int, int], dict[str, ModuleStats]] | None = None
        # Every rank's compact statistics, folded by rank 0 of a distributed `watch` when it
        # logs (`api.distributed.RankChannel.collect`); None: no distributed data.
        self._ranks: RankData | None = None
        self.remote: Remote | None = None  # set: records are resolved by it, not here
        # A profile resolved by a `Remote`, pickled, read at the first read of its contents
        # (`load_pickled`): `unwatch()` need not wait for a large profile's decoding.
        self._deferred: bytes | None = None
        self.overhead: Overhead | None = None  # `watch`: what sampling cost, set before reads

    @classmethod
    def restored(cls, data: ProfileData) -> ProfileAccumulator:
        """A read-only accumulator holding a saved profile (`wandb_modprof.load`)."""
        acc = cls(data.model_name)
        acc._num_samples = data.num_samples
        acc._cold_left_out = data.cold_left_out
        acc._loaded_stats = dict(data.stats)
        acc._last = data.last
        acc._structures = {s.signature: s for s in data.structures}
        acc._ranks = data.ranks
        acc._loaded_phases = data.phases
        return acc

    # ---- filled by the capture -------------------------------------------------------------
    def add(
        self,
        record: SessionRecord,
        gradients: PendingGradientState | None,
        static: StaticReadings,
    ) -> None:
        with self._lock:
            self._pending.append((record, gradients, static))
            backlog = len(self._pending) > MAX_UNRESOLVED
        if backlog:
            self.resolve_pending(force=False)

    def add_structure(self, structure: Structure) -> None:
        self._undefer()
        self._structures[structure.signature] = structure

    def has_structure(self, signature: str) -> bool:
        self._undefer()
        return signature in self._structures

    def num_structures(self) -> int:
        self._undefer()
        return len(self._structures)

    # ---- resolution ------------------------------------------------------------------------
    def resolve_pending(self, force: bool) -> None:
        """Resolve finished samples; unless forced, only those whose device events completed."""
        if self.remote is not None:
            self.remote.resolve(self, force)
            return
        with self._lock, paused_gc():
            while self._pending:
                record, gradients, static = self._pending[0]
                if not force and not record.ready():
                    break
                if force:
                    record.wait()
                self._pending.popleft()
                names = {inv.name for inv in record.invocations}
                sample = resolve(
                    record,
                    static.resolve(names),
                    gradients.resolve() if gradients is not None else None,
                )
                self._take(sample)

    def _take(self, sample: Sample) -> None:
        """Fold `sample` into the statistics; a first-step sample only while it is alone."""
        self._undefer()
        if sample.cold_start and self._num_samples == 0:
            self._cold = StatsAccumulator()
            self._cold.fold(sample.invocations)
        else:
            if self._cold is not None and not self._cold_left_out:
                self._cold_left_out = 1  # a later sample: the start-up one is left out
            self._acc.fold(sample.invocations)
        if sample.cold_start and self._num_samples == 0:
            self._cold_phases = sample.totals.phases
        else:
            self._phases.fold(sample.totals.phases)
        self._num_samples += 1
        self._last = sample

    def first_pending(self) -> SessionRecord | None:
        """The oldest finished session's record not resolved yet."""
        with self._lock:
            return self._pending[0][0] if self._pending else None

    def take_pending(self, force: bool = True) -> list[Pending]:
        """The finished sessions' records not resolved yet, removed from here (for a
        `Remote`); unless forced, only those ready (in order: up to the first that is not)."""
        with self._lock:
            taken = []
            while self._pending and (force or self._pending[0][0].ready()):
                taken.append(self._pending.popleft())
        return taken

    def load(self, data: ProfileData) -> None:
        """Hold `data`, the profile resolved by a `Remote`, as this accumulator's results."""
        self._deferred = None
        self._num_samples = data.num_samples
        self._cold_left_out = data.cold_left_out
        self._loaded_stats = dict(data.stats)
        self._loaded_phases = data.phases
        self._last = data.last
        self._stats_cache = None
        for structure in data.structures:
            self._structures.setdefault(structure.signature, structure)

    def load_pickled(self, num_samples: int, raw: bytes) -> None:
        """`load` the pickled `ProfileData` `raw` (of `num_samples` samples) when its contents
        are first read: the sample count is known at once. A 10,000-call profile takes
        0.3-0.5 s to unpickle, which `unwatch()` no longer waits for."""
        self._num_samples = num_samples
        self._stats_cache = None
        self._deferred = raw

    def _undefer(self) -> None:
        raw = self._deferred
        if raw is not None:
            with paused_gc():
                data = pickle.loads(raw)  # our own worker's bytes (`api.sample_worker`)
            self.load(data)

    def saved_state(self) -> tuple[Any, ...]:
        """The running statistics as picklable state (`restore_state` continues from it)."""
        self._undefer()
        structures = tuple(self._structures.values())
        return (
            self._acc,
            self._cold,
            self._cold_left_out,
            self._last,
            self._num_samples,
            structures,
            (self._phases, self._cold_phases),
        )

    def restore_state(self, state: tuple[Any, ...]) -> None:
        self._acc, self._cold, self._cold_left_out, self._last, self._num_samples, structures = (
            state[:6]
        )
        self._phases, self._cold_phases = state[6]
        self._deferred = None
        self._loaded_stats, self._stats_cache = None, None
        self._structures = {s.signature: s for s in structures}

    @property
    def pending_count(self) -> int:
        """Finished sessions not resolved yet (their device events may still be running)."""
        return len(self._pending)

    # ---- reading (nothing here resolves: callers choose when to wait) ------------------------
    @property
    def num_samples(self) -> int:
        return self._num_samples

    @property
    def last(self) -> Sample | None:
        self._undefer()
        return self._last

    @property
    def ranks(self) -> RankData | None:
        self._undefer()
        return self._ranks

    def set_ranks(self, ranks: RankData) -> None:
        self._undefer()
        self._ranks = ranks

    def stats(self) -> dict[str, ModuleStats]:
        """Running statistics per call key, in forward order of their last sample.

        Frozen once per folded sample: reading a profile (`prof.stats()`, then `table()`,
        then the W&B log) asked for it several times, and freezing a 10,000-call profile
        builds ~160,000 statistics (0.6-1 s each time here)."""
        self._undefer()
        cached = self._stats_cache
        version = (self._num_samples, self._cold_left_out)
        if cached is None or cached[0] != version:
            with paused_gc():
                snap = self._running() if self._loaded_stats is None else self._loaded_stats
                ordered = dict(sorted(snap.items(), key=lambda kv: kv[1].order))
            cached = self._stats_cache = (version, ordered)
        return dict(cached[1])  # the caller's own dict (the statistics are frozen)

    def _running(self) -> dict[str, ModuleStats]:
        """The running statistics; with a left-out first step, its calls that no later
        sample made (a route taken once) from it."""
        if self._cold is None:
            return self._acc.snapshot()
        if not self._cold_left_out:
            return self._cold.snapshot()
        snap = self._acc.snapshot()
        snap.update(self._cold.snapshot(exclude=snap.keys()))
        return snap

    def phases(self) -> PhaseStats | None:
        """The step's phases over the samples (`records.phases`); None: none recorded."""
        self._undefer()
        if self._loaded_phases is not None:
            return self._loaded_phases
        folded = self._phases.snapshot()
        if folded is None and self._cold_phases is not None:
            alone = PhaseFold()
            alone.fold(self._cold_phases)
            return alone.snapshot()
        return folded

    def structures(self) -> tuple[Structure, ...]:
        self._undefer()
        return tuple(self._structures.values())

    def means(
        self, metrics: tuple[str, ...]
    ) -> tuple[dict[str, tuple[float | None, ...]], dict[str, int]]:
        """Per call key the running means of `metrics` (None: not measured) and the sample
        count: what a rank publishes to rank 0 (`api.distributed`), without a full snapshot."""
        self._undefer()
        if self._loaded_stats is None:
            acc = self._cold if self._cold is not None and not self._cold_left_out else self._acc
            return acc.means(metrics)
        means: dict[str, tuple[float | None, ...]] = {}
        counts: dict[str, int] = {}
        for key, stats in self._loaded_stats.items():
            means[key] = tuple(stats.mean(m) for m in metrics)
            stat = stats.metrics.get("fwd_ms")
            counts[key] = stat.count if stat is not None else 0
        return means, counts

    def snapshot(self) -> ProfileData:
        """Everything resolved so far, frozen (pending sessions are not waited for)."""
        self._undefer()
        return ProfileData(
            model_name=self.model_name,
            num_samples=self._num_samples,
            stats=self.stats(),
            last=self._last,
            structures=self.structures(),
            ranks=self._ranks,
            overhead=self.overhead,
            cold_left_out=self._cold_left_out,
            phases=self.phases(),
        )
