"""Sentences a report's header says about one profile table, read from its meta rows: the
model's first step (`cold_start`) and compiled regions (`compiled_region`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wandb_modprof.view.table import ProfileTable


def table_notes(table: ProfileTable) -> list[str]:
    """Every note of `table`, in the order the header shows them."""
    return [note for note in (cold_note(table), region_note(table)) if note]


def cold_note(table: ProfileTable) -> str:
    """What became of the model's first step in its process ('' when it was not sampled):
    left out of the statistics, or the only sample (then its times are mostly start-up)."""
    for r in table.records(("meta",)):
        if r["meta_key"] == "cold_start":
            if float(r["meta_number"]) > 0:
                return (
                    "The model's first step in its process was sampled and left out of the "
                    "statistics: its times are mostly one-time start-up (allocator growth, "
                    "kernel selection)."
                )
            return (
                "The only sample is the model's first step in its process: its times are "
                "mostly one-time start-up (allocator growth, kernel selection), not the "
                "model's cost. Run one step before profiling, or pass warmup=1."
            )
    return ""


def region_note(table: ProfileTable) -> str:
    """What the table's `compiled_region` meta rows say, in a sentence ('' without any): the
    regions' names (from their views' rows; the key where a view is not drawn) and the calls
    that ran fused inside them, drawn grey in the time and memory modes."""
    records = table.records(("meta", "view"))
    keys = [
        (str(r["meta_value"]), int(r["meta_number"]))
        for r in records
        if r["row_kind"] == "meta" and r["meta_key"] == "compiled_region"
    ]
    if not keys:
        return ""
    names = {
        str(r["view_key"]): str(r["module_type"] if r["view_parent"] == -1 else r["name_ref"])
        for r in records
        if r["row_kind"] == "view"
    }
    shown = ", ".join(names.get(key, key) for key, _ in keys[:8])
    more = f" and {len(keys) - 8} more" if len(keys) > 8 else ""
    fused = sum(n for _, n in keys)
    regions = "one compiled region" if len(keys) == 1 else f"{len(keys)} compiled regions"
    return (
        f"torch.compile: {regions} ({shown}{more}), each measured as one call; the {fused} "
        "module calls inside ran fused, so they are drawn with their FLOPs only (grey in the "
        "time and memory modes; their hover cards say so)."
    )
