"""The W&B sink of `watch`: every sample logs the step totals, scheduled ones the module-graph
panel (`table_schedule`).

>>> run = wandb.init(project="my-project")                     # doctest: +SKIP
>>> handle = wandb_modprof.watch(model, log_freq=100)          # doctest: +SKIP
>>> # every 100th step adds to the user's next `run.log` row:
>>> #   modprof/GPT2LMHeadModel          the panel (custom chart over the profile table)
>>> #   modprof/GPT2LMHeadModel/fwd_ms   bwd_ms, act_bytes: that step's totals, over time

What one log holds, per watched model, under `modprof/<ModelClassName>` (a second watched
model of the same class in the same run gets `modprof/<Class>_1`, a third `_2`, in watch
order; re-watching the same model object in that run reuses its key):

- `<key>` (on the samples `table_schedule` picks: the 1st, 2nd, 4th, ..., at most
  `table_interval` seconds apart, and the last at `unwatch()`): `wandb.plot_table(chart, table,
  fields={}, string_fields={"mode", "scale"})` over a new `wandb.Table` of `Profile.table()`,
  the profile aggregated over all samples so far.
  W&B stores the table under `<key>_table` and the panel shows the latest one logged
  (`summaryTable`). A fresh Table every time: W&B ignores a re-logged, mutated one.
- `<key>/fwd_ms`, `<key>/bwd_ms`, `<key>/act_bytes` (every sample): the sample's `StepTotals`
  (a value that was not measured is left out), so W&B draws them over steps; with them
  `<key>/overhead_pct` and `<key>/samples` (the samples so far).

At `unwatch()`: `<key>/report`, a `wandb.Html` of the final profile as the self-contained
HTML report (`sinks.report.html.report_html`, Vega inlined, about 1 MB plus the table), in the same
`run.log` call as the last sample (alone if that was logged already; none if no sample was
ever logged); not built for disabled runs, which discard everything.

The full profile, as a W&B artifact: at `unwatch()` (and, with `artifact_freq=N`, at every
N-th logged sample too) the profile file (`prof.save`, `*.modprof.json`) is logged as the
artifact `modprof-<run id>-<Class>` (`wandb_names.artifact_name`), `type="modprof-profile"`,
one version per log: the table is cut to 10,000 rows (`view/reduce.py`), the file never is, and
`wandb-modprof report` or `wandb_modprof.load` read it back from
`run.use_artifact(...).download()`. A reduced table's note (the panel's banner) names the
artifact. `artifact_freq=None` logs none; disabled runs log none. Everything is logged with
`commit=False`, as `wandb.watch` does: it joins the user's next `run.log` row.

When: a sample is complete when its backward ends, inside the autograd engine. `Capture`
marks it and calls `WandbLog.deliver` at the model's next root forward (on accelerators once
its device events completed, never a device sync); with `watch`'s worker process, the
worker logs the rows into the run itself (`sinks.wandb.wandb_attach`) and `log_packed` keeps the
count and logs the artifact, or, where it cannot attach, `log_packed` logs the rows it built,
at the first root forward after the answer (`api.sample_handoff`). Samples resolved together
are logged once (the totals are the newest sample's). `unwatch()` and `run.finish()` log what
is left.

The chart preset: `chart=` if given, else `<entity>/wandb-modprof-v4` with the entity of the
run (`run.entity`), else `$WANDB_ENTITY`. The preset must be registered once per entity
(`wandb-modprof register-chart`, `register_chart()`). An offline run with no entity at all
cannot name it: its tables are logged alone under `<key>_table` (the same data and key a chart
would have stored), and a two-line warning at the user's line says how to get the panel for
the entry point used (`wandb.init(entity=...)`, `WandbLogger(entity=...)`, `WANDB_ENTITY`).
Offline runs warn once per process that the preset must be registered before `wandb sync`.
Disabled runs (`mode="disabled"`, entity "dummy") log into the no-op run without a warning.
A failure while building or logging (a finished run, a full disk) warns once per watched
model and drops that log; training never sees it. Distributed runs: only rank 0 has a
`WandbLog`; just before it builds the table it folds every rank's published statistics into
the profile (`before_table`, `api.distributed.RankChannel`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from wandb_modprof._warn import warn_safely
from wandb_modprof.records.snapshot import SupportsSnapshot, as_data
from wandb_modprof.sinks.wandb.table_schedule import DEFAULT_INTERVAL_S, TableSchedule
from wandb_modprof.sinks.wandb.wandb_entry import entry_of, html_entry
from wandb_modprof.sinks.wandb.wandb_names import (
    ARTIFACT_TYPE,
    PROFILE_FILE,
    artifact_name,
    run_flag,
)
from wandb_modprof.sinks.wandb.wandb_table import wandb_table, wandb_table_of
from wandb_modprof.stats.quiet_gc import paused_gc

if TYPE_CHECKING:
    from wandb_modprof.records.sample import Sample, StepTotals
    from wandb_modprof.records.snapshot import Overhead, ProfileData
    from wandb_modprof.view.table import ProfileTable


class SupportsLatest(Protocol):
    """The newest sample and the run's overhead, read without a snapshot (a
    `ProfileAccumulator`)."""

    @property
    def last(self) -> Sample | None: ...

    @property
    def overhead(self) -> Overhead | None: ...


def build_table_for(log: WandbLog, data: ProfileData, max_rows: int | None = None) -> ProfileTable:
    """`data`'s table as `log` logs it: a reduced table's note says where the full profile is."""
    from wandb_modprof.view.table import MAX_ROWS, build_table  # with the layout: when logging

    return build_table(data, MAX_ROWS if max_rows is None else max_rows, log.full_detail)


class WandbLog:
    """Logs one watched model's samples to one run (see the module docstring)."""

    def __init__(
        self,
        run: Any,
        key: str,
        chart: str | None,
        default_mode: str,
        default_scale: str,
        artifact_freq: int | None = 0,
        table_interval: float | None = DEFAULT_INTERVAL_S,
    ) -> None:
        self.run = run
        self.key = key
        self.chart = chart
        self.string_fields = {"mode": default_mode, "scale": default_scale}
        self.logged_samples = 0  # samples whose scalars were logged (every sample's are)
        self.schedule = TableSchedule(table_interval)  # which logs carry the table
        # None: no artifact; 0: at unwatch only; N: also at every N-th logged sample
        self.artifact_freq = None if run_flag(run, "disabled") else artifact_freq
        self.artifact: Any = None  # the last `wandb.Artifact` logged (None: none yet)
        self._artifact_at = 0  # the sample count of the last artifact logged
        self._logs = 0  # samples logged (logs), for `artifact_freq`
        self._warned = False

    @property
    def full_detail(self) -> str:
        """Where the full profile is, for a reduced table's note ("" when it is not logged)."""
        if self.artifact_freq is None:
            return ""
        return (
            f"The full profile is logged to this run as the W&B artifact "
            f"{artifact_name(self.run, self.key)} (type {ARTIFACT_TYPE}) at unwatch()"
            + (f" and every {self.artifact_freq} logged samples" if self.artifact_freq else "")
            + "."
        )

    def log_profile(self, data: ProfileData) -> Any:
        """Log `data` as the profile file artifact (see the module docstring); the artifact."""
        import tempfile

        from wandb_modprof.sinks.file.profile_file import save_profile

        with tempfile.TemporaryDirectory(prefix="modprof-") as tmp:
            path = save_profile(data, f"{tmp}/{PROFILE_FILE}")
            return self.log_profile_file(str(path), data.model_name, data.num_samples)

    def log_profile_file(self, path: str, model_name: str, num_samples: int) -> Any:
        """Log the profile file at `path` (written by `save_profile`) as the artifact."""
        import wandb

        artifact = wandb.Artifact(
            artifact_name(self.run, self.key),
            type=ARTIFACT_TYPE,
            description=f"wandb_modprof profile of {model_name}, {num_samples} samples",
            metadata={"model": model_name, "samples": num_samples, "key": self.key},
        )
        artifact.add_file(path, name=PROFILE_FILE)  # copied: the file's folder may go
        self.run.log_artifact(artifact)
        self.artifact, self._artifact_at = artifact, num_samples
        return artifact

    def wants_report(self) -> bool:
        """Whether the final log adds the HTML report (never to a disabled run)."""
        return not run_flag(self.run, "disabled")

    def artifact_due_next(self) -> bool:
        """Whether the next log of new samples also logs the profile file (`artifact_freq`)."""
        freq = self.artifact_freq
        return freq is not None and freq > 0 and (self._logs + 1) % freq == 0

    def log_packed(
        self,
        count: int,
        totals: StepTotals | None,
        columns: list[str] | None,
        rows: list[list[object]] | None,
        page: str | None,
        profile_file: str | None,
        model_name: str,
        final: bool,
        overhead: Overhead | None = None,
    ) -> None:
        """Log what `watch`'s worker process answered (`api.sample_handoff`): the newest
        sample's scalars (always, here), the packed cells of a table and the report page
        (final), and the profile file written there when an artifact is due. `columns` None:
        no table was due (`table_due`), or the worker logged the rows and the page to the run
        itself (`sinks.wandb.wandb_attach`); the scalars, the bookkeeping and the artifact are
        left here. Like `deliver`, never raises."""
        try:
            new = count != self.logged_samples
            report = final and count > 0 and page is not None and self.wants_report()
            if not (new or report or (final and columns is None)):
                return
            self.logged_samples = count
            with paused_gc():
                cells = None
                if columns is not None and rows is not None:
                    cells = wandb_table_of(columns, rows)
                entry = self._entry_of(cells, totals, overhead, count) if new else {}
                if cells is not None and not new:
                    entry = self._entry_of(cells, None)
                if report:
                    entry.update(self._html(str(page)))
                if entry:
                    self.run.log(entry, commit=False)
            self._logs += 1 if new else 0
            freq = self.artifact_freq
            due = freq is not None and (final or (freq > 0 and new and self._logs % freq == 0))
            if due and profile_file is not None and count > self._artifact_at:
                self.log_profile_file(profile_file, model_name, count)
        except Exception as error:
            self._warn_once(error)

    def table_due(self, count: int, final: bool = False) -> bool:
        """Whether the log of `count` samples carries the table (`table_schedule`; the final
        log does when any sample came since the last table); counted as logged if so."""
        if final and self.schedule.behind(count):
            self.schedule.logged(count)
            return True
        return self.schedule.take(count)

    def deliver(
        self,
        ready: Callable[[], int | None],
        snapshot: Callable[[], ProfileData],
        final: bool = False,
        before_table: Callable[[], bool] | None = None,
        latest: SupportsLatest | None = None,
    ) -> bool:
        """Log the samples resolved since the last log. `ready()` resolves what it can and
        gives the number of samples, or None while some still await their device events: then
        False, ask again on a later step. `snapshot()` reads the profile once, for the table.
        `final` (at `unwatch`): the HTML report joins that log (or is logged alone if every
        sample was logged already). `before_table` runs just before the table is built: a
        distributed run's rank 0 folds the other ranks' statistics into the profile there, and
        at the final log, when they are newer than in the last table logged (it said True), the
        table is logged again. Only the logs the schedule picks (`table_due`) build and carry
        the table; the others log the newest sample's scalars alone, from `latest` (its `last`
        sample's totals and its `overhead`: no snapshot, no table), where it is given. Nothing here
        raises: a failed log warns once and is dropped."""
        try:
            count = ready()
            if count is None:
                return False
            new = totals = count != self.logged_samples
            if final and not new and count > 0 and before_table is not None:
                new = before_table()  # other ranks' last samples arrived since
                before_table = None
                if new:
                    self.schedule.logged(count - 1)  # (their statistics: a table is due again)
            report = final and count > 0 and not run_flag(self.run, "disabled")
            if not (new or report or (final and self.schedule.behind(count))):
                return True
            self.logged_samples = count  # set first: a failed log is dropped, not retried
            # (without `latest`, every log carries the table, as `Profile`'s callers expect)
            with_table = self.table_due(count, final) or latest is None
            self._logs += 1 if new else 0
            freq = self.artifact_freq
            due = freq is not None and (final or (freq > 0 and new and self._logs % freq == 0))
            data = None
            if with_table or report:
                if before_table is not None:
                    before_table()
                with paused_gc():  # ~10,000 rows x 80 cells of short-lived objects, no cycles
                    data = snapshot()
                    table = build_table_for(self, data)  # once, for the panel and the report
                    # (without the table: the report alone, the last table was of these samples)
                    entry = self.entry(data, table, totals) if with_table else {}
                    if report:
                        entry.update(self.report(data, table))
                    if entry:
                        self.run.log(entry, commit=False)
            else:  # a sample between scheduled tables: its scalars alone
                assert latest is not None
                sample = latest.last
                last = sample.totals if sample is not None else None
                self.run.log(self._entry_of(None, last, latest.overhead, count), commit=False)
            if due and count > self._artifact_at:
                self.log_profile(data if data is not None else snapshot())
        except Exception as error:
            self._warn_once(error)
        return True

    def report(
        self, profile: ProfileData | SupportsSnapshot, table: ProfileTable | None = None
    ) -> dict[str, Any]:
        """`{<key>/report: wandb.Html}`: the final profile as the self-contained HTML report
        (`sinks.report.html`), or {} if it could not be built (warned once, like a failed log)."""
        try:
            from wandb_modprof.sinks.report.html import report_html, tables_html

            mode, scale = self.string_fields["mode"], self.string_fields["scale"]
            data = as_data(profile, "report()")
            if table is None:
                page = report_html([(data.model_name, data)], mode=mode, scale=scale)
            else:
                page = tables_html([(data.model_name, data.model_name, table)], mode, scale)
            return self._html(page)
        except Exception as error:
            self._warn_once(error)
            return {}

    def _html(self, page: str) -> dict[str, Any]:
        return html_entry(self.key, page)

    def entry(
        self,
        profile: ProfileData | SupportsSnapshot,
        table: ProfileTable | None = None,
        totals: bool = True,
    ) -> dict[str, Any]:
        """The dict of one `run.log` call: the panel (or its table) and, with `totals`, the
        step totals (not when a table is logged again for the same samples)."""
        from wandb_modprof.view.table import build_table

        data = as_data(profile, "entry()")
        if table is None:
            table = build_table(data)
        last = data.last.totals if data.last is not None and totals else None
        return self._entry_of(
            wandb_table(table),
            last,
            data.overhead if totals else None,
            data.num_samples if totals else None,
        )

    def _entry_of(
        self,
        cells: Any,
        totals: StepTotals | None,
        overhead: Overhead | None = None,
        samples: int | None = None,
    ) -> dict[str, Any]:
        return entry_of(self.key, self.chart, self.string_fields, cells, totals, overhead, samples)

    def _warn_once(self, error: Exception) -> None:
        if self._warned:
            return
        self._warned = True
        warn_safely(
            f"wandb_modprof: could not log {self.key} to W&B ({type(error).__name__}: {error}). "
            "This log is dropped; training continues and later samples are still logged (no "
            "further warning). If the run was finished: call unwatch() before run.finish().",
            RuntimeWarning,
            stacklevel=2,
        )
