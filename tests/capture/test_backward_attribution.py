"""Per-invocation backward attribution on the structures that break module backward hooks."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import by_key, children, train_step
from models import (
    CustomFunctionModel,
    FrozenStem,
    KwargsDictModel,
    ResNet,
    Reused,
    TinyGPT,
    gpt_input,
    resnet_input,
)

import wandb_modprof


def _profile_one_step(model, x, loss_fn=None):
    train_step(model, x, loss_fn)  # warm-up outside the profile
    model.zero_grad(set_to_none=True)
    with wandb_modprof.profile(model, structure=False) as prof:
        train_step(model, x, loss_fn)
    return prof


def _check_tree_invariants(records):
    """bwd = self + children; self >= 0 (up to clock jitter); fwd likewise."""
    for r in records:
        kids = children(records, r.key)
        assert r.fwd_ms >= sum(k.fwd_ms for k in kids) - 1e-6
        assert r.fwd_self_ms >= -1e-6
        if r.bwd_ms is not None:
            assert r.bwd_ms == pytest.approx(r.bwd_self_ms + sum(k.bwd_ms for k in kids), abs=1e-6)
            assert r.bwd_self_ms >= -0.05  # nested-node subtraction may leave clock jitter
            assert r.bwd_ms >= sum(k.bwd_ms for k in kids) - 0.05
            assert r.backward_nodes >= sum(k.backward_nodes for k in kids)


def test_resnet_every_module_with_autograd_work_has_backward():
    model = ResNet()
    prof = _profile_one_step(model, resnet_input())
    recs = prof.invocations()
    keys = by_key(recs)
    # relu called twice per BasicBlock: two invocations, each measured on its own.
    assert "layer1.0.relu#0" in keys and "layer1.0.relu#1" in keys
    assert "layer1.0.relu#2" not in keys
    for r in recs:
        if r.module_type in ("AdaptiveAvgPool2d",):
            continue
        assert r.bwd_ms is not None and r.bwd_ms > 0, r.key
        assert r.backward_nodes >= 1, r.key
    # conv1's input needs no grad: still measured (weight gradient).
    assert keys["conv1#0"].bwd_ms > 0
    # downsample shares its input with conv1 of the same block, and is measured separately.
    ds = keys["layer2.0.downsample#0"]
    assert ds.bwd_ms > 0 and ds.backward_nodes >= 2
    assert ds.bwd_start_ms is not None and ds.bwd_end_ms is not None
    assert ds.bwd_end_ms > ds.bwd_start_ms
    _check_tree_invariants(recs)


def _root_and_totals():
    model = ResNet()
    prof = _profile_one_step(model, resnet_input(16, 32))
    recs = prof.invocations()
    root = recs[0]
    assert root.parent_key is None
    return root, prof.last_sample.totals


def test_top_level_calls_add_up_to_the_step():
    root, totals = _root_and_totals()
    assert root.bwd_ms <= totals.bwd_ms
    assert root.fwd_ms == totals.fwd_ms


@pytest.mark.accuracy  # a timing claim: run serially, with the cores to itself
def test_the_root_backward_is_nearly_the_whole_step_backward():
    # Everything but the loss's own nodes and the engine's scheduling between nodes. Another
    # process taking the core there adds to the step's time and not the root's (0.83 once, with
    # both cores shared by two workers and a browser), never the other way: judged on the least
    # disturbed of 5 steps, each its own one-step profile.
    shares = []
    for _ in range(5):
        root, totals = _root_and_totals()
        assert root.bwd_ms <= totals.bwd_ms
        shares.append(root.bwd_ms / totals.bwd_ms)
    assert max(shares) >= 0.85, shares


def test_reused_module_is_one_entry_per_call():
    model = Reused()
    prof = _profile_one_step(model, torch.randn(64, 32, requires_grad=True))
    keys = by_key(prof.invocations())
    calls = [keys[f"shared#{i}"] for i in range(3)]
    assert "shared#3" not in keys
    assert [c.call_index for c in calls] == [0, 1, 2]
    for c in calls:
        assert c.bwd_ms > 0
        assert c.backward_nodes >= 2  # addmm and t of this call
    # The weight's and bias's AccumulateGrad run once and are charged to one call only.
    assert sum(c.backward_nodes for c in calls) == 3 * 2 + 2
    # Backward runs the calls in reverse order of the forward calls.
    assert calls[2].bwd_start_ms < calls[1].bwd_start_ms < calls[0].bwd_start_ms


def test_frozen_stem_has_zero_backward_and_trainable_layers_do_not():
    model = FrozenStem()
    prof = _profile_one_step(model, torch.randn(16, 32))
    keys = by_key(prof.invocations())
    assert keys["stem#0"].bwd_ms == 0.0 and keys["stem#0"].backward_nodes == 0
    assert keys["stem.0#0"].act_bytes == 0  # nothing saved: no grad flows there
    assert keys["body#0"].bwd_ms > 0 and keys["head#0"].bwd_ms > 0
    assert keys["stem#0"].grad_norm is None and keys["body#0"].grad_norm > 0


def test_kwargs_input_dict_and_dataclass_outputs():
    model = KwargsDictModel()
    prof = _profile_one_step(model, torch.randn(8, 32), loss_fn=lambda o: o.logits.sum() + o.aux)
    keys = by_key(prof.invocations())
    # tensor passed only as a kwarg
    assert keys["inner#0"].bwd_ms > 0 and keys["inner.lin#0"].bwd_ms > 0
    # a submodule returning a dict, and the root returning a dataclass
    assert keys["branches#0"].bwd_ms > 0
    assert keys["branches.a#0"].bwd_ms > 0 and keys["branches.b#0"].bwd_ms > 0
    assert keys["<root>#0"].bwd_ms >= keys["branches#0"].bwd_ms
    _check_tree_invariants(prof.invocations())


def test_custom_autograd_function_is_charged_to_the_calling_module():
    model = CustomFunctionModel()
    prof = _profile_one_step(model, torch.randn(8, 32))
    root = by_key(prof.invocations())["<root>#0"]
    # Cube's backward node is created in the root's own code: root self time covers it.
    assert root.bwd_self_ms > 0
    # Cube's node, plus per Linear: addmm, t, and the AccumulateGrad of weight and bias.
    assert root.backward_nodes == 1 + 4 + 4


def test_transformer_with_tied_weights():
    model = TinyGPT()
    prof = _profile_one_step(model, gpt_input())
    recs = prof.invocations()
    keys = by_key(recs)
    for k in ("blocks.0.attn#0", "blocks.1.mlp#0", "head#0", "ln_f#0", "wpe#0"):
        assert keys[k].bwd_ms > 0, k
    # Tied weights are counted once at the root.
    unique = sum(p.numel() * p.element_size() for p in model.parameters())
    assert keys["<root>#0"].param_bytes == unique
    assert keys["head#0"].param_bytes == model.head.weight.numel() * 4
    _check_tree_invariants(recs)


def test_an_accumulate_grad_node_is_timed_by_hooks_of_its_own() -> None:
    """An AccumulateGrad node carries a pre-hook and a hook like every other node: its time
    starts after the node before it on the thread has ended (the engine's work between the two
    is no module's), is charged to its parameter's module, and no two nodes of a thread
    overlap."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with wandb_modprof.profile(model, structure=False) as prof:
        model(torch.randn(4, 8)).sum().backward()
    sample = prof.last_sample
    assert sample is not None
    nodes = sorted((r for r in sample.runs if r.kind == "node"), key=lambda r: r.end_ms)
    accumulate = [r for r in nodes if r.name == "torch::autograd::AccumulateGrad"]
    assert len(accumulate) == 4  # two weights, two biases
    for run in accumulate:
        before = [r for r in nodes if r.end_ms < run.end_ms and r.thread_id == run.thread_id]
        assert before and run.start_ms > before[-1].end_ms  # a stamp of its own, later
        assert run.start_ms < run.end_ms
        assert run.owner_key in ("0#0", "2#0")
    for a, b in itertools.pairwise(nodes):
        assert a.end_ms <= b.start_ms or a.thread_id != b.thread_id
