"""One forward + backward gives the complete profile: the module graph derived from the timed
step itself (`capture/structure/step_dataflow`), next to the times, memory, trace and report of that
same step; numerics bitwise unchanged; the structure pass later replaces the derived graph."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import RecordingRun, check_table, disabled_run, ours, recorded_warnings
from models import (
    CustomFunctionModel,
    FrozenStem,
    KwargsDictModel,
    ResNet,
    Reused,
    TinyGPT,
    TwoBranchCat,
    gpt2_from_config,
    gpt_input,
    resnet_input,
)
from torch import nn

import wandb_modprof
from wandb_modprof import Structure
from wandb_modprof.capture.forward.invocation import tensors_in
from wandb_modprof.capture.structure import step_dataflow

Case = tuple[Callable[[], nn.Module], Callable[[], Any]]
ZOO: dict[str, Case] = {
    "resnet": (lambda: ResNet(widths=(8, 16)), lambda: resnet_input(2, 16)),
    "tiny_gpt": (TinyGPT, lambda: gpt_input(2, 16)),
    "reused": (Reused, lambda: torch.randn(4, 32)),
    "kwargs_dict": (KwargsDictModel, lambda: torch.randn(4, 32)),
    "two_branch_cat": (TwoBranchCat, lambda: torch.randn(4, 16)),
    "frozen_stem": (FrozenStem, lambda: torch.randn(4, 32)),
    "custom_function": (CustomFunctionModel, lambda: torch.randn(4, 32)),
}


def gpt2() -> nn.Module:
    return gpt2_from_config(layers=2)


def gpt2_input() -> torch.Tensor:
    return torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))


def loss_of(out: Any) -> torch.Tensor:
    return sum(t.float().pow(2).mean() for t in tensors_in(out) if t.requires_grad)  # type: ignore[return-value]


def views(structure: Structure) -> set[str]:
    return {c.parent_key for c in structure.calls if c.parent_key is not None}


def view_edges(structure: Structure) -> set[tuple[str, str, str]]:
    """Edges of views that are drawn (calls with children); a leaf's in->out is never shown."""
    shown = views(structure)
    return {(e.view_key, e.src_key, e.dst_key) for e in structure.edges if e.view_key in shown}


def derived_then_pass(model: nn.Module, x: Any) -> tuple[Structure, Structure, Any]:
    with wandb_modprof.profile(model) as prof:
        loss_of(model(x)).backward()
        (derived,) = prof.structures()
        loss_of(model(x)).backward()  # the structure pass
        (passed,) = prof.structures()
    return derived, passed, prof


# ---- one step: everything ------------------------------------------------------------------
@pytest.mark.parametrize("name", [*ZOO, "gpt2"])
def test_one_step_gives_times_memory_graph_trace_and_report(name: str, tmp_path: Path) -> None:
    model, make_input = (gpt2, gpt2_input) if name == "gpt2" else ZOO[name]
    torch.manual_seed(0)
    m = model()
    x = make_input()
    with recorded_warnings() as caught, wandb_modprof.profile(m) as prof:
        loss_of(m(x)).backward()
    assert ours(caught) == []
    assert prof.num_samples == 1
    records = prof.invocations()
    called = {r.module_name for r in records}
    own = {
        n or "<root>"
        for n, mod in m.named_modules()
        if next(mod.parameters(recurse=False), None) is not None
    }
    assert own <= called  # every module with parameters was timed
    for rec in records:
        assert rec.fwd_ms is not None and rec.fwd_ms > 0, rec.key
        module = m.get_submodule("" if rec.module_name == "<root>" else rec.module_name)
        if any(p.requires_grad for p in module.parameters(recurse=False)):
            assert rec.bwd_ms is not None and rec.bwd_ms > 0, rec.key
    root = records[0]
    assert root.act_bytes is not None and root.act_bytes > 0
    # the graph: every call, and edges in every view that has more than one child
    (structure,) = prof.structures()
    assert {c.key for c in structure.calls} == {r.key for r in records}
    assert structure.edges
    assert not any(c.flops_known for c in structure.calls)  # FLOPs: not measured, not faked
    table = prof.table()
    check_table(table)
    rows = table.records()
    module_rows = [r for r in rows if r["row_kind"] == "node" and r["node_kind"] == "module"]
    assert module_rows and all("fwd_flops" in r["missing"] for r in module_rows)
    assert any(r["row_kind"] == "edge" for r in rows)
    # the summary names modules, the trace has forward and backward spans, the report renders
    top = prof.top("fwd_ms", 3)
    assert top and top[0].module_name.split(".")[-1] in prof.summary()
    trace = prof.export_chrome_trace(tmp_path / "t.json")
    events = json.loads(Path(trace).read_text())["traceEvents"]
    cats = {e.get("cat") for e in events}
    assert {"wandb_modprof.forward", "wandb_modprof.backward"} <= cats, cats
    prof.to_html(tmp_path / "r.html")
    assert (tmp_path / "r.html").stat().st_size > 10_000


@pytest.mark.parametrize("name", list(ZOO))
def test_derived_edges_are_the_structure_pass_edges(name: str) -> None:
    model, make_input = ZOO[name]
    torch.manual_seed(0)
    derived, passed, prof = derived_then_pass(model(), make_input())
    assert view_edges(derived) == view_edges(passed)
    assert [(c.key, c.inputs, c.outputs, c.parent_key) for c in derived.calls] == [
        (c.key, c.inputs, c.outputs, c.parent_key) for c in passed.calls
    ]
    assert prof.num_samples == 1  # the second forward was the (untimed) pass
    assert all(c.flops_known for c in passed.calls)


def test_gpt2_derived_edges_are_a_subset_of_the_pass() -> None:
    torch.manual_seed(0)
    derived, passed, _ = derived_then_pass(gpt2(), gpt2_input())
    d, p = view_edges(derived), view_edges(passed)
    assert d <= p
    # token ids (no grad) reach the embedding through a view in the model's own code
    assert ("transformer#0", "transformer#0|in:input_ids", "transformer.wte#0") in d
    # The pass also draws c_proj -> output beside c_proj -> resid_dropout -> output (it follows
    # the base of c_proj's view output); everything else agrees.
    assert len(p - d) <= 2 * 2  # per block: attn and mlp
    for view, src, _ in p - d:
        assert src.endswith(".c_proj#0") and view.endswith((".attn#0", ".mlp#0"))


def test_watch_log_freq_1_logs_its_first_step_with_the_graph() -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    run = RecordingRun(disabled_run())
    handle = wandb_modprof.watch(model, log_freq=1, run=run)
    loss_of(model(gpt_input(2, 16))).backward()
    prof = handle.unwatch()
    assert prof.num_samples == 1 and prof.last_sample is not None
    assert prof.last_sample.step == 1
    assert [k for data, _, _ in run.calls for k in data if k == "modprof/TinyGPT"]
    (structure,) = prof.structures()
    assert structure.edges


# ---- numerics, cost, failure -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny_gpt", "resnet", "gpt2"])
def test_numerics_bitwise_unchanged_on_the_derived_step_and_the_next(name: str) -> None:
    model, make_input = (gpt2, gpt2_input) if name == "gpt2" else ZOO[name]

    def train(profiled: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        m = model()
        x = make_input()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        seen: list[torch.Tensor] = []
        block = wandb_modprof.profile(m) if profiled else None
        if block is not None:
            block.__enter__()
        for _ in range(3):  # derived (timed), structure pass, timed
            opt.zero_grad()
            out = m(x)
            loss = loss_of(out)
            loss.backward()
            opt.step()
            seen.append(loss.detach().clone())
            seen.extend(t.detach().clone() for t in tensors_in(out))
        if block is not None:
            block.__exit__(None, None, None)
        seen.extend(p.detach().clone() for p in m.parameters())
        return seen

    plain, watched = train(False), train(True)
    assert len(plain) == len(watched)
    for a, b in zip(plain, watched, strict=True):
        assert torch.equal(a, b)


def test_only_the_first_sample_derives_a_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Later sampled steps pay nothing for it: no dataflow bookkeeping is created."""
    made: list[object] = []
    real = step_dataflow.StepDataflow.__init__

    def counting(self: step_dataflow.StepDataflow, training: bool) -> None:
        made.append(self)
        real(self, training)

    monkeypatch.setattr(step_dataflow.StepDataflow, "__init__", counting)
    model = Reused()
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    for _ in range(6):
        model(torch.randn(2, 32)).sum().backward()
    prof = handle.unwatch()
    assert len(made) == 1
    assert prof.num_samples == 5  # step 2 was the structure pass
    assert all(c.flops_known for c in prof.structures()[0].calls)


def test_a_failing_derivation_warns_once_and_keeps_the_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: object, *args: object) -> Structure:
        raise ValueError("graph exploded")

    monkeypatch.setattr(step_dataflow.StepDataflow, "finish", broken)
    model = TwoBranchCat()
    with recorded_warnings() as caught, wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(torch.randn(2, 16)).sum().backward()
    assert len(ours(caught)) == 1
    assert "graph exploded" in str(ours(caught)[0].message)
    # step 1 timed without a graph; step 2 is the pass (due as before), step 3 timed
    assert prof.num_samples == 2
    (structure,) = prof.structures()
    assert all(c.flops_known for c in structure.calls)


def test_no_grad_forward_gets_the_edges_identity_shows() -> None:
    """Without autograd only tensors passed unchanged between calls are seen; the pass on a
    later step adds what the parent's own ops do (here `torch.cat`)."""
    model = TwoBranchCat().eval()
    with wandb_modprof.profile(model) as prof, torch.no_grad():
        model(torch.randn(2, 16))
        (structure,) = prof.structures()
    edges = {(e.src_key, e.dst_key) for e in structure.edges if e.view_key == "<root>#0"}
    assert ("<root>#0|in:x", "left#0") in edges and ("<root>#0|in:x", "right#0") in edges
    assert ("merge#0", "<root>#0|out:output") in edges
    assert prof.num_samples == 1


def test_no_tensor_is_kept_alive_by_the_derivation() -> None:
    import gc
    import weakref

    model = TinyGPT()
    refs: list[weakref.ref[torch.Tensor]] = []
    with wandb_modprof.profile(model):
        out = model(gpt_input(2, 16))
        refs.append(weakref.ref(out))
        out.float().pow(2).mean().backward()
        del out
    gc.collect()
    assert all(r() is None for r in refs)


def test_one_step_merges_into_a_torch_profiler_trace(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from wandb_modprof.sinks.traces.trace import nesting_errors

    model = ResNet(widths=(8, 16))
    x = resnet_input(2, 16)
    with (
        wandb_modprof.profile(model) as prof,
        torch_profile(activities=[ProfilerActivity.CPU]) as tp,
    ):
        model(x).sum().backward()
    path = prof.export_chrome_trace(tmp_path / "m.json", torch_profiler=tp)
    events = json.loads(path.read_text())["traceEvents"]
    assert nesting_errors(events) == []
    spans = {e["args"]["key"] for e in events if e.get("cat") == "wandb_modprof.backward"}
    assert {r.key for r in prof.invocations() if r.bwd_ms} <= spans


def test_inference_mode_forward_derives_a_graph_without_a_warning() -> None:
    model = TwoBranchCat().eval()
    with (
        recorded_warnings() as caught,
        wandb_modprof.profile(model) as prof,
        torch.inference_mode(),
    ):
        model(torch.randn(2, 16))
    assert ours(caught) == []
    (structure,) = prof.structures()
    edges = {(e.src_key, e.dst_key) for e in structure.edges if e.view_key == "<root>#0"}
    assert ("<root>#0|in:x", "left#0") in edges
    assert prof.num_samples == 1
