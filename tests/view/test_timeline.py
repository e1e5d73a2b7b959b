"""The timeline rows (`view/timeline.py`): spans per view read back against the recorded
sample, the curve against `Sample.memory`, and the budget on synthetic samples too big for it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import check_table
from models import ResNet, gpt2_from_config, resnet_input

import wandb_modprof
from wandb_modprof.records.graph import GraphNode, ViewGraph
from wandb_modprof.records.sample import BackwardRun, MemoryCurve
from wandb_modprof.view.call_times import running_at
from wandb_modprof.view.spans import SPANS_PER_VIEW
from wandb_modprof.view.timeline import CURVE_POINTS, build_timeline


@pytest.fixture(scope="module")
def resnet_prof():
    model = ResNet()
    x = resnet_input(2, 16)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(x).sum().backward()
    return prof


def _subtree(sample, key):
    """Keys of `key` and its descendants in the sample."""
    parent = {r.key: r.parent_key for r in sample.invocations}
    out = set()
    for k in parent:
        up = k
        while up is not None and up != key:
            up = parent[up]
        if up == key:
            out.add(k)
    return out


def test_spans_are_the_recorded_windows_and_runs(resnet_prof):
    table = resnet_prof.table()
    check_table(table)
    sample = resnet_prof.last_sample
    inv = {r.key: r for r in sample.invocations}
    records = table.resolved()
    spans = [r for r in records if r["row_kind"] == "span"]
    assert spans
    for r in spans:
        rec = inv[r["node_key"]]
        if r["span_phase"] == "fwd":
            assert r["t0_ms"] == rec.fwd_start_ms
            assert r["t1_ms"] == pytest.approx(rec.fwd_start_ms + rec.fwd_wall_ms)
    # every backward run of a call's subtree is in exactly one of its backward spans, and
    # within the subtree's first and last run
    for key in {r["node_key"] for r in spans}:
        mine = [r for r in spans if r["node_key"] == key and r["span_phase"] == "bwd"]
        runs = [run for run in sample.runs if run.owner_key in _subtree(sample, key)]
        assert sum(r["group_count"] for r in mine) == len(runs), key
        if runs:
            assert min(r["t0_ms"] for r in mine) == min(run.start_ms for run in runs)
            assert max(r["t1_ms"] for r in mine) == max(run.end_ms for run in runs)
            for run in runs:
                assert any(r["t0_ms"] <= run.start_ms <= run.end_ms <= r["t1_ms"] for r in mine)


def test_curve_rows_are_the_sample_curve(resnet_prof):
    table = resnet_prof.table()
    records = table.records()
    curve = resnet_prof.last_sample.memory
    mem = [(r["t0_ms"], r["live_bytes"]) for r in records if r["row_kind"] == "mem"]
    assert len(curve.t_ms) <= CURVE_POINTS  # small enough: kept whole
    assert mem == [(t, float(b)) for t, b in zip(curve.t_ms, curve.live_bytes, strict=True)]
    meta = {r["meta_key"]: r for r in records if r["row_kind"] == "meta"}
    assert meta["timeline"]["meta_value"] == "saved"
    assert meta["timeline"]["meta_number"] == resnet_prof.last_sample.step
    top = max(curve.live_bytes)
    assert meta["mem_peak"]["meta_number"] == top
    at = curve.t_ms[curve.live_bytes.index(top)]
    assert meta["mem_peak_ms"]["meta_number"] == at
    key, phase = running_at(resnet_prof.last_sample, at)
    assert meta["mem_peak"]["meta_value"] == key != ""
    assert meta["mem_peak_ms"]["meta_value"] == phase in ("forward", "backward")


def test_the_named_peak_call_was_running_then():
    model = gpt2_from_config(layers=2)
    ids = torch.randint(0, 512, (2, 32))
    with wandb_modprof.profile(model, structure=False) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    sample = prof.last_sample
    curve = sample.memory
    at = curve.t_ms[curve.live_bytes.index(max(curve.live_bytes))]
    key, phase = running_at(sample, at)
    rec = next(r for r in sample.invocations if r.key == key)
    if phase == "forward":
        assert rec.fwd_start_ms <= at <= rec.fwd_start_ms + rec.fwd_wall_ms
        # and no deeper call's window holds it
        assert not any(
            r.depth > rec.depth and r.fwd_start_ms <= at <= r.fwd_start_ms + r.fwd_wall_ms
            for r in sample.invocations
        )
    else:
        assert any(run.owner_key == key and run.start_ms <= at <= run.end_ms for run in sample.runs)


def _big(sample, runs_per_call: int, points: int):
    """`sample` with every call's backward split into many interleaved runs and a long
    curve: more than the timeline's budget."""
    keys = [r.key for r in sample.invocations if r.parent_key == sample.invocations[0].key]
    runs = []
    t = 100.0
    for i in range(runs_per_call):
        for key in keys:  # interleaved: no two consecutive runs of one call
            runs.append(BackwardRun("node", "X", i, key, t, t + 0.5, 1))
            t += 1.0
    t_ms = tuple(float(i) for i in range(points))
    live = tuple((i * 7919) % 1000 for i in range(points))
    live = (*live[: points // 2], 5000, *live[points // 2 + 1 :])  # one clear peak
    return dataclasses.replace(sample, runs=tuple(runs), memory=MemoryCurve("saved", t_ms, live))


def test_budget_merges_spans_and_keeps_the_peak(resnet_prof):
    data = resnet_prof.snapshot()
    sample = _big(data.last, runs_per_call=400, points=20_000)
    root = sample.invocations[0].key
    children = [r for r in sample.invocations if r.parent_key == root]
    nodes = tuple(GraphNode(r.key, "module", r.key, r.module_type) for r in children)
    graph = ViewGraph(root, nodes, ())
    timeline = build_timeline(sample, [graph], {}, budget=3000)
    assert len(timeline.curve) <= CURVE_POINTS
    assert (float(sample.memory.t_ms[10_000]), 5000) in timeline.curve  # the peak, exactly
    assert len(timeline.spans) <= SPANS_PER_VIEW
    assert sum(s[5] for s in timeline.spans if s[2] == "bwd") == len(sample.runs)
    assert "memory curve: " in timeline.note and "merged to at most 500" in timeline.note
    # the whole table: still within its cap, and says what was reduced
    big = dataclasses.replace(data, last=sample)
    from wandb_modprof.view.table import build_table

    for max_rows in (10_000, 600):
        table = build_table(big, max_rows=max_rows)
        check_table(table, max_rows)
        assert "timeline: " in table.reduced


def test_a_view_of_more_nodes_than_the_span_cap_keeps_one_span_per_node_and_phase():
    """600 sibling modules: more nodes than `SPANS_PER_VIEW`, so merging each node's spans
    cannot reach the cap. The table is built (it hung: the merge gap doubled forever), each
    node keeps one forward and one backward span, and nothing of the step is lost."""
    from torch import nn

    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(600)])
    x = torch.randn(1, 2)
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(x).sum().backward()
    data = prof.snapshot()
    root = data.last.invocations[0].key
    children = [r for r in data.last.invocations if r.parent_key == root]
    assert len(children) > SPANS_PER_VIEW
    # every run 4 times, so merging has work to do before it meets the node count
    runs = tuple(r for r in data.last.runs for _ in range(4))
    sample = dataclasses.replace(data.last, runs=runs)
    nodes = tuple(GraphNode(r.key, "module", r.key, r.module_type) for r in children)
    timeline = build_timeline(sample, [ViewGraph(root, nodes, ())], {}, budget=3000)
    per_node: dict[tuple[str, str], int] = {}
    for span in timeline.spans:
        per_node[(span[1], span[2])] = per_node.get((span[1], span[2]), 0) + 1
    assert len(timeline.spans) == len(per_node) == 2 * len(children)
    assert set(per_node.values()) == {1}
    assert sum(s[5] for s in timeline.spans if s[2] == "bwd") == len(runs)
    table = prof.table()
    check_table(table, 10_000)
    assert sum(r[0] == "span" for r in table.rows) > 0


def test_a_run_without_a_finite_end_draws_no_span_and_leaves_every_cell_finite(resnet_prof):
    """A loaded file may hold a run ending at "nan" (the file's rules let NaN times through):
    the table's cells stay finite (the HTML report embeds them as strict JSON), and the other
    spans are drawn as before."""
    import math

    from wandb_modprof.view.table import build_table

    data = resnet_prof.snapshot()
    runs = list(data.last.runs)
    runs[0] = dataclasses.replace(runs[0], end_ms=math.nan)
    broken = dataclasses.replace(data, last=dataclasses.replace(data.last, runs=tuple(runs)))
    table = build_table(broken)
    check_table(table)
    numbers = [v for row in table.rows for v in row if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers)
    spans = [r for r in table.records() if r["row_kind"] == "span"]
    whole = [r for r in build_table(data).records() if r["row_kind"] == "span"]
    assert spans and 0 < len(whole) - len(spans) < 4, (len(whole), len(spans))
