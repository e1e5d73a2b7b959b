"""`watch` / `unwatch`: sample every `log_freq`-th training step of a training loop."""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch import nn

from wandb_modprof._errors import ModProfError
from wandb_modprof._validate import (
    check_artifact_freq,
    check_chart,
    check_choice,
    check_log_freq,
    check_model,
    check_offload,
    check_optimizer,
    check_overhead,
    check_run,
    check_table_interval,
)
from wandb_modprof._warn import entry_point, warn_at_user
from wandb_modprof.api.distributed import RankChannel, open_channel, rank_info
from wandb_modprof.api.overhead import DEFAULT_OVERHEAD, run_overhead
from wandb_modprof.api.profile import Profile
from wandb_modprof.api.sample_handoff import SampleHandoff
from wandb_modprof.api.settings import FIELDS, Settings, accepts_moved, check_settings
from wandb_modprof.api.step_counter import StepCounter
from wandb_modprof.capture.hooks import Capture
from wandb_modprof.capture.model.wrappers import check_supported, type_name
from wandb_modprof.capture.options import Options, parse_options
from wandb_modprof.capture.root_hooks import recover_interrupted_captures
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.records import modes as _modes
from wandb_modprof.records.snapshot import Overhead
from wandb_modprof.sinks.wandb.table_schedule import DEFAULT_INTERVAL_S
from wandb_modprof.sinks.wandb.wandb_log import WandbLog
from wandb_modprof.sinks.wandb.wandb_names import chart_name, model_key
from wandb_modprof.sinks.wandb.wandb_run import call_at_finish, current_run
from wandb_modprof.stats.accumulator import ProfileAccumulator


class WatchHandle:
    """Returned by `watch`; `profile()` gives the aggregated measurements so far, `key` the
    W&B key its panel is logged under (`modprof/<ModelClass>`), `chart` the chart preset."""

    kind = "watched"

    def __init__(
        self,
        model: nn.Module,
        log_freq: int | str,
        run: Any,
        optimizer: torch.optim.Optimizer | None,
        options: Options,
        budget: float = DEFAULT_OVERHEAD,
    ) -> None:
        self.model = model
        self.log_freq = log_freq
        self.run = run
        self.key = ""  # set by `watch` once the model is claimed
        self.chart: str | None = None  # the W&B chart preset; None: tables without the panel
        self._wandb_log: WandbLog | None = None
        self._ranks: RankChannel | None = None  # distributed runs: per-rank statistics
        self._counter = StepCounter(log_freq, optimizer, budget)
        self._structure = options.structure  # for the no-sample warning of unwatch()
        self._acc = ProfileAccumulator(type_name(model))
        self._profile = Profile(self._acc.model_name, self._acc)
        try:
            self._capture = Capture(
                model,
                options,
                optimizer,
                self._counter,
                hooks_only_when_sampling=True,
                structure_eligible=self._counter.pass_allowed,
                sink=self._acc,
            )
        except BaseException:
            self._counter.remove()  # a refused watch leaves no optimizer hook behind
            raise
        self._capture.owner = self
        self._capture.set_after_sample(self._timed_log)
        self._counter.follow(self._capture)  # its passes and the root hooks' clock
        self._handoff: SampleHandoff | None = None  # set by `watch` when samples may move

    def _offload(self, setting: str, log: WandbLog, mode: str, scale: str) -> None:
        """Hand samples to a worker process (`api.sample_handoff`) as `setting` says."""
        if setting == "off":
            return
        from wandb_modprof.sinks.wandb.wandb_attach import DISABLED, attach_target
        from wandb_modprof.view.table import MAX_ROWS

        # The worker logs the rows to the run itself where it can attach
        # (`sinks.wandb.wandb_attach`).
        target, why = attach_target(log.run, log.key, log.chart, log.string_fields)
        start = ("start", self._acc.model_name, MAX_ROWS, log.full_detail, mode, scale, target)
        self._handoff = SampleHandoff(self.key, setting, start)
        if why != DISABLED:  # a disabled run discards every log: nothing to say
            self._handoff.attach_note = why
        self._acc.remote = self._handoff

    def _timed_log(self) -> bool:
        """`_log_samples` at a root forward, its time counted as the run's overhead."""
        start = time.perf_counter()
        try:
            return self._log_samples()
        finally:
            self._counter.meter.own(time.perf_counter() - start)

    @property
    def overhead(self) -> Overhead:
        """What sampling has cost this run's training thread so far (`api.overhead`), with
        the structure passes that ran."""
        return run_overhead(self._counter.meter, self._capture.structures.totals(), self._handoff)

    def _log_samples(self, force: bool = False, final: bool = False) -> bool:
        """Called at the root forward after a sample (and by `unwatch`): rank 0 (or a run
        that is not distributed) logs; every other rank publishes its statistics for rank 0."""
        acc = self._acc
        acc.overhead = self.overhead
        ranks = self._ranks
        if ranks is not None and not ranks.is_logger:
            acc.resolve_pending(force=force)
            if acc.pending_count:
                return False  # device events not complete: asked again at a later step
            ranks.publish(acc)
            return True
        log = self._wandb_log
        if log is None:
            return True
        handoff = self._handoff
        if handoff is not None and ranks is None:
            acc.resolve_pending(force=False)  # decides at the first sample; hands it over
            if acc.remote is handoff:
                return handoff.deliver(acc, log, final)

        def ready() -> int | None:
            acc.resolve_pending(force=force)
            return None if acc.pending_count else acc.num_samples

        before = None
        if ranks is not None:
            before = functools.partial(ranks.collect, acc, final=final)
        return log.deliver(ready, acc.snapshot, final=final, before_table=before, latest=acc)

    @property
    def steps(self) -> int:
        """Training steps counted so far (see `watch` for what counts as a step)."""
        return self._counter.steps

    @property
    def active(self) -> bool:
        return self._capture.attached

    def profile(self) -> Profile:
        """The aggregated profile; waits for the device only for samples not yet resolved."""
        self._acc.overhead = self.overhead
        self._acc.resolve_pending(force=True)
        return self._profile

    def unwatch(self) -> Profile:
        """Remove every hook (module, root, optimizer), log the samples not logged yet (waits
        for the device) and the final HTML report (`<key>/report`), and return the final
        profile."""
        recover_interrupted_captures()  # (this model's too: a step an exception cut short)
        if self._capture.attached:
            if self._handoff is not None:
                self._handoff.closing = True
            self._capture.detach()
            self._counter.remove()
            _registry.release(self.model, self)
            # final: the HTML report joins the last sample's log (`<key>/report`)
            self._log_samples(force=True, final=True)
            if self._handoff is not None:
                self._handoff.close(self._acc)
            if self._acc.num_samples == 0 and not self._capture.transformed_steps:
                warn_at_user(_no_sample_text(self, entry_point()), UserWarning)
        return self._profile

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return (
            f"<wandb_modprof.WatchHandle {type(self.model).__name__} log_freq={self.log_freq} "
            f"steps={self.steps} samples={self._acc.num_samples} {state}>"
        )


def _no_sample_text(handle: WatchHandle, entry: str) -> str:
    """Why a watch ended with nothing measured, and what to change (two lines)."""
    model, steps, freq = type(handle.model).__name__, handle.steps, handle.log_freq
    unit = "optimizer step" if handle._counter.counts_optimizer_steps else "training step"
    head = f"wandb_modprof: {model} was watched for {steps} {unit}(s) with log_freq={freq}"
    if steps == 0:
        why = (
            f"{head} and no sample was taken: no {unit} was counted (a step is a forward "
            "in training mode with grad enabled), so nothing was logged.\n"
        )
    elif isinstance(freq, int) and steps < freq:
        why = f"{head}: steps {freq}, {2 * freq}, ... are sampled, so none was, nothing logged.\n"
    else:
        first = "the first training step is the structure pass; " if handle._structure else ""
        why = (
            f"{head} and no sample completed ({first}a sample counts once its backward has "
            "ended), so nothing was logged.\n"
        )
    suggest = max(1, steps // 3)
    call = {
        "watch": f"watch(model, log_freq={suggest})",
        "lightning": f"ModProfCallback(log_freq={suggest})",
        "huggingface": f"ModProfCallback(log_freq={suggest})",
    }[entry]
    return why + (
        f"To measure a run this short, pass a log_freq below its length, e.g. {call}."
        if steps > 1
        else f"Train for more steps (at least 2), or sample more often: {call}."
    )


def count_from(handle: WatchHandle, optimizer_steps: int) -> None:
    """Continue counting optimizer steps from `optimizer_steps` (a resumed run's global step,
    for the framework callbacks in `integrations`)."""
    handle._counter.optimizer_steps = optimizer_steps


def forwards_counted(handle: WatchHandle) -> int:
    """Training forwards of the watched module counted so far (every micro-batch)."""
    return handle._counter.forwards


@accepts_moved("watch", FIELDS)
def watch(
    model: nn.Module,
    log_freq: int | str = 100,
    run: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    activations: bool = True,
    norms: bool = True,
    structure: bool = True,
    artifact_freq: int | None = 0,
    table_interval: float | None = DEFAULT_INTERVAL_S,
    settings: Settings | None = None,
) -> WatchHandle:
    """Measure every module of `model` on every `log_freq`-th training step; log to W&B.

    Between samples the model carries one cheap forward pre-hook and one forward hook on the
    root module only; every other module runs hook-free. On a sampled step, hooks are added
    before its forward and removed when its backward has finished.

    Each sample is logged to the run with `commit=False` (it joins your next `run.log` row) at
    the model's next forward, under `modprof/<ModelClass>`: the module-graph panel over the
    aggregated profile table, and the step totals `modprof/<ModelClass>/fwd_ms`, `bwd_ms`,
    `act_bytes`; `unwatch()` logs the last one (see `sinks.wandb.wandb_log` for keys, timing,
    the chart preset and offline runs). `run.finish()` unwatches the model first.

    Distributed training: `watch(ddp_model)` names modules as in the wrapped model (no
    `module.` prefix); FSDP2 (`fully_shard`) modules keep their class names. See
    `api.distributed` for how per-rank statistics reach rank 0 without any collective.

    Args:
        model: the module to measure (the same object the training loop calls).
        log_freq: sample every `log_freq`-th training step (>= 1), or "auto": sample when
            the run's measured cost of sampling stays within `Settings.overhead` (default
            1 % of training time, `api.overhead`).
        run: the W&B run to log to (default: `wandb.run`; one of them is required: for
            profiling without W&B use `wandb_modprof.profile(model)`). In a distributed
            run (`torch.distributed` initialised) only rank 0 needs and uses one: every other
            rank measures its own samples and publishes them to rank 0, whose table holds
            every rank's (`api.distributed`); a run given on another rank is not logged to.
        optimizer: if given, steps are counted as optimizer steps (gradient accumulation) and
            optimizer-state bytes are measured per module.
        activations: measure bytes saved for backward (saved-tensor hooks on sampled steps).
        norms: measure parameter and gradient norms per module.
        structure: capture the module graph (dataflow between calls) and FLOPs on the first
            training step (with `log_freq="auto"`: once the budget allows it), and again after
            a sampled step that called a new sequence of modules. That step is never timed
            (if it was due for sampling, it is skipped), except when the first sampled step
            comes before any graph: that step is timed and derives the graph (no FLOPs) from
            its own forward, and the structure pass takes a later step.
        artifact_freq: the full profile file (every call; the panel's table holds at most
            10,000 rows) as a W&B artifact (`type="modprof-profile"`): 0 (default) at
            `unwatch()`, N > 0 also at every N-th logged sample, None never.
        table_interval: the most seconds between two tables (the panel's data) logged to
            W&B, default 3600; None: no limit. Tables go at the 1st, 2nd, 4th, ... sample and
            at `unwatch()`, every sample logs its step totals (`sinks.wandb.table_schedule`).
        settings: what experts change (`Settings`: timing, warmup, NVTX ranges, the
            roofline's peaks, the worker process, the overhead budget of `log_freq="auto"`,
            the chart preset, the panel's initial mode and scale); None: the defaults. Every
            sample's measured overhead is in `handle.overhead`, the summary, the panel, the
            report and `modprof/<Class>/overhead_pct`.

    Examples:
        >>> run = wandb.init(project="my-project")                 # doctest: +SKIP
        >>> handle = wandb_modprof.watch(model, log_freq=100)      # doctest: +SKIP
        >>> for batch in loader:                                   # doctest: +SKIP
        ...     loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()
        ...     run.log({"loss": loss.item()})
        >>> print(handle.unwatch().summary())                      # doctest: +SKIP
    """
    check_model(model, "watch()")
    given = check_settings(settings, "watch()")
    options = parse_options(
        timing=given.timing,
        activations=activations,
        norms=norms,
        structure=structure,
        nvtx=given.nvtx,
        warmup=given.warmup,
        peak_flops=given.peak_flops,
        peak_bw=given.peak_bw,
    )
    if not (isinstance(log_freq, str) and log_freq == "auto"):
        log_freq = check_log_freq(log_freq)
    budget = check_overhead(given.overhead)
    optimizer = check_optimizer(optimizer)
    default_mode = check_choice("default_mode", given.default_mode, _modes.MODE_KEYS)
    default_scale = check_choice("default_scale", given.default_scale, _modes.SCALES)
    chart = check_chart(given.chart)
    artifact_freq = check_artifact_freq(artifact_freq)
    table_interval = check_table_interval(table_interval)
    setting = check_offload(given.offload)
    run = check_run(run)
    check_supported(model)
    info = rank_info()
    logs = info is None or info.rank == 0
    run = current_run(run) if logs else None
    recover_interrupted_captures()  # another model's step an exception cut short
    handle = WatchHandle(model, log_freq, run, optimizer, options, budget)
    try:
        _registry.claim(model, handle, "watching")
    except BaseException:
        handle._counter.remove()
        raise
    try:
        if info is not None and info.world_size > 1:
            handle._ranks = open_channel(info, type_name(model))
        if logs:
            key = model_key(run, model)
            handle.key = key
            handle.chart = chart_name(run, chart, key)
            handle._wandb_log = WandbLog(
                run, key, handle.chart, default_mode, default_scale, artifact_freq, table_interval
            )
            if handle._ranks is None:
                handle._offload(setting, handle._wandb_log, default_mode, default_scale)
            call_at_finish(run, handle, WatchHandle.unwatch)
        else:
            handle.key = f"modprof/{type_name(model)}"  # as rank 0 names it (first model)
        handle._capture.attach()
    except BaseException:
        handle._counter.remove()
        _registry.release(model, handle)
        raise
    return handle


def unwatch(model: nn.Module | None = None) -> None:
    """Remove wandb_modprof's hooks from `model`, or from every watched model if None."""
    if model is None:
        for owner in _registry.owners():
            if isinstance(owner, WatchHandle):
                owner.unwatch()
        return
    check_model(model, "unwatch()")
    owner = _registry.owner_of(model)
    if not isinstance(owner, WatchHandle):
        raise ModProfError(
            f"unwatch() expected a model passed to watch(); {type(model).__name__} is not watched"
        )
    owner.unwatch()
