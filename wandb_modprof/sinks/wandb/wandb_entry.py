"""What one `run.log` of a watched model holds (`sinks.wandb.wandb_log` says when and why): the
panel over the sample's table, the step totals, the measured overhead, and at `unwatch()` the
HTML report. Built in the training process (`WandbLog`) or in `watch`'s worker process when it
logs to the run itself (`sinks.wandb.wandb_attach`): one definition, so both log the same keys."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wandb_modprof.records.sample import StepTotals
    from wandb_modprof.records.snapshot import Overhead

TOTALS = ("fwd_ms", "bwd_ms", "act_bytes")
PHASE_PREFIX = "phase/"  # `<key>/phase/between_ms`, ...: the sample's step phases
SAMPLES = "samples"  # `<key>/samples`: the samples folded into the profile so far
REPORT_SUFFIX = "/report"  # `<key>/report`: the HTML report, logged once at unwatch()


def entry_of(
    key: str,
    chart: str | None,
    string_fields: dict[str, str],
    cells: Any,
    totals: StepTotals | None,
    overhead: Overhead | None = None,
    samples: int | None = None,
) -> dict[str, Any]:
    """One log's `run.log` dict: the panel (or its table alone, without a chart; `cells` None:
    neither, a sample between scheduled tables), the step totals, the measured overhead and
    the samples so far. Shared by the training process and the worker."""
    entry: dict[str, Any] = {}
    if cells is not None and chart is None:
        entry[f"{key}_table"] = cells
    elif cells is not None and chart is not None:
        import wandb

        entry[key] = wandb.plot_table(chart, cells, fields={}, string_fields=dict(string_fields))
    if totals is not None:
        for name in TOTALS:
            value = getattr(totals, name)
            if value is not None and math.isfinite(value):
                entry[f"{key}/{name}"] = value
        if totals.phases is not None:  # `<key>/phase/<name>_ms`: its trend is a line chart
            for phase, ms in totals.phases.ms.items():
                entry[f"{key}/{PHASE_PREFIX}{phase}_ms"] = ms
    if overhead is not None:  # `watch`'s measured cost of sampling, % of training time
        entry[f"{key}/overhead_pct"] = 100.0 * overhead.share
    if samples is not None:
        entry[f"{key}/{SAMPLES}"] = samples
    return entry


def html_entry(key: str, page: str) -> dict[str, Any]:
    """`{<key>/report: wandb.Html}` of the report page."""
    import wandb

    from wandb_modprof.sinks.escape import encodable

    # inject=False: W&B's default would add a <link> to its CDN stylesheet, and the page must
    # work offline; data_is_not_path: never stat a 1 MB string as a path
    html = encodable(page)  # W&B writes it as UTF-8: a lone surrogate in a name would fail
    return {f"{key}{REPORT_SUFFIX}": wandb.Html(html, inject=False, data_is_not_path=True)}
