"""The flat table: golden tables for two zoo models, invariants on real and synthetic profiles
(never more than 10,000 rows, never NaN/inf/None where a number is expected), and the
deliberate reduction of large models."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import itertools
import json
import math
import random
import re
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import check_table
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from models import MoEStack, ResNet, TinyGPT, gpt_input, moe_input, resnet_input
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError, ModuleStats, Profile, RunningStat, Structure
from wandb_modprof.records.calls import CallInfo, DataEdge, input_key, output_key
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.view.refs import from_ref, to_ref
from wandb_modprof.view.table import (
    NUMBER_COLUMNS,
    ProfileTable,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
# Columns that hold measured times or values that depend on them: masked in goldens.
MEASURED = {c for c in NUMBER_COLUMNS if "_ms" in c or "flop_per_s" in c or "norm" in c}
MEASURED.add("gc_samples")  # whether a collection lands in a call is up to the interpreter
# from the measured time and the machine's calibrated peaks (the counts beside them are not)
MEASURED |= {"fwd_roofline_pct", "fwd_bound", "bwd_roofline_pct", "bwd_bound"}
MEASURED_META = {"total_fwd_ms", "total_bwd_ms", "total_fwd_bwd_ms", "mem_peak_ms"}
MEASURED_META.add("roofline")
# the checkpoint plan: chosen by the recompute times, so which modules and its text
MEASURED |= {"ckpt_value", "ckpt_state"}
MEASURED_META.add("ckpt_plan")
# The timeline's times (span windows, curve points) are measured; its bytes are not.
TIMELINE_TIMES = ("t0_ms", "t1_ms")


def _profile(model: torch.nn.Module, x: torch.Tensor, steps: int = 3) -> Profile:
    model(x).float().pow(2).mean().backward()  # the model's start-up step, untimed
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            model(x).float().pow(2).mean().backward()
    return prof


def _masked(table: ProfileTable) -> dict[str, object]:
    rows = []
    for record in table.resolved():
        for column in MEASURED:
            if column not in record["missing"].split(",") and record["missing"] != "*":
                record[column] = "<measured>"
        if record["meta_key"] in MEASURED_META:
            record["meta_number"] = "<measured>"
        # a step phase's median (one not measured: missing, its reason as text)
        if str(record["meta_key"]).startswith("phase_") and record["missing"] != "meta_number":
            record["meta_number"] = "<measured>"
        if record["meta_key"] == "ckpt_plan":  # its modules and recompute time, written out
            record["meta_value"] = "<measured>"
        if record["meta_key"] == "roofline":  # the calibrated peaks, written out
            record["meta_value"] = "<measured>"
        if record["row_kind"] in ("span", "mem"):
            for column in TIMELINE_TIMES:
                record[column] = "<measured>"
        rows.append([record[c] for c in table.columns])
    return {"columns": list(table.columns), "rows": rows}


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("resnet", lambda: (ResNet(), resnet_input(2, 16))),
        ("tiny_gpt", lambda: (TinyGPT(), gpt_input(2, 16))),
    ],
)
def test_golden_table(name, make, update_goldens: bool) -> None:
    """Structure, layout, static memory, activations and FLOPs are deterministic; measured
    times are masked. Regenerate with `pytest tests/view/test_table.py --update-goldens`."""
    model, x = make()
    table = _profile(model, x).table()
    check_table(table)
    got = _masked(table)
    path = GOLDEN / f"{name}.table.json"
    if update_goldens:
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    expected = json.loads(path.read_text())
    assert got["columns"] == expected["columns"]
    for i, (g, e) in enumerate(zip(got["rows"], expected["rows"], strict=False)):
        assert g == e, f"row {i} differs: {dict(zip(got['columns'], g, strict=True))}"
    assert len(got["rows"]) == len(expected["rows"])


def test_real_model_table_invariants_and_self_node() -> None:
    prof = _profile(TinyGPT(), gpt_input(2, 16))
    table = prof.table()
    check_table(table)
    records = table.resolved()
    stats = prof.stats()
    block = [r for r in records if r["row_kind"] == "node" and r["view_key"] == "blocks.0#0"]
    own = next(r for r in block if r["node_kind"] == "self")
    # the self node carries the block's own work: its residual adds
    # (its median: the colour statistic, `RunningStat.typical`; the mean beside it)
    assert own["fwd_ms"] == stats["blocks.0#0"].metrics["fwd_self_ms"].median
    assert own["bwd_ms"] == stats["blocks.0#0"].metrics["bwd_self_ms"].median
    assert own["fwd_ms_mean"] == stats["blocks.0#0"].metrics["fwd_self_ms"].mean
    # a view's module nodes plus its self node account for the whole view's forward time, in
    # means (medians do not add up: each can come from a different sample)
    kids = sum(r["fwd_ms_mean"] for r in block if r["node_kind"] == "module")
    whole = stats["blocks.0#0"].metrics["fwd_ms"].mean
    assert kids + own["fwd_ms_mean"] == pytest.approx(whole)
    up = next(r for r in records if r["node_key"] == "blocks.0.mlp.up#0")
    assert up["fwd_flops"] == 2 * 2 * 16 * 64 * 256
    assert up["fwd_flop_per_s"] == pytest.approx(up["fwd_flops"] / (up["fwd_ms"] / 1e3))
    assert up["samples"] == 2


def test_structure_off_still_draws_every_module_without_edges() -> None:
    model = ResNet()
    with wandb_modprof.profile(model, structure=False) as prof:
        model(resnet_input(2, 16)).sum().backward()
    table = prof.table()
    check_table(table)
    records = table.resolved()
    drawn = {r["node_key"] for r in records if r["node_kind"] == "module"}
    assert drawn == set(prof.stats()) - {"<root>#0"}
    assert not [r for r in records if r["row_kind"] == "edge"]
    node = next(r for r in records if r["node_key"] == "fc#0")
    assert "fwd_flops" in node["missing"].split(",")  # unknown, not zero


# ---- synthetic profiles: any size, any shape ---------------------------------------------------
def synthetic(
    fanouts: list[int],
    seed: int = 0,
    edges_per_view: int = 3,
    structured: bool = True,
    root_slots: tuple[int, int] = (1, 1),
) -> Profile:
    """A profile whose call tree has `fanouts[d]` children per call at depth d, with random
    dataflow edges and statistics; the root has `root_slots` inputs and outputs (every other
    call one of each), each input feeding a child and each output fed by one."""
    rng = random.Random(seed)
    calls: list[CallInfo] = []
    stats: dict[str, ModuleStats] = {}
    edges: list[DataEdge] = []

    def add(name: str, parent: str | None, depth: int) -> None:
        key = f"{name}#0"
        kids_n = fanouts[depth] if depth < len(fanouts) else 0
        n_in, n_out = root_slots if parent is None else (1, 1)
        inputs = ("x",) if n_in == 1 else tuple(f"x{i}" for i in range(n_in))
        outputs = ("output",) if n_out == 1 else tuple(f"out{i}" for i in range(n_out))
        calls.append(
            CallInfo(
                key,
                name,
                f"Type{depth}",
                0,
                parent,
                depth,
                len(calls),
                inputs,
                outputs,
                rng.randrange(10**9),
                rng.randrange(10**6),
                True,
            )
        )
        fwd = rng.uniform(0.001, 50.0)
        metrics = {
            m: RunningStat(3, v, v / 10, v / 2, v * 2, v)
            for m, v in {
                "fwd_ms": fwd,
                "fwd_self_ms": fwd / 3,
                "bwd_ms": 2 * fwd,
                "bwd_self_ms": fwd / 2,
                "act_bytes": float(rng.randrange(10**8)),
                "param_bytes": float(rng.randrange(10**7)),
            }.items()
        }
        stats[key] = ModuleStats(key, name, f"Type{depth}", 0, parent, depth, len(stats), metrics)
        kid_keys = []
        for i in range(kids_n):
            kid = f"{name}.{i}" if parent is not None else f"m{i}"
            kid_keys.append(f"{kid}#0")
            add(kid, key, depth + 1)
        ins = [input_key(key, slot) for slot in inputs]
        outs = [output_key(key, slot) for slot in outputs]
        nodes = [*ins, *kid_keys, *outs]
        if kid_keys:
            for i, a in enumerate(ins):
                edges.append(DataEdge(key, a, kid_keys[i % len(kid_keys)]))
            for a, b in itertools.pairwise(kid_keys):
                edges.append(DataEdge(key, a, b))
            for i, b in enumerate(outs):
                edges.append(DataEdge(key, kid_keys[-1 - i % len(kid_keys)], b))
            for _ in range(edges_per_view):
                a, b = sorted(rng.sample(range(len(nodes)), 2))
                edges.append(DataEdge(key, nodes[a], nodes[b]))

    add("<root>", None, 0)
    structure = Structure("sig", True, tuple(calls), tuple(sorted(set(edges), key=str)))
    structures = (structure,) if structured else ()
    return Profile.from_data(ProfileData("Synthetic", 3, stats, None, structures))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fanouts=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    seed=st.integers(0, 1000),
    max_rows=st.sampled_from([100, 300, 2_000]),
    structured=st.booleans(),
    root_slots=st.tuples(st.sampled_from([1, 2, 150]), st.sampled_from([1, 3, 150])),
)
@example(fanouts=[4], seed=0, max_rows=100, structured=True, root_slots=(150, 150))
@example(fanouts=[200, 2], seed=0, max_rows=300, structured=True, root_slots=(2, 150))
def test_any_profile_fits_and_holds_only_finite_numbers(
    fanouts: list[int], seed: int, max_rows: int, structured: bool, root_slots: tuple[int, int]
) -> None:
    prof = synthetic(fanouts, seed, structured=structured, root_slots=root_slots)
    table = prof.table(max_rows=max_rows)
    check_table(table, max_rows)
    invocations = len(prof.stats())
    meta = {r["meta_key"]: r for r in table.resolved() if r["row_kind"] == "meta"}
    drawn = {r["node_key"] for r in table.resolved() if r["node_kind"] == "module"}
    # merged modules; merged inputs and outputs are counted in their own group nodes
    grouped = sum(r["group_count"] for r in table.resolved() if r["node_key"].endswith("|group"))
    if table.reduced:
        # nothing silently lost: what is not drawn is counted in the meta row
        assert len(drawn) + meta["reduced"]["meta_number"] == invocations - 1
        assert grouped <= meta["reduced"]["meta_number"]
    else:
        assert len(drawn) == invocations - 1


def test_twenty_thousand_invocations_keep_every_view_merging_the_cheapest_siblings() -> None:
    """1 + 20 + 400 + 20,000 calls: the 400 deepest views do not fit whole, so each keeps its
    costliest modules and merges the rest into one group node, instead of leaving most of them
    out (as whole depths were before): every call is a node or a named member of a group."""
    prof = synthetic([20, 20, 50])
    table = prof.table()
    check_table(table)
    records = table.resolved()
    views = [r for r in records if r["row_kind"] == "view"]
    assert len(views) == 421
    assert table.reduced.startswith(
        "Every view is drawn, but to stay within 10,000 rows, in 400 views the cheapest modules "
        "are merged into one group node each"
    )
    stats = prof.stats()

    def cost(key: str) -> float:
        return sum(stats[key].metrics[m].mean for m in ("fwd_ms", "bwd_ms"))

    nodes = [r for r in records if r["row_kind"] == "node"]
    drawn = {r["node_key"] for r in nodes if r["node_kind"] == "module"}
    groups = [r for r in nodes if r["node_kind"] == "group"]
    assert len(groups) == 400
    members = [k for g in groups for k in str(g["group_keys"]).split("\n")]
    assert sorted(drawn.union(members)) == sorted(set(stats) - {"<root>#0"})  # every call
    assert not drawn.intersection(members) and len(members) == len(set(members))
    kept = Counter(r["view_key"] for r in nodes if r["node_kind"] == "module")
    for g in groups:
        keys = str(g["group_keys"]).split("\n")
        assert g["group_count"] == len(keys) == 50 - kept[g["view_key"]]
        assert g["fwd_ms"] == pytest.approx(sum(stats[k].metrics["fwd_ms"].mean for k in keys))
        own = [r["node_key"] for r in nodes if r["view_key"] == g["view_key"]]
        own_modules = [k for k in own if k in drawn]
        assert min(cost(k) for k in own_modules) >= max(cost(k) for k in keys)  # cheapest merged
        assert f"`{g['view_key']}` {len(keys)} of 50 (" in table.reduced  # named, with count
    assert len({kept[g["view_key"]] for g in groups}) == 1  # one cap for all the views merged


@pytest.mark.parametrize("max_rows", [2_000])
def test_a_depth_that_cannot_fit_even_merged_is_cut_and_filled_with_the_costliest_views(
    max_rows: int,
) -> None:
    """At 2,000 rows the 400 depth-2 views do not fit even with every module merged: views
    down to depth 1 are drawn, then whole deeper views, the costliest first."""
    prof = synthetic([20, 20, 50])  # 1 + 20 + 400 + 20,000 calls
    table = prof.table(max_rows=max_rows)
    check_table(table, max_rows)
    records = table.resolved()
    views = [r for r in records if r["row_kind"] == "view"]
    deeper = [r for r in views if r["view_depth"] == 2]
    assert sum(1 for r in views if r["view_depth"] <= 1) == 21  # every view to depth 1
    n = len(deeper)
    assert f"{421 - 21 - n} of 421 views are not drawn" in table.reduced
    assert (
        f"every view down to depth 1 is drawn, and the {n} costliest deeper views" in table.reduced
    )
    # the rows the depth cut leaves are used: no depth-2 view left out would still fit
    whole = prof.table(max_rows=1 << 40).resolved()
    sizes = Counter(r["view_key"] for r in whole if r["row_kind"] in ("node", "edge", "view"))
    drawn = {r["view_key"] for r in deeper}
    left_out = [r["view_key"] for r in whole if r["row_kind"] == "view" and r["view_depth"] == 2]
    left_out = [k for k in left_out if k not in drawn]
    assert n > 0 and left_out
    assert max_rows - len(records) < min(sizes[k] for k in left_out)
    # the costliest first: every depth-2 view drawn costs at least as much as any left out
    stats = prof.stats()

    def cost(key: str) -> float:
        return sum(stats[key].metrics[m].mean for m in ("fwd_ms", "bwd_ms"))

    assert min(cost(k) for k in drawn) >= max(cost(k) for k in left_out)
    depth1 = [r for r in records if r["row_kind"] == "node" and r["view_depth"] == 1]
    assert all(r["has_view"] == (r["node_key"] in drawn) for r in depth1)


@pytest.fixture
def _one_thread() -> Iterator[None]:
    # 957 tiny calls: with 2 threads on a shared 2-core machine each op waits for the pool
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("_one_thread")
def test_every_expert_of_a_128_expert_layer_is_in_the_table() -> None:
    """A real MoE (two layers of 128 expert MLPs, top-2 routing, every expert of the first
    layer hit): with room, every expert is its own node; squeezed to 300 rows, each layer's
    view still draws its costliest experts and merges the others into one group node that
    names them, with their count and sums, and the note names each group with count and sum.
    500 rows draw every expert: a layer's experts are a grid whose edges are bundled (3
    edge rows per expert before, `view/blocks.py`), and the reduction counts the rows so."""
    model = MoEStack()
    x = moe_input(model)
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(x).pow(2).mean().backward()
    stats = prof.stats()
    experts = {
        layer: [k for k in stats if re.fullmatch(rf"layers\.{layer}\.experts\.\d+#0", k)]
        for layer in (0, 1)
    }
    assert len(experts[0]) == 128 and experts[1]

    whole = prof.table()
    # the graph views are whole; only the timeline's own budget may have cut curve points
    assert not whole.reduced or whole.reduced.startswith("timeline:"), whole.reduced
    drawn = {r["node_key"] for r in whole.resolved() if r["node_kind"] == "module"}
    assert set(experts[0] + experts[1]) <= drawn

    roomy = prof.table(max_rows=500)
    check_table(roomy, 500)
    drawn = {r["node_key"] for r in roomy.resolved() if r["node_kind"] == "module"}
    assert set(experts[0] + experts[1]) <= drawn
    assert "merged" not in roomy.reduced and len(roomy.rows) <= 500

    # 300 rows: each layer's experts are a grid (bundled edges), the cheapest in its group
    table = prof.table(max_rows=300)
    check_table(table, 300)
    records = table.resolved()
    for layer, keys in experts.items():
        view = f"layers.{layer}#0"
        nodes = [r for r in records if r["row_kind"] == "node" and r["view_key"] == view]
        own = {r["node_key"] for r in nodes if r["node_kind"] == "module"}
        (group,) = [r for r in nodes if r["node_kind"] == "group"]
        merged = str(group["group_keys"]).split("\n")
        assert set(keys) <= own | set(merged) and not own & set(merged)  # every expert found
        assert group["group_count"] == len(merged)
        assert group["fwd_ms"] == pytest.approx(
            sum(stats[k].metrics["fwd_ms"].typical for k in merged)
        )
        assert group["bwd_ms"] == pytest.approx(
            sum(stats[k].metrics["bwd_ms"].typical for k in merged)
        )
        total = sum(1 for r in nodes if r["node_kind"] == "module") + len(merged)
        assert f"`{view}` {len(merged)} of {total} (" in table.reduced


def test_one_huge_flat_view_merges_its_cheapest_modules_into_a_group() -> None:
    prof = synthetic([12_000], edges_per_view=0)
    table = prof.table()
    check_table(table)
    records = table.resolved()
    (group,) = [r for r in records if r["node_kind"] == "group"]
    modules = [r for r in records if r["node_kind"] == "module"]
    assert group["group_count"] + len(modules) == 12_000
    assert "merged into one group node" in table.reduced
    stats = prof.stats()
    cheapest_kept = min(
        stats[r["node_key"]].metrics["fwd_ms"].mean + stats[r["node_key"]].metrics["bwd_ms"].mean
        for r in modules
    )
    grouped_keys = set(stats) - {r["node_key"] for r in modules} - {"<root>#0"}
    assert all(
        stats[k].metrics["fwd_ms"].mean + stats[k].metrics["bwd_ms"].mean <= cheapest_kept
        for k in grouped_keys
    )
    # the group carries the sums of what it merged
    assert group["fwd_ms"] == pytest.approx(
        sum(stats[k].metrics["fwd_ms"].mean for k in grouped_keys)
    )


class _ManyOutputs(nn.Module):
    """A root whose forward returns a dict of `n` tensors, each from its own Linear."""

    def __init__(self, n: int = 120) -> None:
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {f"o{i}": fc(x) for i, fc in enumerate(self.fcs)}


class _ManyInputs(nn.Module):
    """A root taking `n` tensors, each into its own Linear."""

    def __init__(self, n: int = 120) -> None:
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.stack([fc(x) for fc, x in zip(self.fcs, xs, strict=True)]).sum()


# (106: the smallest budget whose reduction still draws more than 32 modules, a grid, beside
# the 29 meta rows of this table, five of them the step's phases)
@pytest.mark.parametrize("max_rows", [106, 150])
@pytest.mark.parametrize("side", ["inputs", "outputs"])
def test_a_view_with_many_inputs_or_outputs_merges_them_into_one_group(
    side: str, max_rows: int
) -> None:
    """Grouping every module still leaves 120 input (output) nodes and 120 edges: too big for
    the limit, so those merge into one group too, and as many modules as then fit are drawn:
    sharing the merged end, they are a grid whose edges are bundled (`view/blocks.py`), so at
    200 rows every one of them is."""
    model = _ManyOutputs() if side == "outputs" else _ManyInputs()
    with wandb_modprof.profile(
        model, settings=wandb_modprof.Settings(warmup=1)
    ) as prof:  # (no start-up note row)
        for _ in range(3):
            if isinstance(model, _ManyOutputs):
                sum(y.sum() for y in model(torch.randn(2, 4)).values()).backward()
            else:
                model(*(torch.randn(2, 4) for _ in range(120))).backward()
    # (no checkpoint plan: its meta row would take one of the rows this test counts)
    table = prof.table(max_rows=max_rows, checkpoint_budget=None)
    check_table(table, max_rows)
    records = table.resolved()
    nodes = {r["node_key"]: r for r in records if r["row_kind"] == "node"}
    merged = nodes[f"<root>#0|{side}"]
    assert (merged["node_kind"], merged["label"]) == ("group", f"120 {side}")
    assert merged["group_count"] == 120 and merged["missing"] == "*"
    assert not [r for r in nodes.values() if r["node_kind"] in ("input", "output")][1:]
    kept = [k for k, r in nodes.items() if r["node_kind"] == "module"]
    group = nodes["<root>#0|group"]
    assert kept and group["group_count"] + len(kept) == 120
    assert table.reduced.startswith(
        f"The top view has 242 nodes; {group['group_count']} of its cheapest modules are "
        f"merged into one group node and its 120 {side} into another, "
    )
    assert f"to stay within {max_rows} rows" in table.reduced
    meta = {r["meta_key"]: r for r in records if r["row_kind"] == "meta"}
    assert meta["reduced"]["meta_number"] == 120 - len(kept)  # calls not drawn
    # every kept module still meets the merged end, itself or through the frame of the grid
    # it is drawn in (more than 32 Linear siblings sharing the merged end: `view/blocks.py`,
    # whose edges are the frame's); merged edges are not doubled
    edges = [(r["src_key"], r["dst_key"]) for r in records if r["row_kind"] == "edge"]
    assert len(edges) == len(set(edges))
    frame_of = {
        m: r["node_key"]
        for r in nodes.values()
        if r["node_kind"] == "block"
        for m in str(r["group_keys"]).split("\n")
    }
    drawn = {frame_of.get(k, k) for k in kept}
    assert set(kept) <= set(frame_of)  # more than 32 kept: all in the grid
    ends = {(merged["node_key"], k) if side == "inputs" else (k, merged["node_key"]) for k in drawn}
    assert ends <= set(edges)
    whole = prof.table(max_rows=200).resolved()
    assert sum(r["node_kind"] == "module" for r in whole) == 120
    assert not [r for r in whole if r["node_kind"] == "group" and r["label"] != f"120 {side}"]


def test_reduction_notes_name_the_actual_row_limit() -> None:
    by_depth = synthetic([40, 20]).table(max_rows=300)
    assert (
        "views are not drawn, to stay within 300 rows: every view down to depth 0"
        in by_depth.reduced
    )
    merged = synthetic([20, 20]).table(max_rows=300)
    assert "Every view is drawn, but to stay within 300 rows, in 20 views" in merged.reduced
    grouped = synthetic([400], edges_per_view=0).table(max_rows=250)
    assert "no other views are drawn, to stay within 250 rows" in grouped.reduced
    assert "10,000" not in by_depth.reduced + merged.reduced + grouped.reduced


# ---- untrusted numbers: a loaded file may hold anything its format allows ----------------------
def _with(stats: ModuleStats, **means: float) -> ModuleStats:
    metrics = dict(stats.metrics)
    for metric, mean in means.items():
        metrics[metric] = dataclasses.replace(metrics[metric], mean=mean)
    return dataclasses.replace(stats, metrics=metrics)


def test_non_finite_values_in_a_loaded_file_are_missing_not_written(tmp_path: Path) -> None:
    """`"nan"` is valid in a saved file's float fields (`"inf"` too, but not for a time: a
    time is NaN or within 10^12 ms); in the table they are 0 and named in `missing`, like
    values never measured (W&B and browsers reject NaN/Infinity)."""
    from wandb_modprof.sinks.file.profile_file import save_profile

    # (version 7's layout: an object per statistic, edited at its path; version 8 loads the same)
    path = save_profile(synthetic([3, 2]).snapshot(), tmp_path / "p.modprof.json", version=7)
    doc = json.loads(path.read_text())
    doc["stats"]["m0#0"]["metrics"]["fwd_ms"]["mean"] = "nan"
    doc["stats"]["m0#0"]["metrics"]["fwd_ms"]["max"] = "nan"
    doc["stats"]["m1#0"]["metrics"]["bwd_ms"]["mean"] = "nan"
    doc["stats"]["<root>#0"]["metrics"]["fwd_ms"]["mean"] = "inf"
    with pytest.raises(ModProfError, match=r'metrics\["fwd_ms"\]\.mean: expected a time within'):
        path.write_text(json.dumps(doc))
        wandb_modprof.load(path)
    doc["stats"]["<root>#0"]["metrics"]["fwd_ms"]["mean"] = "nan"
    doc["stats"]["<root>#0"]["metrics"]["param_bytes"]["mean"] = "nan"
    path.write_text(json.dumps(doc))
    table = wandb_modprof.load(path).table()
    check_table(table)
    records = table.resolved()
    node = {r["node_key"]: r for r in records if r["row_kind"] == "node"}
    m0 = node["m0#0"]
    for column in ("fwd_ms", "fwd_ms_max", "fwd_flop_per_s"):  # no rate from a NaN time
        assert column in m0["missing"].split(",") and m0[column] == 0.0
    assert m0["fwd_ms_min"] > 0 and "fwd_ms_min" not in m0["missing"].split(",")
    assert "bwd_ms" in node["m1#0"]["missing"].split(",")
    # the root's own parameters: NaN total minus its children's is NaN, not max(0, NaN) = 0
    assert "param_bytes" in node["<root>#0|self"]["missing"].split(",")
    meta = {r["meta_key"]: r for r in records if r["row_kind"] == "meta"}
    assert meta["total_fwd_ms"]["missing"] == "meta_number"
    assert meta["total_fwd_ms"]["meta_number"] == 0.0
    assert meta["total_param_bytes"]["missing"] == "meta_number"
    assert meta["total_bwd_ms"]["missing"] == ""


def test_integers_beyond_a_float_are_missing_not_an_overflow() -> None:
    """`float(10**400)` raises OverflowError; such a value (in any int field, or an int in a
    float field) is treated as not measured instead."""
    prof = synthetic([150], edges_per_view=0)
    (structure,) = prof.structures()
    huge = 10**400
    calls = tuple(
        dataclasses.replace(c, fwd_flops=huge, fwd_self_flops=-huge)
        if c.key in ("<root>#0", "m0#0", "m149#0")
        else c
        for c in structure.calls
    )
    stats = prof.stats()
    stats["m0#0"] = _with(stats["m0#0"], fwd_ms=1e6)  # the most expensive: drawn
    stats["m1#0"] = _with(stats["m1#0"], fwd_ms=1e6, act_bytes=huge)
    stats["m149#0"] = _with(stats["m149#0"], fwd_ms=math.nan)  # NaN cost: merged, not kept
    restored = Profile.from_data(
        ProfileData("Huge", huge, stats, None, (dataclasses.replace(structure, calls=calls),))
    )
    table = restored.table(max_rows=100)
    check_table(table, 100)
    records = table.resolved()
    node = {r["node_key"]: r for r in records if r["row_kind"] == "node"}
    assert {"fwd_flops", "fwd_self_flops", "fwd_flop_per_s"} <= set(
        node["m0#0"]["missing"].split(",")
    )
    assert "act_bytes" in node["m1#0"]["missing"].split(",")
    assert "fwd_flops" in node["<root>#0|self"]["missing"].split(",")
    # a group holding a member whose value is not finite has no finite sum for it either
    assert "m149#0" not in node
    assert {"fwd_ms", "fwd_flops"} <= set(node["<root>#0|group"]["missing"].split(","))
    meta = {r["meta_key"]: r for r in records if r["row_kind"] == "meta"}
    for key in ("num_samples", "total_fwd_flops"):
        assert meta[key]["missing"] == "meta_number" and meta[key]["meta_number"] == 0.0


def _call_stats(key: str, parent: str | None, depth: int) -> ModuleStats:
    stat = RunningStat(1, 1.0, 0.0, 1.0, 1.0, 1.0)
    name = key.partition("#")[0]
    return ModuleStats(key, name, "Linear", 0, parent, depth, 0, {"fwd_ms": stat})


@pytest.mark.parametrize(
    "parents",
    [{"inp#0": "inp#0"}, {"a#0": "b#0", "b#0": "a#0"}],
    ids=["self-parent", "two-cycle"],
)
def test_a_parent_cycle_does_not_hang_the_table(parents: dict[str, str]) -> None:
    """`load` rejects such files, but `Profile.from_data` takes what it is given: the view
    numbering stops where the chain of parents repeats instead of looping forever."""
    stats = {"<root>#0": _call_stats("<root>#0", None, 0)}
    stats |= {k: _call_stats(k, p, 1) for k, p in parents.items()}
    prof = Profile.from_data(ProfileData("Cyclic", 1, stats, None, ()))

    def timeout(signum: int, frame: object) -> None:
        raise TimeoutError("table() loops on a parent cycle")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        table = prof.table()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    views = {r["view_key"]: r for r in table.resolved() if r["row_kind"] == "view"}
    assert set(parents) <= set(views)


@given(
    full=st.text(alphabet="=|.~#ab\\", max_size=8),
    view_name=st.text(alphabet="=|.~#ab", max_size=4),
    index=st.integers(0, 2),
)
def test_a_ref_reads_back_as_what_it_stands_for(full: str, view_name: str, index: int) -> None:
    """Any string, names starting with a ref's own marks included (a loaded file may hold
    anything), relative to any view."""
    view_key = f"{view_name}#{index}"
    for s in (full, view_key + full, view_name + full, view_name):
        ref = to_ref(s, view_key, view_name)
        assert from_ref(ref, view_key, view_name) == s, (s, ref)
        assert len(ref) <= len(s) + 1


def test_refs_are_short_in_a_nested_view() -> None:
    assert to_ref("a.b.c#0", "a.b#0", "a.b") == ".c#0"
    assert to_ref("a.b#0|out:y", "a.b#0", "a.b") == "|out:y"
    assert to_ref("a.b", "a.b#0", "a.b") == "="
    assert to_ref("other#1", "a.b#0", "a.b") == "other#1"  # a shared module called from here


@pytest.mark.parametrize("stage", ["columns", "meta", "ranks", "reduce", "refs", "rows", "values"])
def test_docstring_examples(stage: str) -> None:
    result = doctest.testmod(importlib.import_module(f"wandb_modprof.view.{stage}"))
    assert result.attempted > 0 and result.failed == 0


def test_table_rejects_a_bad_row_limit() -> None:
    with pytest.raises(wandb_modprof.ModProfError, match="max_rows must be an int >= 100; got 5"):
        synthetic([2]).table(max_rows=5)


def test_table_goes_through_a_real_wandb_table_unchanged(tmp_path: Path) -> None:
    """Real W&B SDK, offline: the table builds (no mixed column types), logs, and reads back
    equal, with no NaN/Infinity/null in the written JSON."""
    import wandb

    prof = _profile(TinyGPT(), gpt_input(2, 16))
    table = prof.table()
    run = wandb.init(project="modprof-test", dir=str(tmp_path))
    try:
        wb = wandb.Table(columns=list(table.columns), data=[list(r) for r in table.rows])
        run.log({"modprof": wb})
    finally:
        run.finish()
    (written,) = list(tmp_path.rglob("modprof_*.table.json"))
    text = written.read_text()
    for literal in ("NaN", "Infinity", "null"):
        assert literal not in text
    data = json.loads(text)
    assert data["columns"] == list(table.columns)
    assert [tuple(r) for r in data["data"]] == list(table.rows)
