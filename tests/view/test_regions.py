"""Compiled regions in the table (issue 16 item 3): the `compiled_region` meta rows
(`view/meta.py`, `view/regions.py`), the rows of the nodes inside a region, and the notes the
summary and the report print from them.

The profiles are real: the version-3 fixture (TinyGPT under `torch.compile`, written before
regions were recorded) with its structure marked as the fake-tensor pass marks it now, and an
eager TinyGPT profile with its blocks marked as compiled regions and the statistics of the
calls inside them dropped, as a compiled block's capture has none (`tests/end_to_end/
test_compiled.py` checks the same on compiled models end to end)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import check_table
from models import TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof.capture.model.compiled import mark_regions
from wandb_modprof.records.calls import CallInfo, Structure
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.sinks.report.table_notes import region_note
from wandb_modprof.sinks.text.summary import format_mode_summary
from wandb_modprof.sinks.text.values import mode_values
from wandb_modprof.view.columns import MISSABLE_COLUMNS, WORK_COLUMNS
from wandb_modprof.view.graphs import merge
from wandb_modprof.view.meta import MAX_REGION_ROWS, region_meta
from wandb_modprof.view.regions import regions
from wandb_modprof.view.table import build_table

ROOT = "<root>#0"
V3_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_gpt_compiled.v3.modprof.json"
# what a call inside a region still has: the FLOPs the pass on fake tensors counted
# inside a region only what the structure pass counts: FLOPs and the other work counts
FLOPS_ONLY = set(MISSABLE_COLUMNS) - {"fwd_flops", "fwd_self_flops", *WORK_COLUMNS}


def _marked(data: ProfileData, roots: set[str]) -> ProfileData:
    structures = tuple(
        dataclasses.replace(s, calls=mark_regions(s.calls, roots)) for s in data.structures
    )
    return dataclasses.replace(data, structures=structures)


def _missing(row: dict[str, object]) -> set[str]:
    return set(str(row["missing"]).split(","))


@pytest.fixture(scope="module")
def whole() -> ProfileData:
    return _marked(wandb_modprof.load(V3_FIXTURE).snapshot(), {"<root>"})


@pytest.fixture(scope="module")
def blocks() -> ProfileData:
    """An eager TinyGPT profile whose blocks are marked compiled regions; the statistics of
    the calls inside them dropped (a compiled block is measured at its boundary only)."""
    model = TinyGPT()
    model(gpt_input(2, 16)).float().pow(2).mean().backward()  # its start-up step, untimed
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(gpt_input(2, 16)).float().pow(2).mean().backward()
    data = _marked(prof.snapshot(), {"blocks.0", "blocks.1"})
    inside = {c.key for s in data.structures for c in s.calls if _inside(c)}
    stats = {k: v for k, v in data.stats.items() if k not in inside}
    return dataclasses.replace(data, stats=stats)


def _inside(call: CallInfo) -> bool:
    return call.compiled_region is not None and call.compiled_region != call.key


def test_a_whole_compiled_model_is_one_region_with_every_call_inside(whole: ProfileData) -> None:
    table = build_table(whole)
    check_table(table)
    records = table.resolved()
    (structure,) = whole.structures
    meta = [r for r in records if r["row_kind"] == "meta" and r["meta_key"] == "compiled_region"]
    assert [(r["meta_value"], r["meta_number"]) for r in meta] == [
        (ROOT, float(len(structure.calls) - 1))
    ]
    modules = [r for r in records if r["row_kind"] == "node" and r["node_kind"] == "module"]
    assert len(modules) == len(structure.calls) - 1  # every call inside is drawn
    calls = {c.key: c for c in structure.calls}
    for row in modules:  # ... with its FLOPs, and every other metric missing (a version-3 file
        # has no other work counts: they came with version 6)
        assert _missing(row) == FLOPS_ONLY | set(WORK_COLUMNS), row["node_key"]
        assert row["fwd_flops"] == calls[str(row["node_key"])].fwd_flops
    assert sum(float(r["fwd_flops"]) for r in modules if r["view_key"] == ROOT) > 0
    # the root's own view: its self node holds the region's whole time (no child has any)
    own = next(r for r in records if r["node_key"] == f"{ROOT}|self")
    assert own["fwd_ms"] == whole.stats[ROOT].metrics["fwd_self_ms"].typical > 0
    assert own["fwd_ms"] == whole.stats[ROOT].metrics["fwd_ms"].typical  # all of it


def test_compiled_blocks_are_measured_and_their_insides_say_why_not(blocks: ProfileData) -> None:
    table = build_table(blocks)
    check_table(table)
    records = table.resolved()
    meta = {
        str(r["meta_value"]): r["meta_number"]
        for r in records
        if r["row_kind"] == "meta" and r["meta_key"] == "compiled_region"
    }
    calls = {c.key: c for c in blocks.structures[0].calls}
    for block in ("blocks.0#0", "blocks.1#0"):
        below = [c for c in calls.values() if c.module_name.startswith(block[:-2] + ".")]
        assert meta[block] == float(len(below)) == 9.0
        assert all(calls[c.key].compiled_region == block for c in below)
    assert set(meta) == {"blocks.0#0", "blocks.1#0"}
    nodes = {r["node_key"]: r for r in records if r["row_kind"] == "node"}
    for key, row in nodes.items():
        if row["node_kind"] != "module":
            continue
        if calls[key].compiled_region in (None, key):  # outside, or a region's root: measured
            assert "fwd_ms" not in _missing(row) and row["samples"] == 2, key
        else:
            assert _missing(row) == FLOPS_ONLY, key
    # a view strictly inside a block: its own ops ran fused too (nothing measured but FLOPs)
    attn_self = nodes["blocks.0.attn#0|self"]
    assert "fwd_ms" in _missing(attn_self) and "fwd_self_flops" not in _missing(attn_self)


def test_the_regions_add_meta_rows_only(blocks: ProfileData) -> None:
    """Marked or not, the table is the same but for its `compiled_region` rows: no column,
    no cell of another row changes (W&B's cost is per cell)."""
    plain = dataclasses.replace(
        blocks,
        structures=tuple(
            dataclasses.replace(
                s, calls=tuple(dataclasses.replace(c, compiled_region=None) for c in s.calls)
            )
            for s in blocks.structures
        ),
    )
    marked, unmarked = build_table(blocks), build_table(plain)
    assert marked.columns == unmarked.columns
    extra = [r for r in marked.records() if r["meta_key"] == "compiled_region"]
    assert len(extra) == 2
    others = [r for r in marked.records() if r["meta_key"] != "compiled_region"]
    assert others == unmarked.records()  # (one profile: the same layout and values)


def test_only_the_outermost_region_is_a_region() -> None:
    """A block compiled inside a compiled model is traced into the outer graph: it is no
    region of its own, and the root counts it among the calls inside."""
    data = wandb_modprof.load(V3_FIXTURE).snapshot()
    (structure,) = data.structures
    calls = mark_regions(structure.calls, {"<root>", "blocks.0"})
    assert {c.compiled_region for c in calls} == {ROOT}
    found = regions(merge([dataclasses.replace(structure, calls=calls)]))
    assert [(r.key, r.label, r.inside) for r in found] == [(ROOT, "TinyGPT", len(calls) - 1)]


def _call(key: str, parent: str | None, order: int) -> CallInfo:
    name = key.split("#", maxsplit=1)[0]
    depth = 0 if parent is None else 1
    return CallInfo(key, name, "Linear", 0, parent, depth, order, (), (), 0, 0, True)


def test_region_rows_are_capped() -> None:
    """One block compiled per layer gives a row per layer; past `MAX_REGION_ROWS` the rest
    are left out (the rows come out of the table's budget before any view)."""
    n = MAX_REGION_ROWS + 44
    calls = [_call(ROOT, None, 0), *(_call(f"l{i}#0", ROOT, i + 1) for i in range(n))]
    tree = merge([Structure("s", True, mark_regions(calls, {f"l{i}" for i in range(n)}), ())])
    assert len(regions(tree)) == n
    rows = region_meta(tree)
    assert [r[1] for r in rows] == [f"l{i}#0" for i in range(MAX_REGION_ROWS)]  # forward order
    assert all(r[2] == 0.0 for r in rows)  # leaves: nothing ran inside them


def test_the_summary_and_the_report_name_the_regions(
    blocks: ProfileData, whole: ProfileData
) -> None:
    text = format_mode_summary(mode_values(blocks, "fwd_bwd"), 10)
    for block in ("blocks.0", "blocks.1"):
        line = (
            f"compiled region {block} (torch.compile): measured as one call; "
            "its 9 module calls inside ran fused (FLOPs only)"
        )
        assert line in text.splitlines(), text
    # a whole compiled model: no module has a time, and the summary says why
    text = format_mode_summary(mode_values(whole, "fwd_bwd"), 10)
    assert "no module has a value in mode fwd_bwd" in text
    assert "compiled region TinyGPT (torch.compile): measured as one call" in text
    note = region_note(build_table(blocks))
    assert note.startswith("torch.compile: 2 compiled regions (blocks.0, blocks.1)"), note
    assert "the 18 module calls inside ran fused" in note
    assert region_note(build_table(wandb_modprof.load(V3_FIXTURE).snapshot())) == ""
    prof = wandb_modprof.Profile.from_data(blocks)
    assert "compiled region blocks.1 (torch.compile)" in prof.summary()
