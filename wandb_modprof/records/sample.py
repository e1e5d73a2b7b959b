"""Plain, frozen records that cross stage boundaries: one per module invocation, per sample.

Units are in the field names. `None` means "not measured in this sample" (for example no
backward ran through the step, or the value needs an accelerator); `0` means "measured, none".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from wandb_modprof.records.phases import StepPhases

TIME_METRICS: tuple[str, ...] = (
    "fwd_ms",
    "fwd_self_ms",
    "bwd_ms",
    "bwd_self_ms",
    "bwd_span_ms",
    "recompute_ms",
)
MEMORY_METRICS: tuple[str, ...] = (
    "act_bytes",
    "act_self_bytes",
    "param_bytes",
    "param_count",
    "buffer_bytes",
    "grad_bytes",
    "optim_bytes",
)
DEVICE_MEMORY_METRICS: tuple[str, ...] = (
    "fwd_mem_delta_bytes",
    "fwd_mem_peak_bytes",
    "bwd_mem_peak_bytes",
)
HEALTH_METRICS: tuple[str, ...] = ("param_norm", "grad_norm")
# Python garbage collections that ran inside the call (see `InvocationRecord.gc_ms`).
PAUSE_METRICS: tuple[str, ...] = ("gc_ms",)
# What a call processed (see `InvocationRecord.rows`). Last, so that the columns of the metrics
# before it (statistics arrays, `records.stat_columns`) keep their indices.
LOAD_METRICS: tuple[str, ...] = ("rows",)
METRICS: tuple[str, ...] = (
    TIME_METRICS
    + MEMORY_METRICS
    + DEVICE_MEMORY_METRICS
    + HEALTH_METRICS
    + PAUSE_METRICS
    + LOAD_METRICS
)


@dataclass(frozen=True)
class InvocationRecord:
    """One call of one module during one sampled step.

    `key` is `"<qualified name>#<call index>"` (`"layer1.0.relu#1"` is the second call of that
    ReLU in the step); the root module's qualified name is `"<root>"`.
    Times are milliseconds; `*_start_ms` / `*_end_ms` are offsets from the start of the root
    module's forward in the same sample (used by traces). Bytes are storage bytes.

    `rows` is the rows (tokens) the call processed: its first tensor argument's element count
    over its last dimension, the product of the leading dimensions (`[B, T, D]` -> `B * T`; 1
    for a 0-d or 1-d tensor; positional arguments first, then keyword ones). None: the call had
    no tensor argument, or the record was read from a file written before rows were kept.
    """

    key: str
    module_name: str
    module_type: str
    call_index: int
    parent_key: str | None
    depth: int
    order: int
    # runtime
    fwd_ms: float
    fwd_self_ms: float
    bwd_ms: float | None
    bwd_self_ms: float | None
    bwd_span_ms: float | None
    recompute_ms: float | None
    fwd_start_ms: float
    bwd_start_ms: float | None
    bwd_end_ms: float | None
    backward_nodes: int
    # autograd sequence numbers of the nodes this call created: [seq_start, seq_end). The
    # profiler tags backward events with them, which is how traces are merged and checked.
    seq_start: int
    seq_end: int
    # memory
    act_bytes: int | None
    act_self_bytes: int | None
    param_bytes: int
    param_count: int
    buffer_bytes: int
    grad_bytes: int | None
    optim_bytes: int | None
    fwd_mem_delta_bytes: int | None
    fwd_mem_peak_bytes: int | None
    bwd_mem_peak_bytes: int | None
    # model health
    param_norm: float | None
    grad_norm: float | None
    # Host milliseconds of Python garbage collections that ran while this call was open in the
    # forward or one of its backward nodes ran (a collection inside a child counts for every
    # open ancestor too, as its time does). They are in `fwd_ms` / `bwd_ms`: this says which
    # samples a pause inflated. None: not watched (a record read from a version-1 file).
    gc_ms: float | None = None
    # The forward's wall-clock window, our own hook time inside it included (`fwd_ms` is
    # without it: capture/step/clock.py `CpuClock`). Traces draw this, so spans nest and line up
    # with a profiler's events. None: not kept (a version-1 file, whose `fwd_ms` is this).
    fwd_wall_ms: float | None = None
    # Rows (tokens) of the call's first tensor argument (see the docstring): the per-call load
    # that times and work scale with when batch or sequence sizes vary between samples.
    rows: int | None = None

    def to_dict(self) -> dict[str, str | int | float | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class StepTotals:
    """Whole-step figures of one sample, to check the per-module numbers against."""

    fwd_ms: float
    bwd_ms: float | None  # first backward node start to the end of the backward pass
    act_bytes: int | None
    # The step's phases around its modules (`records.phases`; None: not recorded)
    phases: StepPhases | None = None


@dataclass(frozen=True)
class BackwardRun:
    """One timed piece of a sampled backward, for traces: an autograd node's execution
    (`kind="node"`: `name` is its class, e.g. "AddmmBackward0", `seq` its sequence number,
    -1 for AccumulateGrad), or a checkpoint recompute (`kind="recompute"`: `name` is the key of
    the call it repeats, `seq` -1). `owner_key` is the invocation charged with it; times are
    offsets from the root forward's start, like `InvocationRecord.fwd_start_ms`."""

    kind: str
    name: str
    seq: int
    owner_key: str
    start_ms: float
    end_ms: float
    thread_id: int


CURVE_SOURCES = ("device", "saved")


@dataclass(frozen=True)
class MemoryCurve:
    """Live memory over one sampled step: `live_bytes[i]` from `t_ms[i]` on (offsets from the
    root forward's start, like `InvocationRecord.fwd_start_ms`; non-decreasing), a step
    function.

    `source` says what is counted. `"device"`: the accelerator allocator's allocated bytes,
    read at every module boundary and every backward node boundary (host-side counters, no
    sync; `capture/memory/device_memory.py`). `"saved"` (CPU, where no allocator counter exists):
    parameters and buffers, plus gradients as their AccumulateGrad nodes create them, plus the
    bytes of tensors saved for backward, added as they are saved and released as the node that
    needs them runs or their graph is freed (`capture/memory/activations.py`). Temporaries that are
    not saved for backward are not in a "saved" curve.
    """

    source: str
    t_ms: tuple[float, ...]
    live_bytes: tuple[int, ...]


@dataclass(frozen=True)
class Sample:
    """Everything measured in one sampled step.

    `forward_thread_id` / `BackwardRun.thread_id` are native thread ids (what profilers and
    Perfetto show). `host_origin_ns` is the host monotonic clock (`time.perf_counter_ns`) at the
    root forward's start when times are host times; None with device timing.
    """

    step: int
    invocations: tuple[InvocationRecord, ...]
    totals: StepTotals
    forward_thread_id: int = 0
    runs: tuple[BackwardRun, ...] = ()
    host_origin_ns: int | None = None
    # The step's memory curve (None: not measured: activations off, or a file before version 3).
    memory: MemoryCurve | None = None
    # True: the model's first step in this process as far as wandb_modprof can tell
    # (`capture.step.registry.cold_model`): its times include one-time start-up (allocator
    # growth, kernel selection, lazy initialisation).
    # None: not recorded (a file before version 5).
    cold_start: bool | None = False


@dataclass(frozen=True)
class RunningStat:
    """Running statistics of one metric of one module call key across samples.

    `median` is exact over the first `stats.running.MEDIAN_WINDOW` samples, then the median of
    the latest that many (mean, std, min and max cover every sample). None: not known, in a
    profile read from a version-1 file, which kept no sample values; `typical` is then the mean.
    """

    count: int
    mean: float
    std: float
    min: float
    max: float
    last: float
    median: float | None = None

    @property
    def typical(self) -> float:
        """What the profile colours and ranks by: the median, robust to one sample that a
        pause (a garbage collection, a host hiccup) inflated; the mean where no median is
        known (version-1 files)."""
        return self.mean if self.median is None else self.median


_REPR_METRICS = ("fwd_ms", "bwd_ms", "act_bytes")  # what `ModuleStats`' one-line repr shows


@dataclass(frozen=True)
class ModuleStats:
    """Aggregated statistics of one call key (`metrics` maps metric name to stats)."""

    key: str
    module_name: str
    module_type: str
    call_index: int
    parent_key: str | None
    depth: int
    order: int
    # metric name -> statistics: a dict, or a row of the running statistics' arrays
    # (`records.stat_columns.ColumnMetrics`, built on first read)
    metrics: Mapping[str, RunningStat]
    # Samples in which garbage collections inside this call took at least 5 % of its time
    # (`stats.running.held_collection`); None: not watched (a version-1 file).
    gc_samples: int | None = None

    def mean(self, metric: str) -> float | None:
        stat = self.metrics.get(metric)
        return None if stat is None else stat.mean

    def medians_known(self) -> bool:
        """Every statistic has a median (not a version-1 file's, which kept none)."""
        if getattr(self.metrics, "medians_known", False):  # running statistics: known
            return True
        return all(stat.median is not None for stat in self.metrics.values())

    def typical(self, metric: str) -> float | None:
        """The colour and rank statistic of `metric` (`RunningStat.typical`), None if not
        measured."""
        read = getattr(self.metrics, "typical", None)  # `ColumnMetrics`: no RunningStat built
        if read is not None:
            return read(metric)  # type: ignore[no-any-return]
        stat = self.metrics.get(metric)
        return None if stat is None else stat.typical

    def count(self, metric: str) -> int:
        """How many samples measured `metric` (0: never)."""
        read = getattr(self.metrics, "count", None)  # `ColumnMetrics`: no RunningStat built
        if read is not None:
            return read(metric)  # type: ignore[no-any-return]
        stat = self.metrics.get(metric)
        return 0 if stat is None else stat.count

    def __repr__(self) -> str:
        # One line: the generated repr printed every RunningStat of every metric (~1.7 KB a
        # module), so `prof.top(...)` of 3 rows filled a screen. The fields stay attributes.
        shown = [
            f"{name}={stat.typical:.4g}"
            for name, stat in self.metrics.items()
            if name in _REPR_METRICS
        ]
        count = max((stat.count for stat in self.metrics.values()), default=0)
        kept = self.medians_known()
        return (
            f"<ModuleStats {self.key} {self.module_type} {' '.join(shown)} "
            f"({'medians' if kept else 'means'} of {count} "
            f"sample(s); .metrics has {len(self.metrics)})>"
        )
