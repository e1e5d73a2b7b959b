"""torch.compile'd models under `watch` (issue 16): the matrix {whole-model `torch.compile`,
`Module.compile()`, per-block compile} x {inductor, aot_eager} on the zoo's transformer and
ResNet (tiny sizes: compiling on CPU is the cost here).

Each case compiles one model once (module-scoped) and trains it twice from the same state,
unwatched and watched, through the same compiled code: every step's loss, gradients and
buffers are bitwise equal (the structure step included), Dynamo compiles nothing more and
breaks no graph while we watch (`error_on_recompile`, `counters`), warns nothing, and the
profile is named and drawn after the user's model. One torch thread: inductor's CPU kernels
for an embedding's backward accumulate in a thread-dependent order, so with several threads
even two unwatched runs differ.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch
from helpers import disabled_run, hook_counts
from models import ResNet, TinyGPT
from torch import nn

import wandb_modprof
from wandb_modprof import Profile

STEPS = 4  # log_freq=2: step 1 draws the graph (beside the step), 2 and 4 are sampled


def _tiny_gpt() -> tuple[nn.Module, torch.Tensor, str]:
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, dim=32, heads=2, layers=2, ctx=16)
    return model, torch.randint(0, 64, (2, 16)), "blocks"


def _tiny_resnet() -> tuple[nn.Module, torch.Tensor, str]:
    torch.manual_seed(0)
    # (widths (4, 8) on 8x8 inputs: inductor's CPU convolution_backward segfaults under one thread,
    # torch 2.13; unwatched too)
    return ResNet(widths=(8, 16), num_classes=4, blocks=1), torch.randn(2, 3, 16, 16), "layers"


def _compile(model: nn.Module, style: str, backend: str) -> tuple[nn.Module, list[str]]:
    """The model as the user would train it, and the names of its compiled blocks."""
    if style == "whole":
        return torch.compile(model, backend=backend), []
    if style == "method":
        model.compile(backend=backend)
        return model, []
    blocks: list[str] = []
    if isinstance(model, TinyGPT):  # `for b in model.blocks: b.compile()`
        for i, block in enumerate(model.blocks):
            block.compile(backend=backend)
            blocks.append(f"blocks.{i}")
    else:  # torchtitan's style: the block replaced by its `torch.compile` wrapper
        for stage in ("layer1", "layer2"):
            seq = getattr(model, stage)
            for i in range(len(seq)):
                seq[i] = torch.compile(seq[i], backend=backend)
                blocks.append(f"{stage}.{i}")
    return model, blocks


def _train(model: nn.Module, x: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Every step's loss, gradients and buffers (copies)."""
    out: list[torch.Tensor] = []
    for _ in range(steps):
        loss = model(x).float().pow(2).mean()
        loss.backward()
        out.append(loss.detach().clone())
        out.extend(p.grad.clone() for p in model.parameters() if p.grad is not None)
        out.extend(b.clone() for b in model.buffers())
        model.zero_grad(set_to_none=True)
    return out


@dataclass
class Case:
    model_name: str
    style: str
    backend: str
    blocks: list[str]
    reference: list[torch.Tensor]
    watched: list[torch.Tensor]
    prof: Profile
    key: str
    frames_before: int
    frames_after: int
    graph_breaks: int
    recompiles: int
    dynamo_warnings: list[str]
    hooks_left: int


_MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor, str]]] = {
    "TinyGPT": _tiny_gpt,
    "ResNet": _tiny_resnet,
}
_SLOW = pytest.mark.compile_slow
_PARAMS = [
    pytest.param((m, s, b), id=f"{m}-{s}-{b}", marks=[_SLOW] if b == "inductor" else [])
    for m in _MODELS
    for s in ("whole", "method", "blocks")
    for b in ("aot_eager", "inductor")
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=_PARAMS)
def case(request: pytest.FixtureRequest) -> Case:
    import torch._dynamo
    from torch._dynamo.utils import counters

    model_name, style, backend = request.param
    torch._dynamo.reset()
    eager, x, _ = _MODELS[model_name]()
    model, blocks = _compile(eager, style, backend)
    start = copy.deepcopy(model.state_dict())
    _train(model, x, 1)  # compiled outside any measurement
    model.load_state_dict(start)  # in place: the compiled code is the same
    reference = _train(model, x, STEPS)
    model.load_state_dict(start)
    counters.clear()
    frames_before = int(counters["stats"]["unique_graphs"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
        with torch._dynamo.config.patch(error_on_recompile=True):
            watched = _train(model, x, STEPS)
        prof = handle.unwatch()
    return Case(
        model_name=model_name,
        style=style,
        backend=backend,
        blocks=blocks,
        reference=reference,
        watched=watched,
        prof=prof,
        key=handle.key,
        frames_before=frames_before,
        frames_after=int(counters["stats"]["unique_graphs"]),
        graph_breaks=sum(counters["graph_break"].values()),
        recompiles=int(counters["recompiles"].get("total", 0)) if "recompiles" in counters else 0,
        dynamo_warnings=[str(w.message) for w in caught],
        hooks_left=sum(hook_counts(model).values()),
    )


def test_every_step_is_bitwise_the_unwatched_compiled_step(case: Case) -> None:
    assert len(case.watched) == len(case.reference)
    for i, (got, want) in enumerate(zip(case.watched, case.reference, strict=True)):
        assert torch.equal(got, want), (case.style, case.backend, i)


def test_no_recompiles_graph_breaks_or_warnings(case: Case) -> None:
    assert case.frames_after == case.frames_before == 0  # nothing compiled while watched
    assert case.graph_breaks == 0
    assert case.recompiles == 0
    assert case.dynamo_warnings == []  # ours or Dynamo's
    assert case.hooks_left == 0


def test_named_after_the_users_model_with_its_graph(case: Case) -> None:
    assert case.key == f"modprof/{case.model_name}"
    prof = case.prof
    assert prof.num_samples == 2
    (structure,) = prof.structures()
    calls = {c.key: c for c in structure.calls}
    assert calls["<root>#0"].module_type == case.model_name
    assert not any("_orig_mod" in key for key in calls)
    assert calls["<root>#0"].flops_known and calls["<root>#0"].fwd_flops > 0  # fake pass
    table = prof.table().resolved()
    nodes = [r for r in table if r["row_kind"] == "node" and r["node_kind"] == "module"]
    root_view = [r for r in nodes if r["view_key"] == "<root>#0"]
    assert len(root_view) >= 4  # the user's top-level modules, drawn
    inner = "blocks.0.attn#0" if case.model_name == "TinyGPT" else "layer1.0.conv1#0"
    assert inner in {r["node_key"] for r in nodes}  # inside a compiled region, drawn
    assert all("_orig_mod" not in r["node_key"] for r in nodes)


def test_compiled_regions_are_measured_at_their_boundaries(case: Case) -> None:
    stats = case.prof.stats()
    measured = {k for k, s in stats.items() if s.metrics["fwd_ms"].count == 2}
    if case.style in ("whole", "method"):
        assert measured == {"<root>#0"}  # one compiled region: the whole model
    else:
        assert {f"{b}#0" for b in case.blocks} <= measured  # each block, per block
        for block in case.blocks:
            record = stats[f"{block}#0"]
            assert record.metrics["bwd_ms"].mean > 0
            assert record.metrics["act_bytes"].mean > 0  # saved inside the compiled block
            assert record.metrics["param_bytes"].last > 0
            assert record.metrics["grad_bytes"].last > 0
        inside = f"{case.blocks[0]}.conv1#0" if case.model_name == "ResNet" else "blocks.0.ln1#0"
        assert inside not in stats  # fused by the compiler: not measured on its own
    root = stats["<root>#0"]
    assert root.metrics["fwd_ms"].mean > 0 and root.metrics["bwd_ms"].mean > 0
    assert root.metrics["act_bytes"].mean > 0
    assert root.metrics["grad_bytes"].last > 0


# ---- outside the matrix: a profile block, and a forward fake tensors cannot run ----------------
def _fresh_compiled(backend: str = "aot_eager") -> tuple[nn.Module, nn.Module, torch.Tensor]:
    import torch._dynamo

    torch._dynamo.reset()
    eager, x, _ = _tiny_gpt()
    return eager, torch.compile(eager, backend=backend), x


def test_profile_block_of_a_compiled_model() -> None:
    eager, model, x = _fresh_compiled()
    start = copy.deepcopy(eager.state_dict())
    reference = _train(model, x, 2)
    eager.load_state_dict(start)
    with wandb_modprof.profile(model) as prof:
        got = _train(model, x, 2)
    assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
    assert prof.num_samples == 2  # both forwards timed: the graph came from fake tensors
    (structure,) = prof.structures()
    assert "blocks.1.mlp.down#0" in {c.key for c in structure.calls}
    assert {c.compiled_region for c in structure.calls} == {"<root>#0"}
    assert prof.model_name == "TinyGPT"


class ValueBranch(nn.Module):
    """Python control flow on a tensor's value: fake tensors have none."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if float(h.sum()) > 1e9:  # (never true: the branch only needs the value)
            h = h * 2
        return self.b(h)


# torch's own warning about ValueBranch's `float(h.sum())` on a tensor that requires grad
@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar")
def test_forward_that_fake_tensors_cannot_run_warns_and_trains_on() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = ValueBranch()
    model = torch.compile(eager, backend="aot_eager")
    x = torch.randn(4, 8)
    start = copy.deepcopy(eager.state_dict())
    reference = _train(model, x, 3)
    eager.load_state_dict(start)
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    with pytest.warns(RuntimeWarning, match="could not be traced"):
        got = _train(model, x, 3)
    prof = handle.unwatch()
    assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
    assert prof.num_samples == 3
    assert prof.structures() == []  # no graph, and no eager pass instead
    # (trained above without an optimizer, gradients cleared to None: nothing tells that its
    # first watched step is not its first, so that sample is left out as start-up)
    assert prof.snapshot().cold_left_out == 1
    assert prof.stats()["<root>#0"].metrics["fwd_ms"].count == 2


def test_ddp_of_a_compiled_model(tmp_path) -> None:
    """`DDP(torch.compile(model))` (one process, gloo): the root is DDP, the graph is the
    model's inside it, traced on fake tensors (DDP's forward would communicate)."""
    import torch._dynamo
    import torch.distributed as dist

    eager, model, x = _fresh_compiled()
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        start = copy.deepcopy(eager.state_dict())
        _train(ddp, x, 1)
        eager.load_state_dict(start)
        reference = _train(ddp, x, STEPS)
        eager.load_state_dict(start)
        handle = wandb_modprof.watch(ddp, log_freq=2, run=disabled_run())
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = _train(ddp, x, STEPS)
        prof = handle.unwatch()
    finally:
        dist.destroy_process_group()
    assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
    assert handle.key == "modprof/TinyGPT"
    (structure,) = prof.structures()
    assert "blocks.0.attn.qkv#0" in {c.key for c in structure.calls}
    assert set(prof.stats()) == {"<root>#0"}
    assert {c.compiled_region for c in structure.calls} == {"<root>#0"}  # DDP's inner model


class PlainCounter(nn.Module):
    """A tensor counter held as a plain attribute (neither parameter nor buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 1)
        self.calls = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x)


def test_the_fake_pass_never_writes_a_real_tensor() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    eager = PlainCounter()
    model = torch.compile(eager, backend="aot_eager")
    x = torch.randn(4, 8)
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    with pytest.warns(RuntimeWarning, match="real tensor"):
        _train(model, x, 3)  # the pass refuses the op on a real tensor before it runs
    prof = handle.unwatch()
    assert float(eager.calls) == 3  # the user's three steps, not one more from the pass
    assert prof.num_samples == 3 and prof.structures() == []


@pytest.mark.parametrize(
    "backend", ["aot_eager", pytest.param("inductor", marks=_SLOW)], ids=lambda b: b
)
def test_watching_the_model_inside_a_compile_wrapper(backend: str) -> None:
    """`compiled = torch.compile(model); watch(model)`; training calls `compiled`: the
    wrapper runs the model's hooks under Dynamo. Ours run untraced and hook nothing inside."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    eager, model, x = _fresh_compiled(backend)
    start = copy.deepcopy(eager.state_dict())
    _train(model, x, 1)
    eager.load_state_dict(start)
    reference = _train(model, x, STEPS)
    eager.load_state_dict(start)
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = wandb_modprof.watch(eager, log_freq=2, run=disabled_run())
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = _train(model, x, STEPS)
        prof = handle.unwatch()
    assert [str(w.message) for w in caught] == []
    assert sum(counters["graph_break"].values()) == 0
    assert int(counters["stats"]["unique_graphs"]) == 0
    assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
    assert prof.num_samples == 2
    assert set(prof.stats()) == {"<root>#0"}  # the whole model runs compiled: one region
    (structure,) = prof.structures()
    assert "blocks.0.mlp.up#0" in {c.key for c in structure.calls}
    # the wrapper we never see makes the root one compiled region (`under_compile`)
    assert {c.compiled_region for c in structure.calls} == {"<root>#0"}
    assert sum(hook_counts(eager).values()) == 0


def test_the_table_says_which_nodes_ran_fused(case: Case, tmp_path) -> None:
    """Issue 16 item 3: the structure records the compiled regions, the table carries one
    `compiled_region` meta row per region, and every module node inside one has its FLOPs
    only; the profile file keeps the regions (version 4), the summary names them."""
    (structure,) = case.prof.structures()
    calls = {c.key: c for c in structure.calls}
    roots = {f"{b}#0" for b in case.blocks} if case.style == "blocks" else {"<root>#0"}
    assert {k for k, c in calls.items() if c.compiled_region == k} == roots
    stats = case.prof.stats()
    for key, call in calls.items():
        if call.compiled_region is None:
            assert case.style == "blocks" and key in stats  # outside: measured as always
        elif call.compiled_region != key:
            assert call.compiled_region in roots and key not in stats  # fused: not measured
    records = case.prof.table().resolved()
    meta = {
        r["meta_value"]: r["meta_number"]
        for r in records
        if r["row_kind"] == "meta" and r["meta_key"] == "compiled_region"
    }
    assert set(meta) == roots
    for root in roots:
        inside = sum(1 for c in calls.values() if c.compiled_region == root and c.key != root)
        assert meta[root] == inside > 0
    flops_only = {"fwd_flops", "fwd_self_flops"}
    for row in records:
        if row["row_kind"] != "node" or row["node_kind"] != "module":
            continue
        call = calls[row["node_key"]]
        measured = {"fwd_ms", "bwd_ms", "act_bytes"} - set(row["missing"].split(","))
        if call.compiled_region not in (None, call.key):
            assert measured == set() and not flops_only & set(row["missing"].split(","))
        else:
            assert measured == {"fwd_ms", "bwd_ms", "act_bytes"}, row["node_key"]
    back = wandb_modprof.load(case.prof.save(tmp_path / "c.modprof.json"))
    assert back.structures() == case.prof.structures()  # the regions kept, exactly
    from wandb_modprof.sinks.text.summary import format_mode_summary
    from wandb_modprof.sinks.text.values import mode_values

    text = format_mode_summary(mode_values(case.prof.snapshot(), "fwd_bwd"), 20)
    for root in roots:
        label = case.model_name if root == "<root>#0" else root[:-2]
        assert f"compiled region {label} (torch.compile): measured as one call" in text, text


@_SLOW
@pytest.mark.parametrize("flag", [False, True], ids=["default", "enable_kernel_profile"])
def test_inductor_cpu_kernels_emit_no_profiler_event_by_default(flag: bool) -> None:
    """What blocks per-module time inside a compiled region (README, torch.compile): on CPU
    inductor's fused C++ kernels open no profiler range unless
    `config.cpp.enable_kernel_profile` was set before compiling, and a fused kernel spans
    modules (GELU and LayerNorm, two modules, run as one kernel)."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with inductor_config.patch({"cpp.enable_kernel_profile": flag}):
        compiled = torch.compile(model, backend="inductor")
        compiled(x).sum().backward()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            compiled(x).sum().backward()
    kernels = {e.name for e in prof.events() if "cpp_fused" in e.name}
    if not flag:
        assert kernels == set()
    else:
        assert any("gelu" in k and "layer_norm" in k and "backward" not in k for k in kernels)
    torch._dynamo.reset()
