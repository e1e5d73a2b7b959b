"""One frozen reading of a profile: what every sink (table, report, file, W&B log) takes.

`ProfileData` is built by the statistics stage (`stats.accumulator.ProfileAccumulator.snapshot`)
or read back from a profile file; sinks never see the live `Profile` or its accumulator.
Anything with a `snapshot()` method (a `Profile`) can be passed where a sink accepts a
`SupportsSnapshot`, so users can keep handing profiles to `write_report` and friends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.calls import Structure
from wandb_modprof.records.phases import PhaseStats
from wandb_modprof.records.ranks import RankData
from wandb_modprof.records.sample import ModuleStats, Sample


@dataclass(frozen=True)
class Overhead:
    """What sampling cost a watched run's training thread, measured (`api.overhead`): the
    training time so far, the part of it that was ours (sampled steps and structure passes
    beyond a typical step, and our work at later steps), over how many steps and samples."""

    wall_s: float
    cost_s: float
    steps: int
    samples: int
    # the structure passes so far: how many, how many of them followed only part of the
    # model (the rest known from earlier passes, or left to the next), their forwards' seconds
    passes: int = 0
    partial_passes: int = 0
    pass_s: float = 0.0
    # samples taken but not in the profile: handed to a worker process that ended before it
    # saved them (`lost`), or that a worker could not add (`dropped`, an error said once)
    lost: int = 0
    dropped: int = 0
    # in `cost_s`: the floor of `watch` per step (its root hooks and the interpreter's cost to
    # reach them, paid by every step, sampled or not) and the worker process's CPU seconds
    # that competed with training for its cores
    floor_s: float = 0.0
    worker_s: float = 0.0
    # what the share is made of: the typical plain step, the cost per sample (its step's
    # extra, the work it left to the next step, its hand-off and log) and the one-time cost
    # (the structure passes' extra: the graph, FLOPs, the roofline's calibration)
    step_s: float = 0.0
    sample_s: float = 0.0
    once_s: float = 0.0

    def at_log_freq(self, log_freq: int) -> float:
        """The share one sample every `log_freq` steps costs in a long run (the floor and the
        samples; the one-time cost amortised away): the figure to choose `log_freq` by."""
        if self.step_s <= 0:
            return 0.0
        return (self.floor_s + self.sample_s / log_freq) / self.step_s

    @property
    def share(self) -> float:
        """`cost_s` over `wall_s` (0 before two steps were timed)."""
        return self.cost_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class ProfileData:
    """The profile at one moment: statistics per call key (in forward order), the last sample,
    the structure passes (oldest first) and, on rank 0 of a distributed run, every rank's data."""

    model_name: str
    num_samples: int
    stats: Mapping[str, ModuleStats]
    last: Sample | None
    structures: tuple[Structure, ...]
    ranks: RankData | None = None
    # `watch` only: what sampling cost the run (not part of the profile file: a fact of the run)
    overhead: Overhead | None = None
    # Samples left out of `stats` (0 or 1; `num_samples` counts them): the model's first step
    # (`Sample.cold_start`), left out once a later sample exists, so one-time start-up does
    # not colour the profile.
    cold_left_out: int = 0
    # The sampled steps' phases around the modules (None: no sample recorded them).
    phases: PhaseStats | None = None

    @property
    def statistic(self) -> str:
        """What the values are coloured and ranked by: "median", or "mean" where a statistic
        has no median (a profile read from a version-1 file, which kept no sample values)."""
        known = all(m.medians_known() for m in self.stats.values())
        return "median" if known else "mean"


@runtime_checkable
class SupportsSnapshot(Protocol):
    def snapshot(self) -> ProfileData: ...


def as_data(value: object, where: str) -> ProfileData:
    """`value` as a `ProfileData` (a profile is read once, here), or a clear error."""
    if isinstance(value, ProfileData):
        return value
    if isinstance(value, SupportsSnapshot):
        return value.snapshot()
    raise ModProfError(
        f"{where} expects a wandb_modprof.Profile (or its snapshot()); got {type(value).__name__}"
    )
