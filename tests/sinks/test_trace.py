"""Chrome / Perfetto traces of the last sample: standalone, and merged into torch.profiler's."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from models import ResNet, TinyGPT, gpt_input, resnet_input
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

import wandb_modprof
from wandb_modprof import ModProfError, Profile
from wandb_modprof.sinks.traces.trace import NODE_EVENT_PREFIX, nesting_errors

PAD_MS = 1e-5  # spans are widened by 10 ns per nesting level


def _profiled(model: torch.nn.Module, x: torch.Tensor, *, profiler: bool = False) -> Any:
    torch.set_num_threads(1)
    tp = None
    with wandb_modprof.profile(model) as prof:
        model(x).float().pow(2).mean().backward()  # timed: derives the graph, warms up
        model(x).float().pow(2).mean().backward()  # the structure pass
        if profiler:
            with torch_profile(activities=[ProfilerActivity.CPU]) as tp:
                model(x).float().pow(2).mean().backward()
        else:
            model(x).float().pow(2).mean().backward()
    return prof, tp


def _spans(events: list[dict[str, Any]], cat: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for ev in events:
        if ev.get("cat") == cat:
            out.setdefault(ev["args"]["key"], []).append(ev)
    return out


@pytest.mark.parametrize(
    "make",
    [lambda: (ResNet(), resnet_input(4, 16)), lambda: (TinyGPT(), gpt_input(2, 16))],
    ids=["resnet", "tiny_gpt"],
)
def test_standalone_trace_is_valid_and_matches_the_records(make, tmp_path: Path) -> None:
    model, x = make()
    prof, _ = _profiled(model, x)
    path = prof.export_chrome_trace(tmp_path / "trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    for ev in events:
        assert ev["ph"] in ("X", "M")
        if ev["ph"] == "X":
            assert {"name", "cat", "pid", "tid", "ts", "dur", "args"} <= set(ev)
            assert ev["dur"] >= 0
    assert nesting_errors(events) == []
    sample = prof.last_sample
    records = {r.key: r for r in sample.invocations}
    forward = _spans(events, "wandb_modprof.forward")
    backward = _spans(events, "wandb_modprof.backward")
    assert set(forward) == set(records)
    main = threading.get_native_id()
    for key, rec in records.items():
        (span,) = forward[key]
        assert span["tid"] == main
        assert span["ts"] / 1e3 == pytest.approx(rec.fwd_start_ms, abs=PAD_MS * 20)
        # The span is the wall-clock window (our hooks included), the args the reported time.
        assert rec.fwd_wall_ms is not None and rec.fwd_wall_ms >= rec.fwd_ms
        assert span["dur"] / 1e3 == pytest.approx(rec.fwd_wall_ms, abs=PAD_MS * 40)
        assert span["args"]["fwd_ms"] == rec.fwd_ms
        if not rec.backward_nodes:
            assert key not in backward
            continue
        segs = backward[key]
        assert all(s["tid"] == main for s in segs)  # CPU: autograd runs on the calling thread
        # the segments cover exactly the call's backward: first node start to last node end,
        # and hold at least its node time (the gaps between its nodes are engine overhead)
        start = min(s["ts"] for s in segs) / 1e3
        end = max(s["ts"] + s["dur"] for s in segs) / 1e3
        assert start == pytest.approx(rec.bwd_start_ms, abs=PAD_MS * 20)
        assert end == pytest.approx(rec.bwd_end_ms, abs=PAD_MS * 20)
        total = sum(s["dur"] for s in segs) / 1e3
        assert rec.bwd_ms - 1e-6 <= total <= rec.bwd_span_ms + PAD_MS * 40
    nodes = [ev for ev in events if ev.get("cat") == "wandb_modprof.node"]
    assert len(nodes) == records["<root>#0"].backward_nodes


def test_merged_trace_puts_every_node_event_inside_its_modules_backward(tmp_path: Path) -> None:
    model = ResNet()
    prof, tp = _profiled(model, resnet_input(4, 16), profiler=True)
    path = prof.export_chrome_trace(tmp_path / "merged.json", torch_profiler=tp)
    events = json.loads(path.read_text())["traceEvents"]
    assert nesting_errors(events) == []  # ours and the profiler's, together
    backward = _spans(events, "wandb_modprof.backward")
    node_events = [
        ev
        for ev in events
        if ev.get("ph") == "X" and str(ev.get("name", "")).startswith(NODE_EVENT_PREFIX)
    ]
    checked = 0
    for rec in prof.invocations():
        if not rec.backward_nodes:
            continue
        segs = backward[rec.key]
        for ev in node_events:
            seq = ev["args"].get("Sequence number")
            if not isinstance(seq, int) or not rec.seq_start <= seq < rec.seq_end:
                continue
            inside = [
                s
                for s in segs
                if s["tid"] == ev["tid"]
                and s["ts"] <= ev["ts"]
                and ev["ts"] + ev["dur"] <= s["ts"] + s["dur"]
            ]
            assert inside, (rec.key, ev["name"], seq)
            checked += 1
    assert checked > 50
    # and the module spans carry the profiler's process id, on its clock
    pids = {ev["pid"] for ev in node_events}
    assert {s["pid"] for segs in backward.values() for s in segs} <= pids


def test_backward_on_another_thread_is_drawn_on_that_thread(tmp_path: Path) -> None:
    model = TinyGPT()
    x = gpt_input(2, 16)
    native: list[int] = []

    def backward(loss: torch.Tensor) -> None:
        native.append(threading.get_native_id())
        loss.backward()

    with wandb_modprof.profile(model) as prof:
        for _ in range(3):  # timed, structure pass, timed
            t = threading.Thread(target=backward, args=(model(x).sum(),))
            t.start()
            t.join()
    events = json.loads(prof.export_chrome_trace(tmp_path / "t.json").read_text())["traceEvents"]
    assert nesting_errors(events) == []
    backward_tids = {ev["tid"] for ev in events if ev.get("cat") == "wandb_modprof.backward"}
    forward_tids = {ev["tid"] for ev in events if ev.get("cat") == "wandb_modprof.forward"}
    assert backward_tids == {native[-1]}
    assert forward_tids == {threading.get_native_id()}


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpointed_model_trace_is_valid(mode: str, tmp_path: Path) -> None:
    prof, tp = _profiled(TinyGPT(checkpointing=mode), gpt_input(2, 16), profiler=True)
    for kw in ({}, {"torch_profiler": tp}):
        events = json.loads(prof.export_chrome_trace(tmp_path / "t.json", **kw).read_text())
        assert nesting_errors(events["traceEvents"]) == []
    standalone = json.loads(prof.export_chrome_trace(tmp_path / "s.json").read_text())
    cats = {ev.get("cat") for ev in standalone["traceEvents"]}
    assert "wandb_modprof.recompute" in cats


def test_a_loaded_profile_exports_the_same_trace(tmp_path: Path) -> None:
    prof, _ = _profiled(ResNet(), resnet_input(2, 16))
    a = prof.export_chrome_trace(tmp_path / "a.json").read_text()
    loaded = wandb_modprof.load(prof.save(tmp_path / "p.modprof.json"))
    assert loaded.export_chrome_trace(tmp_path / "b.json").read_text() == a


def test_trace_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ModProfError, match="needs a sample"):
        Profile("M").export_chrome_trace(tmp_path / "x.json")
    prof, _ = _profiled(ResNet(), resnet_input(2, 16))
    with torch_profile(activities=[ProfilerActivity.CPU]) as other:
        torch.randn(3).sum()
    with pytest.raises(ModProfError, match="none of the sampled step's backward nodes"):
        prof.export_chrome_trace(tmp_path / "x.json", torch_profiler=other)
    with pytest.raises(ModProfError, match="torch_profiler must be"):
        prof.export_chrome_trace(tmp_path / "x.json", torch_profiler=42)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ModProfError, match="is not a Chrome trace"):
        prof.export_chrome_trace(tmp_path / "x.json", torch_profiler=bad)
    with pytest.raises(ModProfError, match="cannot write the trace"):
        prof.export_chrome_trace(tmp_path / "missing" / "x.json")


def _merged(tmp_path: Path, model: torch.nn.Module, step: Any, **profiler_kw: Any) -> Any:
    torch.set_num_threads(1)
    with wandb_modprof.profile(model) as prof:
        step()  # timed: derives the graph, warms up
        step()  # the structure pass
        with torch_profile(activities=[ProfilerActivity.CPU], **profiler_kw) as tp:
            step()
    path = prof.export_chrome_trace(tmp_path / "m.json", torch_profiler=tp)
    return prof, json.loads(path.read_text())["traceEvents"]


def _inside_own_spans(prof: Profile, events: list[dict[str, Any]]) -> int:
    """How many node events lie inside the backward spans of the innermost call owning them."""
    backward = _spans(events, "wandb_modprof.backward")
    recs = sorted(prof.invocations(), key=lambda r: -r.depth)  # innermost first
    inside = 0
    for ev in events:
        if not str(ev.get("name", "")).startswith(NODE_EVENT_PREFIX):
            continue
        seq = ev["args"].get("Sequence number")
        owner = next(
            (r for r in recs if isinstance(seq, int) and r.seq_start <= seq < r.seq_end), None
        )
        if owner is None:
            continue
        spans = backward.get(owner.key, [])
        if any(s["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= s["ts"] + s["dur"] for s in spans):
            inside += 1
    return inside


def test_merge_picks_the_sampled_backward_when_the_graph_runs_twice(tmp_path: Path) -> None:
    model = ResNet()
    x = resnet_input(2, 16)

    def step() -> None:
        loss = model(x).pow(2).mean()
        loss.backward(retain_graph=True)  # the sampled backward
        loss.backward()  # the same nodes (same sequence numbers) once more

    prof, events = _merged(tmp_path, model, step)
    assert nesting_errors(events) == []
    nodes = sum(1 for r in prof.last_sample.runs if r.kind == "node" and r.seq >= 0)
    # each node ran twice; exactly one execution sits inside the spans: the first, sampled one
    assert _inside_own_spans(prof, events) == nodes
    first_backward_end = max(
        ev["ts"] + ev["dur"]
        for ev in events
        if ev.get("cat") == "wandb_modprof.backward" and ev["args"]["key"] == "<root>#0"
    )
    runs = {}
    for ev in events:
        if str(ev.get("name", "")).startswith(NODE_EVENT_PREFIX):
            runs.setdefault((ev["args"].get("Sequence number"), ev["name"]), []).append(ev["ts"])
    twice = [sorted(ts) for ts in runs.values() if len(ts) == 2]
    assert len(twice) >= nodes - 2  # (AccumulateGrad events carry no sequence number)
    assert all(first < first_backward_end < second for first, second in twice)


def test_merged_forward_spans_with_python_stacks_stay_nested(tmp_path: Path) -> None:
    model = TinyGPT()
    x = gpt_input(2, 16)
    prof, events = _merged(tmp_path, model, lambda: model(x).sum().backward(), with_stack=True)
    assert nesting_errors(events) == []
    forward = [ev for ev in events if ev.get("cat") == "wandb_modprof.forward"]
    assert len(forward) == len(prof.invocations())
    assert {ev["tid"] for ev in forward} != {threading.get_native_id()}  # a track of their own
    names = [ev for ev in events if ev.get("name") == "thread_name"]
    assert any("wandb_modprof modules" in ev["args"]["name"] for ev in names)


def test_gzip_trace_file_and_unfinished_profiler(tmp_path: Path) -> None:
    import gzip

    model = ResNet()
    x = resnet_input(2, 16)
    torch.set_num_threads(1)
    with wandb_modprof.profile(model) as prof:
        model(x).sum().backward()  # timed: derives the graph
        model(x).sum().backward()  # the structure pass
        with torch_profile(activities=[ProfilerActivity.CPU]) as tp:
            model(x).sum().backward()
    plain = tmp_path / "p.json"
    tp.export_chrome_trace(str(plain))
    packed = tmp_path / "p.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a = prof.export_chrome_trace(tmp_path / "a.json", torch_profiler=plain).read_text()
    b = prof.export_chrome_trace(tmp_path / "b.json", torch_profiler=packed).read_text()
    assert a == b
    running = torch_profile(activities=[ProfilerActivity.CPU])
    with pytest.raises(ModProfError, match=r"must be a finished torch\.profiler\.profile"):
        prof.export_chrome_trace(tmp_path / "c.json", torch_profiler=running)
