"""`watch` / `unwatch`: sample every `log_freq`-th training step of a training loop.

The entry points: arguments are checked here, once, and put together into a `WatchHandle`
(`api.watch_handle`), which holds the run's state from then on.
"""

from __future__ import annotations

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
from wandb_modprof.api.distributed import open_channel, rank_info
from wandb_modprof.api.settings import (
    FIELDS,
    Settings,
    accepts_moved,
    capture_options,
    check_settings,
)
from wandb_modprof.api.watch_handle import WatchHandle, abandon_watch, claim_model, start_watch
from wandb_modprof.capture.model.wrappers import check_supported, type_name
from wandb_modprof.capture.root_hooks import recover_interrupted_captures
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.records import modes as _modes
from wandb_modprof.sinks.wandb.table_schedule import DEFAULT_INTERVAL_S
from wandb_modprof.sinks.wandb.wandb_log import WandbLog
from wandb_modprof.sinks.wandb.wandb_names import chart_name, model_key
from wandb_modprof.sinks.wandb.wandb_run import current_run


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
    options = capture_options(given, activations=activations, norms=norms, structure=structure)
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
    claim_model(handle)
    try:
        ranks = None
        if info is not None and info.world_size > 1:
            ranks = open_channel(info, type_name(model))
        log = None
        if logs:
            key = model_key(run, model)
            log = WandbLog(
                run,
                key,
                chart_name(run, chart, key),
                default_mode,
                default_scale,
                artifact_freq,
                table_interval,
            )
        start_watch(handle, log, ranks, setting, default_mode, default_scale)
    except BaseException:
        abandon_watch(handle)
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
