"""`watch`'s worker process logs the W&B rows to the user's run itself, so that the training
thread pays none of W&B's table work (`wandb.Table` of ~10,000 rows, its JSON, `run.log`).

How: W&B's service process (wandb-core) owns the run; any process that can reach it can attach
to the run with `wandb.attach(attach_id=run.id)` and log into it (W&B SDK >= 0.16; offline runs
too). The training process hands the worker an `AttachTarget` at its start: the run's id, its
files folder (where W&B writes the table files), the service's address (`WANDB_SERVICE`) and
the keys to log under. The worker logs each scheduled table (`sinks.wandb.wandb_entry`; the
per-sample scalars are the training process's, `WandbLog.log_packed`) with
`commit=False`: it joins the user's next `run.log` row, the row the training thread would
have joined at the next root forward, and never advances `run.step`. A round trip to the
service after each log (`run.step`) returns once the service holds the row, before the worker
answers; so when `unwatch()` (or `run.finish()`, which unwatches first) has the final answer,
every row is in the run. The worker never finishes the run: that would end the user's.

Where attaching is not possible (a disabled run, an older SDK, a run the service does not
own, no service address), `attach_target` says why and the training thread logs as before;
`watch` says so once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from wandb_modprof.sinks.wandb import wandb_private as wp
from wandb_modprof.sinks.wandb.wandb_entry import entry_of, html_entry
from wandb_modprof.sinks.wandb.wandb_table import wandb_table_of


@dataclass(frozen=True)
class AttachTarget:
    """What a process needs to log a watched model's rows into the user's run."""

    run_id: str
    files_dir: str  # the run's files folder (`run.dir`): W&B writes the table files there
    service: str  # `WANDB_SERVICE`: the address of the W&B service that owns the run
    key: str  # `modprof/<Class>`
    chart: str | None  # the chart preset, or None: the table alone under `<key>_table`
    string_fields: dict[str, str]  # the panel's initial mode and scale


DISABLED = "the run is disabled"


def attach_target(
    run: Any, key: str, chart: str | None, string_fields: dict[str, str]
) -> tuple[AttachTarget | None, str]:
    """The target of `run` for the worker, or None and why it cannot attach."""
    import wandb

    try:
        if getattr(run, "disabled", False):
            return None, DISABLED
        run_id, files_dir = getattr(run, "id", None), getattr(run, "dir", None)
    except Exception as error:  # a property of a finished or foreign run object
        return None, f"the run cannot say its id ({type(error).__name__})"
    if not wp.has_attach(wandb):
        return None, f"wandb {getattr(wandb, '__version__', '?')} has no wandb.attach"
    service = os.environ.get(wp.SERVICE_ENV, "")
    if not (service and isinstance(run_id, str) and isinstance(files_dir, str)):
        return None, "the run has no W&B service to attach to"
    return AttachTarget(run_id, files_dir, service, key, chart, dict(string_fields)), ""


class AttachedRun:
    """The user's run, attached from the worker process."""

    def __init__(self, target: AttachTarget) -> None:
        os.environ[wp.SERVICE_ENV] = target.service  # before W&B's first call in this process
        import wandb

        wandb.setup(settings=wp.files_dir_settings(wandb, target.files_dir))
        self.target = target
        self.run = wp.attach(wandb, target.run_id)
        self.logged_samples = 0
        self.log_s = 0.0  # time spent logging, for the record

    def log(
        self, count: int, columns: list[str], rows: list[list[object]], page: str | None
    ) -> None:
        """Log the packed table of `count` samples (when new) and the report `page` (when
        given) as one row part; return once the service holds it. The per-sample scalars
        are the training process's to log (`WandbLog.log_packed`), at every sample."""
        start = time.perf_counter()
        t = self.target
        entry: dict[str, Any] = {}
        if count != self.logged_samples:
            cells = wandb_table_of(columns, rows)
            entry = entry_of(t.key, t.chart, t.string_fields, cells, None)
        if page is not None:
            entry.update(html_entry(t.key, page))
        if entry:
            self.run.log(entry, commit=False)
            _ = self.run.step  # a round trip on the same connection: the service has the row
        self.logged_samples = count
        self.log_s += time.perf_counter() - start
