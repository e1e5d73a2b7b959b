"""The profiles of one report page as its runs. Takes (label, model name, table) triples; gives
one table of rows (with several profiles, each row ends with its run's `id` and `name`, as the
panel reads runs in W&B) and the header's totals table, a row per run, from each table's meta
rows. `html.py` puts them into the page.

>>> run_id(3, 12)
'03'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from wandb_modprof._errors import ModProfError
from wandb_modprof.view.units import format_value

if TYPE_CHECKING:
    from wandb_modprof.view.table import ProfileTable

# (label, model name, meta numbers) of one run
Summary = tuple[str, str, dict[str, float | None]]


def run_id(index: int, runs: int) -> str:
    """The `id` of the `index`-th profile: its index, zero-padded to one width ("0" ... "9",
    "00" ... "11") because the spec lists runs sorted by id as strings."""
    return str(index).zfill(len(str(runs - 1)))


def joined_runs(
    tables: Sequence[tuple[str, str, ProfileTable]],
) -> tuple[list[str], list[list[Any]], list[Summary]]:
    """The tables' rows as one table (several: with the run's `id` and `name` appended), and
    the (label, model, meta numbers) of each."""
    several = len(tables) > 1
    columns: list[str] = []
    data: list[list[Any]] = []
    summaries: list[Summary] = []
    for index, (label, model, table) in enumerate(tables):
        if not columns:
            columns = list(table.columns) + (["id", "name"] if several else [])
        elif list(table.columns) != columns[: len(table.columns)]:
            raise ModProfError("report_html() expected tables of one format; the columns differ")
        extra = [run_id(index, len(tables)), label] if several else []
        data.extend([*row, *extra] for row in table.rows)
        summaries.append((label, model, _meta(table)))
    return columns, data, summaries


def _meta(table: ProfileTable) -> dict[str, float | None]:
    """The table's meta numbers by key (None where the table says missing)."""
    out: dict[str, float | None] = {}
    for row in table.records(("meta",)):
        measured = row["missing"] != "meta_number"
        out[str(row["meta_key"])] = float(row["meta_number"]) if measured else None
        if row["meta_key"] == "statistic" and row["meta_value"] == "mean":
            out["statistic_mean"] = 1.0  # a version-1 profile: means, no medians
    return out


# the same figures as the panel's totals and `summary`'s "per step" line: the root call's
# median (mean for a version-1 file) over the samples in the statistics
_TOTALS_HEADS = ("model", "forward / step", "backward / step", "activations", "parameters")


def totals_table(
    summaries: Sequence[tuple[str, str, Mapping[str, float | None]]], several: bool
) -> tuple[list[str], list[list[str]]]:
    """The header's totals table: its column heads and one row of text cells per profile."""
    stat = "mean" if any(meta.get("statistic_mean") for _, _, meta in summaries) else "median"
    named = [_TOTALS_HEADS[0], *(f"{h} ({stat})" for h in _TOTALS_HEADS[1:4]), _TOTALS_HEADS[4]]
    heads = (["run"] if several else []) + named + ["samples"]
    rows = []
    for label, model, meta in summaries:
        samples = meta.get("num_samples")
        cells = [
            model,
            format_value("ms", meta.get("total_fwd_ms")),
            format_value("ms", meta.get("total_bwd_ms")),
            format_value("bytes", meta.get("total_act_bytes")),
            format_value("bytes", meta.get("total_param_bytes")),
        ]
        cells = ([label] if several else []) + cells + ["0" if not samples else f"{samples:.0f}"]
        rows.append(cells)
    return heads, rows
