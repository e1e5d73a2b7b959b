"""`WatchHandle`: what `watch` (`api.watch`) returns and what it holds for the run: the capture,
the step counter, the accumulator, and where the samples go (the W&B log, the worker process,
or rank 0). The functions below it start and undo a watch for `api.watch` and count steps for
the framework callbacks (`integrations`) without widening the handle's public surface.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch import nn

from wandb_modprof._warn import entry_point, warn_at_user
from wandb_modprof.api.distributed import RankChannel
from wandb_modprof.api.overhead import DEFAULT_OVERHEAD, run_overhead
from wandb_modprof.api.profile import Profile
from wandb_modprof.api.sample_handoff import SampleHandoff
from wandb_modprof.api.step_counter import StepCounter
from wandb_modprof.capture.hooks import Capture
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.options import Options
from wandb_modprof.capture.root_hooks import recover_interrupted_captures
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.records.snapshot import Overhead
from wandb_modprof.sinks.wandb.wandb_log import WandbLog
from wandb_modprof.sinks.wandb.wandb_run import call_at_finish
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


def claim_model(handle: WatchHandle) -> None:
    """Make `handle` its model's one owner (`capture.step.registry`); a refused claim (the
    model is watched or profiled already) leaves no optimizer hook behind."""
    try:
        _registry.claim(handle.model, handle, "watching")
    except BaseException:
        handle._counter.remove()
        raise


def start_watch(
    handle: WatchHandle,
    log: WandbLog | None,
    ranks: RankChannel | None,
    offload: str,
    mode: str,
    scale: str,
) -> None:
    """Say where a claimed `handle`'s samples go, then put its root hooks on: with a W&B `log`
    (rank 0, or a run that is not distributed) they are logged there, through the worker
    process as `offload` says when there are no `ranks`, and `run.finish()` unwatches first;
    without one (every other rank) they are published to rank 0 over `ranks`."""
    handle._ranks = ranks
    if log is None:
        handle.key = f"modprof/{handle._acc.model_name}"  # as rank 0 names it (first model)
    else:
        handle.key, handle.chart, handle._wandb_log = log.key, log.chart, log
        if ranks is None:
            handle._offload(offload, log, mode, scale)
        call_at_finish(log.run, handle, WatchHandle.unwatch)
    handle._capture.attach()


def abandon_watch(handle: WatchHandle) -> None:
    """Undo a claimed watch that failed to start: no optimizer hook and no claim left."""
    handle._counter.remove()
    _registry.release(handle.model, handle)
