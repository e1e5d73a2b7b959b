"""Structure pass: exact dataflow edges per view for small zoo models, FLOPs, and the rules for
when the pass runs (its own untimed step, again after the call sequence changes)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from helpers import disabled_run, hook_counts
from models import (
    BasicBlock,
    Branchy,
    KwargsDictModel,
    Reused,
    TinyGPT,
    TwoBranchCat,
    gpt_input,
)
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.flop_counter import FlopCounterMode

import wandb_modprof
from wandb_modprof import Structure
from wandb_modprof.capture.structure.structure_pass import tensors_in
from wandb_modprof.view.graphs import merge, view_graphs

ROOT = "<root>#0"


def edges(structure: Structure, view: str = ROOT) -> set[tuple[str, str]]:
    """Edges of one view, with the view's own input/output/self keys shortened to `in:x`."""
    prefix = view + "|"
    short = lambda k: k[len(prefix) :] if k.startswith(prefix) else k  # noqa: E731
    return {(short(e.src_key), short(e.dst_key)) for e in structure.edges if e.view_key == view}


def structure_of(model: nn.Module, *args: object, **kwargs: object) -> Structure:
    """The structure pass of a profile block of two forwards (the first is timed and derives a
    graph without FLOPs; the second is the structure pass, which replaces it)."""
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            out = list(tensors_in(model(*args, **kwargs)))
            loss = sum(t.float().sum() for t in out if t.requires_grad)
            if isinstance(loss, torch.Tensor):
                loss.backward()
    (structure,) = prof.structures()  # the timed forward called the same modules
    assert prof.num_samples == 1
    assert all(c.flops_known for c in structure.calls), "the pass's graph replaced the derived"
    return structure


def chain(*keys: str) -> set[tuple[str, str]]:
    return set(itertools.pairwise(keys))


def test_residual_block_edges() -> None:
    s = structure_of(BasicBlock(8, 8), torch.randn(2, 8, 6, 6))
    expected = chain("in:x", "conv1#0", "bn1#0", "relu#0", "conv2#0", "bn2#0", "relu#1")
    expected |= {("in:x", "relu#1"), ("relu#1", "out:output")}  # the in-place `out += x`
    assert edges(s) == expected


def test_residual_block_with_downsample_edges() -> None:
    s = structure_of(BasicBlock(8, 16, stride=2), torch.randn(2, 8, 6, 6))
    expected = chain("in:x", "conv1#0", "bn1#0", "relu#0", "conv2#0", "bn2#0", "relu#1")
    expected |= {("in:x", "downsample#0"), ("downsample#0", "relu#1"), ("relu#1", "out:output")}
    assert edges(s) == expected
    assert edges(s, "downsample#0") == chain("in:input", "downsample.0#0", "downsample.1#0") | {
        ("downsample.1#0", "out:output")
    }


def test_two_branches_joined_by_cat() -> None:
    s = structure_of(TwoBranchCat(), torch.randn(3, 16))
    assert edges(s) == {
        ("in:x", "left#0"),
        ("in:x", "right#0"),
        ("left#0", "merge#0"),
        ("right#0", "merge#0"),
        ("merge#0", "out:output"),
    }
    assert edges(s, "right#0") == {
        ("in:input", "right.0#0"),
        ("right.0#0", "right.1#0"),
        ("right.1#0", "out:output"),
    }


def test_module_reused_three_times_appears_once_per_call() -> None:
    s = structure_of(Reused(), torch.randn(4, 32))
    expected = chain("in:x", "inp#0", "shared#0", "act#0", "shared#1", "act#1", "shared#2", "act#2")
    assert edges(s) == expected | {("act#2", "out:output")}
    graph = view_graphs(merge([s]))[0]
    labels = [n.label for n in graph.nodes if n.kind == "module"]
    assert labels == ["inp", "shared #0", "act #0", "shared #1", "act #1", "shared #2", "act #2"]


def test_kwargs_inputs_dict_and_dataclass_outputs() -> None:
    s = structure_of(KwargsDictModel(), torch.randn(4, 32))
    calls = {c.key: c for c in s.calls}
    assert calls["inner#0"].inputs == ("hidden",)  # passed as a keyword; `scale` is a float
    assert calls["branches#0"].outputs == ("a", "b")  # a dict
    assert calls[ROOT].outputs == ("logits", "aux")  # a dataclass
    assert edges(s) == {
        ("in:x", "embed#0"),
        ("embed#0", "inner#0"),
        ("inner#0", "branches#0"),
        ("branches#0", "out:logits"),
        ("branches#0", "out:aux"),
    }
    assert edges(s, "inner#0") == {("in:hidden", "inner.lin#0"), ("inner.lin#0", "out:output")}
    assert edges(s, "branches#0") == {
        ("in:h", "branches.a#0"),
        ("in:h", "branches.b#0"),
        ("branches.a#0", "out:a"),
        ("branches.b#0", "out:b"),
    }


def test_one_tensor_under_two_names_is_one_input_node_with_all_its_edges() -> None:
    pytest.importorskip("transformers")
    from models import gpt2_from_config

    torch.manual_seed(0)
    ids = torch.randint(0, 512, (2, 16))
    # as transformers' docs, the demo and the notebook call it: one tensor, two names
    s = structure_of(gpt2_from_config(), input_ids=ids, labels=ids)
    root = {c.key: c for c in s.calls}[ROOT]
    assert root.inputs == ("input_ids = labels",)
    shared = {dst for src, dst in edges(s) if src == "in:input_ids = labels"}
    assert shared == {"transformer#0", "out:loss"}  # the embedding; the loss (in forward)
    (graph,) = [g for g in view_graphs(merge([s])) if g.view_key == ROOT]
    inputs = [n.label for n in graph.nodes if n.kind == "input"]
    assert inputs == ["input_ids = labels"]

    # two different tensors keep two nodes, each with its own edges only
    s = structure_of(gpt2_from_config(), input_ids=ids, labels=ids.clone())
    assert {c.key: c for c in s.calls}[ROOT].inputs == ("input_ids", "labels")
    assert ("in:input_ids", "transformer#0") in edges(s)
    assert ("in:labels", "transformer#0") not in edges(s)
    assert ("in:labels", "out:loss") in edges(s)
    assert ("in:input_ids", "out:loss") not in edges(s)


TINY_GPT_ROOT = {
    ("in:idx", "wte#0"),  # `wpe` reads positions made by `arange`: no edge into it
    ("wte#0", "blocks.0#0"),
    ("wpe#0", "blocks.0#0"),
    ("blocks.0#0", "blocks.1#0"),
    ("blocks.1#0", "ln_f#0"),
    ("ln_f#0", "head#0"),
    ("head#0", "out:output"),
}
TINY_GPT_BLOCK = {
    ("in:x", "blocks.0.ln1#0"),
    ("blocks.0.ln1#0", "blocks.0.attn#0"),
    ("in:x", "blocks.0.ln2#0"),  # residual `x + attn(...)` then ln2
    ("blocks.0.attn#0", "blocks.0.ln2#0"),
    ("blocks.0.ln2#0", "blocks.0.mlp#0"),
    ("in:x", "out:output"),
    ("blocks.0.attn#0", "out:output"),
    ("blocks.0.mlp#0", "out:output"),
}
TINY_GPT_ATTENTION = {  # chunk, view, transpose, scaled_dot_product_attention in between
    ("in:x", "blocks.0.attn.qkv#0"),
    ("blocks.0.attn.qkv#0", "blocks.0.attn.proj#0"),
    ("blocks.0.attn.proj#0", "out:output"),
}


def test_eval_no_grad_forward_has_the_training_graph() -> None:
    model = TinyGPT()
    model.eval()
    with torch.no_grad():
        s_eval = structure_of(model, gpt_input())
    assert not s_eval.training
    model.train()
    s_train = structure_of(model, gpt_input())
    assert s_train.training
    for s in (s_eval, s_train):
        assert edges(s) == TINY_GPT_ROOT
        assert edges(s, "blocks.0#0") == TINY_GPT_BLOCK
        assert edges(s, "blocks.0.attn#0") == TINY_GPT_ATTENTION


def test_branch_change_between_steps_captures_a_second_structure() -> None:
    model = Branchy()
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    x = torch.randn(2, 16)
    for step in range(1, 6):
        model.use_b = step >= 3
        model(x).sum().backward()
    prof = handle.unwatch()
    first, second = prof.structures()
    assert edges(first) == {("in:x", "a#0"), ("a#0", "out:output")}
    assert edges(second) == {("in:x", "b#0"), ("b#0", "out:output")}
    # Step 1 and step 4 (after step 3 called `b` for the first time) were structure passes.
    assert prof.num_samples == 3
    assert set(prof.stats()) == {ROOT, "a#0", "b#0"}
    (graph,) = view_graphs(merge(prof.structures(), prof.stats().values()))
    assert {(e.src_key, e.dst_key) for e in graph.edges} == {
        (f"{ROOT}|in:x", "a#0"),
        (f"{ROOT}|in:x", "b#0"),
        ("a#0", f"{ROOT}|out:output"),
        ("b#0", f"{ROOT}|out:output"),
    }


def test_flops_per_call_match_flop_counter_mode() -> None:
    model = TinyGPT()
    x = gpt_input()
    s = structure_of(model, x)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    calls = {c.key: c for c in s.calls}
    # torch's counter has no formula for the CPU attention kernel; we add the flash formula.
    b, t = x.shape
    heads, dim = 4, 64
    sdpa = 4 * b * heads * t * t * (dim // heads)  # two matmuls of 2*b*h*t*t*d each
    assert calls[ROOT].fwd_flops == counter.get_total_flops() + 2 * sdpa > 0
    per_module = counter.get_flop_counts()
    assert calls["blocks.0.mlp.up#0"].fwd_flops == sum(
        per_module["TinyGPT.blocks.0.mlp.up"].values()
    )
    assert calls["blocks.0.mlp.up#0"].fwd_flops == 2 * b * t * 64 * 256
    # inclusive = own ops + children
    kids = [c for c in s.calls if c.parent_key == "blocks.0.attn#0"]
    attn = calls["blocks.0.attn#0"]
    assert attn.fwd_flops == attn.fwd_self_flops + sum(c.fwd_flops for c in kids)
    assert attn.fwd_self_flops == sdpa  # scaled_dot_product_attention in its own code


def test_structure_pass_is_untimed_and_first_step_of_watch() -> None:
    model = TinyGPT()
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
    x = gpt_input()
    model.eval()
    with torch.no_grad():
        model(x)  # not a training step: no structure pass
    assert handle.profile().structures() == []
    model.train()
    for _ in range(4):
        model(x).sum().backward()
    prof = handle.unwatch()
    assert len(prof.structures()) == 1
    assert prof.num_samples == 2  # steps 2 and 4; step 1 was the structure pass
    assert not _get_current_function_mode_stack()
    assert not _get_current_dispatch_mode_stack()


def test_structure_pass_does_not_change_numerics() -> None:
    def run(watched: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = TinyGPT()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if watched:
            wandb_modprof.watch(model, log_freq=2, optimizer=opt, run=disabled_run())
        out = []
        for _ in range(3):
            loss = F.cross_entropy(model(gpt_input()).flatten(0, 1), gpt_input().flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.detach())
        out.extend(p.detach().clone() for p in model.parameters())
        if watched:
            wandb_modprof.unwatch(model)
        return out

    for a, b in zip(run(False), run(True), strict=True):
        assert torch.equal(a, b)


def test_forward_that_raises_during_the_pass_keeps_no_partial_graph() -> None:
    from models import RaisingModel

    model = RaisingModel()
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    model.boom.armed = True
    with pytest.raises(ValueError, match="boom"):
        model(torch.randn(2, 16))
    assert handle.profile().structures() == []
    assert not _get_current_function_mode_stack()
    model.boom.armed = False
    model(torch.randn(2, 16)).sum().backward()  # a timed step: its call sequence is unknown
    model(torch.randn(2, 16)).sum().backward()  # so this one is a structure pass again
    (s,) = handle.unwatch().structures()
    assert edges(s) == chain("in:x", "lin#0", "boom#0", "out#0") | {("out#0", "out:output")}


def test_keyboard_interrupt_during_the_pass_leaves_no_mode_behind() -> None:
    class Interrupting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.interrupt = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.lin(x)
            if self.interrupt:
                raise KeyboardInterrupt
            return x

    model = Interrupting()
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    with pytest.raises(KeyboardInterrupt):
        model(torch.randn(2, 4))
    model.interrupt = False
    model(torch.randn(2, 4)).sum().backward()  # recovers: the stale pass is ended first
    model(torch.randn(2, 4)).sum().backward()  # and the pass runs again after a timed step
    assert not _get_current_function_mode_stack()
    assert not _get_current_dispatch_mode_stack()
    assert len(handle.unwatch().structures()) == 1


@pytest.mark.parametrize("checkpointing", ["reentrant", "non_reentrant"])
def test_structure_pass_with_activation_checkpointing(checkpointing: str) -> None:
    model = TinyGPT(checkpointing=checkpointing)
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    for _ in range(3):
        model(gpt_input()).sum().backward()
    prof = handle.unwatch()
    (s,) = prof.structures()  # recomputes during backward are not a new call sequence
    assert edges(s) == TINY_GPT_ROOT
    assert edges(s, "blocks.0#0") == TINY_GPT_BLOCK
    assert prof.num_samples == 2
    assert all(r.bwd_ms is not None for r in prof.invocations() if r.key.startswith("blocks.0"))


class ParentResidualStream(nn.Module):
    """The residual stream lives in the parent: every layer's output reaches every later one."""

    def __init__(self, n: int = 12, dim: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return x


def test_dense_parent_residual_view_is_drawn_as_its_transitive_reduction() -> None:
    s = structure_of(ParentResidualStream(), torch.randn(2, 8))
    n = 12
    assert len(edges(s)) == n * (n + 1) // 2 + n + 1  # captured: every earlier source, O(n^2)
    (graph,) = view_graphs(merge([s]))
    drawn = {(e.src_key.split("|")[-1], e.dst_key.split("|")[-1]) for e in graph.edges}
    layers = [f"layers.{i}#0" for i in range(n)]
    assert drawn == chain("in:x", *layers, "out:output")


def test_sparse_views_keep_their_skip_edges() -> None:
    s = structure_of(BasicBlock(8, 8), torch.randn(2, 8, 6, 6))
    (graph,) = view_graphs(merge([s]))
    assert (f"{ROOT}|in:x", "relu#1") in {(e.src_key, e.dst_key) for e in graph.edges}


# ---- writes: __setitem__, in place through views, out= --------------------------------------
class SetItem(nn.Module):
    """A preallocated output filled by a child, RNN-style."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(2, 3, 4)
        for t in range(3):
            out[:, t] = self.cell(x[:, t])
        return out


class ViewInPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.zeros(2, 8)
        buf[:, :4].copy_(self.a(x))
        buf.narrow(1, 4, 4).add_(self.b(x))
        return buf


class OutKwarg(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tmp = self.c(self.a(x))
        torch.mul(self.b(x), 2.0, out=tmp)  # overwritten: only b flows into tmp now
        return tmp


def test_writes_into_tensors_carry_their_sources() -> None:
    with torch.no_grad():
        s = structure_of(SetItem(), torch.randn(2, 3, 4))
        cells = {(f"cell#{t}", "out:output") for t in range(3)}
        assert edges(s) == {("in:x", f"cell#{t}") for t in range(3)} | cells
        s = structure_of(ViewInPlace(), torch.randn(2, 4))
        assert edges(s) == {
            ("in:x", "a#0"),
            ("in:x", "b#0"),
            ("a#0", "out:output"),
            ("b#0", "out:output"),
        }
        s = structure_of(OutKwarg(), torch.randn(2, 4))
        assert edges(s) == {
            ("in:x", "a#0"),
            ("in:x", "b#0"),
            ("a#0", "c#0"),
            ("b#0", "out:output"),
        }


# ---- the pass never breaks training ----------------------------------------------------------
def test_a_failing_flop_formula_warns_once_and_training_goes_on(monkeypatch) -> None:
    from wandb_modprof.capture.structure import flops as _flops

    def broken(*args: object, **kwargs: object) -> int:
        raise ValueError("formula exploded")

    formulas = dict(_flops.FORMULAS)
    formulas[torch.ops.aten.addmm] = broken
    monkeypatch.setattr(_flops, "FORMULAS", formulas)
    torch.manual_seed(0)
    model = Reused()
    reference = [p.detach().clone() for p in model.parameters()]
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    x = torch.randn(4, 32)
    with pytest.warns(RuntimeWarning, match="formula exploded") as caught:
        for _ in range(4):
            model(x).sum().backward()
    assert len([w for w in caught if "wandb_modprof" in str(w.message)]) == 1
    prof = handle.unwatch()
    # Every pass failed and none is kept half-done: the graph is the one step 1 derived from
    # its timed forward, without FLOPs. Steps 1 and 3 timed; failed passes alternate with them.
    (structure,) = prof.structures()
    assert structure.edges and not any(c.flops_known for c in structure.calls)
    assert prof.num_samples == 2
    assert not _get_current_function_mode_stack()
    assert not _get_current_dispatch_mode_stack()
    # training was not disturbed: the same steps without wandb_modprof give the same weights
    torch.manual_seed(0)
    plain = Reused()
    for _ in range(4):
        plain(x).sum().backward()
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    assert all(torch.equal(a, b) for a, b in zip(reference, plain.parameters(), strict=True))


def test_failed_passes_are_retried_a_bounded_number_of_times(monkeypatch) -> None:
    from wandb_modprof.capture.structure import flops as _flops
    from wandb_modprof.capture.structure import pass_schedule as _schedule

    monkeypatch.setattr(_flops, "FORMULAS", {torch.ops.aten.addmm: lambda *a, **k: 1 // 0})
    model = Reused()
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    with pytest.warns(RuntimeWarning):
        for _ in range(3 * _schedule.MAX_PASSES):
            model(torch.randn(2, 32)).sum().backward()
    capture = handle._capture
    assert capture.structures.passes == _schedule.MAX_PASSES
    assert not capture.structures.due
    handle.unwatch()


def test_model_compiled_in_place_gets_its_graph_from_fake_tensors() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    model = TwoBranchCat()
    model.compile(backend="eager")  # hooked around its compiled call, not inside it
    x = torch.randn(3, 16)
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning of ours or Dynamo's
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in range(5):
                model(x).sum().backward()
    prof = handle.unwatch()
    torch._dynamo.reset()
    (structure,) = prof.structures()
    names = {c.module_name for c in structure.calls}
    assert names == {n or "<root>" for n, _ in model.named_modules()}  # inside the region too
    assert prof.num_samples == 2
    assert set(prof.stats()) == {"<root>#0"}  # one compiled region: measured as one call
    assert sum(hook_counts(model).values()) == 0
    assert model._compiled_call_impl is not None and "Boundary" not in repr(
        model._compiled_call_impl
    )  # our wrapper of the compiled call is gone


# torch's notice that the fast path's nested tensors (enable_nested_tensor) are a prototype
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_eval_forward_of_fast_path_modules_is_not_changed_by_the_pass() -> None:
    """nn.TransformerEncoder's inference fast path turns off under a TorchFunctionMode, with
    different results (padding positions): no structure pass on such eval forwards."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[False] * 5, [False, False, False, True, True]])
    with torch.no_grad():
        expected = model(x, src_key_padding_mask=mask)
        with wandb_modprof.profile(model) as prof:
            outs = [model(x, src_key_padding_mask=mask) for _ in range(2)]
    for out in outs:
        assert torch.equal(out, expected)
    # No pass ran: the one graph was derived by the first timed forward (no modes), no FLOPs.
    (structure,) = prof.structures()
    assert not any(c.flops_known for c in structure.calls)
    assert prof.num_samples == 2  # both forwards timed


def test_keyboard_interrupt_during_the_pass_stops_tracking_without_the_next_forward() -> None:
    import torch._dynamo.eval_frame

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def interrupt(module: nn.Module, args: object, out: object) -> None:
        raise KeyboardInterrupt

    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    model(torch.randn(2, 4)).sum().backward()  # step 1: timed, derives the graph
    hook = model[0].register_forward_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):  # step 2: the structure pass
        model(torch.randn(2, 4))
    hook.remove()
    # The pass ended when its forward's frame went (`root_hooks.ForwardFrame`): its modes are
    # off before the user's next line, not only at the model's next forward.
    assert not _get_current_function_mode_stack()
    assert not _get_current_dispatch_mode_stack()
    assert torch._dynamo.eval_frame._stance.stance == "default"
    for _ in range(300):  # the user's notebook carries on with other torch code
        torch.ones(2).add(1)
    handle.unwatch()
    assert not _get_current_function_mode_stack()
    assert not _get_current_dispatch_mode_stack()


def test_compiled_function_inside_forward_is_not_recompiled() -> None:
    import torch._dynamo
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(backend=counter)
    def gelu(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x) * 2

    class WithCompiledFn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(gelu(self.a(x)))

    model = WithCompiledFn()
    x = torch.randn(4, 8)
    model(x).sum().backward()
    assert counter.frame_count == 1
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(4):
            model(x).sum().backward()
    prof = handle.unwatch()
    torch._dynamo.reset()
    assert counter.frame_count == 1
    assert edges(prof.structures()[0]) == {
        ("in:x", "a#0"),
        ("a#0", "b#0"),
        ("b#0", "out:output"),
    }


def test_inner_capture_pass_never_lands_in_outer_timed_sample() -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Reused(8)
            self.head = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.inner(x))

    model = Outer()
    x = torch.randn(2, 8)
    outer = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    for step in range(1, 7):
        if step == 4:
            inner = wandb_modprof.watch(model.inner, log_freq=1, run=disabled_run())
        model(x).sum().backward()
    # outer: step 1 its own pass, step 4 the inner model's pass (not timed), others sampled
    assert outer.unwatch().num_samples == 4
    inner_prof = inner.unwatch()
    assert len(inner_prof.structures()) == 1
    assert inner_prof.num_samples == 2


def test_after_the_pass_unsampled_steps_are_hook_free_and_nothing_is_kept_alive() -> None:
    import gc
    import weakref

    model = TinyGPT()
    handle = wandb_modprof.watch(model, log_freq=1000, run=disabled_run())
    gc.disable()
    try:
        x = gpt_input()
        out = model(x)  # step 1: the structure pass
        refs = [weakref.ref(x), weakref.ref(out)]
        out.sum().backward()
        del x, out
        assert all(r() is None for r in refs)  # freed by refcount alone: no cycles
    finally:
        gc.enable()
    counts = hook_counts(model)
    assert counts.pop("<root>") == 2 and sum(counts.values()) == 0
    model(gpt_input()).sum().backward()  # step 2: unsampled
    assert sum(hook_counts(model).values()) == 2
    with pytest.warns(UserWarning, match=r"2 training step\(s\) with log_freq=1000"):
        assert len(handle.unwatch().structures()) == 1


def test_structure_variants_are_capped_with_one_warning() -> None:
    class Varying(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.calls = 1

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(self.calls):
                x = self.lin(x)
            return x

    from wandb_modprof.capture.structure.pass_schedule import MAX_STRUCTURES

    model = Varying()
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    with pytest.warns(RuntimeWarning, match="different sequences of modules") as caught:
        for step in range(60):
            model.calls = 1 + step // 2  # a new sequence every other step
            model(torch.randn(2, 4)).sum().backward()
    assert len([w for w in caught if "different sequences" in str(w.message)]) == 1
    prof = handle.unwatch()
    assert len(prof.structures()) == MAX_STRUCTURES
    assert prof.num_samples > 30
    assert {f"lin#{i}" for i in range(30)} <= set(prof.stats())  # statistics cover all calls
