"""`on_module`: callbacks on one module's forward and backward boundaries.

The central evidence is `test_profiler_started_and_stopped_by_the_callbacks_captures_only_
that_modules_backward`: a `torch.profiler` run started in `backward_start` and stopped in
`backward_end` of `layer2` holds every autograd node of layer2 (by sequence number, taken in
the test itself) and none of layer1's or layer3's.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import disabled_run, hook_counts
from models import KwargsDictModel, ResNet, Reused, TinyGPT, gpt_input, resnet_input
from torch import nn
from torch.profiler import ProfilerActivity, profile

import wandb_modprof
from wandb_modprof import ModProfError, ModuleCallbacks, ModuleEvent, on_module

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("forward_start", "forward_end", "backward_start", "backward_end")
EVALUATE = "autograd::engine::evaluate_function: "


def recorder(events: list[tuple[str, int]]) -> dict[str, Any]:
    def record(event: ModuleEvent) -> None:
        events.append((event.phase, event.call))

    return {phase: record for phase in PHASES}


def chain() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))


def profiler_for_hooks() -> profile:
    # Started inside a backward the profiler needs process-wide callbacks: the engine restores
    # each node's thread-local state after it runs (see on_module's docstring).
    config = torch.profiler._ExperimentalConfig(profile_all_threads=True)
    return profile(activities=[ProfilerActivity.CPU], experimental_config=config)


def seq_range_hooks(module: nn.Module, into: dict[str, Any]) -> None:
    """Record the module's autograd sequence range and output node, independently of
    on_module (the private counter read directly)."""

    def pre(m: nn.Module, args: Any) -> None:
        into["seq0"] = torch._C._autograd._get_sequence_nr()

    def post(m: nn.Module, args: Any, out: torch.Tensor) -> None:
        into["seq1"] = torch._C._autograd._get_sequence_nr()
        into["root"] = out.grad_fn

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)


def nodes_in_range(root: Any, lo: int, hi: int) -> dict[int, str]:
    """The autograd nodes a module call created: sequence number -> node type."""
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        seq = node._sequence_nr()
        if lo <= seq < hi and seq not in found:
            found[seq] = type(node).__name__
            todo.extend(n for n, _ in node.next_functions if n is not None)
    return found


# ---- event sequences ---------------------------------------------------------------------------
def test_exact_event_sequence_of_a_chain_over_two_steps():
    model = chain()
    events: list[tuple[str, int]] = []
    on_module(model[0], **recorder(events))
    on_module(model[2], **recorder(events))
    # Accumulating the first layer's gradients is part of its backward: inside its pair.
    model[0].weight.register_post_accumulate_grad_hook(lambda p: events.append(("acc 0.w", -1)))
    for step in range(2):
        events.clear()
        model(torch.randn(4, 8)).sum().backward()
        assert events == [  # each handle counts its own module's calls
            ("forward_start", step),
            ("forward_end", step),
            ("forward_start", step),
            ("forward_end", step),
            # model[2] closes right after its own nodes, before model[0]'s backward starts
            ("backward_start", step),
            ("backward_end", step),
            ("backward_start", step),
            ("acc 0.w", -1),
            ("backward_end", step),
        ]


def test_module_event_is_a_plain_frozen_record():
    model = chain()
    got: list[ModuleEvent] = []
    on_module(model[2], backward_end=got.append)
    model(torch.randn(2, 8)).sum().backward()
    assert got == [ModuleEvent(phase="backward_end", call=0, module_type="Linear")]
    with pytest.raises(AttributeError):
        got[0].call = 3  # type: ignore[misc]


def test_reused_module_gets_one_backward_pair_per_call_in_reverse_order():
    model = Reused()
    events: list[tuple[str, int]] = []
    on_module(model.shared, **recorder(events))
    # The shared weight is accumulated once, after its last use in backward (call 0's).
    model.shared.weight.register_post_accumulate_grad_hook(lambda p: events.append(("acc", -1)))
    for step in range(2):
        events.clear()
        model(torch.randn(4, 32)).pow(2).mean().backward()
        c0, c1, c2 = 3 * step, 3 * step + 1, 3 * step + 2
        assert events == [
            ("forward_start", c0),
            ("forward_end", c0),
            ("forward_start", c1),
            ("forward_end", c1),
            ("forward_start", c2),
            ("forward_end", c2),
            ("backward_start", c2),
            ("backward_end", c2),
            ("backward_start", c1),
            ("backward_end", c1),
            ("backward_start", c0),
            ("acc", -1),
            ("backward_end", c0),
        ]


def test_tied_weight_is_accumulated_in_the_window_of_its_last_use_in_backward():
    """TinyGPT's head shares its weight with the token embedding, used first in forward: the
    weight is accumulated after the embedding's backward, so the head must not wait for it."""
    model = TinyGPT()
    events: list[tuple[str, str]] = []
    for name in ("wte", "blocks.1", "ln_f", "head"):

        def record(event: ModuleEvent, name: str = name) -> None:
            events.append((event.phase, name))

        on_module(model.get_submodule(name), backward_start=record, backward_end=record)
    model.wte.weight.register_post_accumulate_grad_hook(lambda p: events.append(("acc", "wte")))
    for _ in range(2):
        events.clear()
        model(gpt_input()).float().pow(2).mean().backward()
        assert events == [
            ("backward_start", "head"),
            ("backward_end", "head"),
            ("backward_start", "ln_f"),
            ("backward_end", "ln_f"),
            ("backward_start", "blocks.1"),
            ("backward_end", "blocks.1"),
            ("backward_start", "wte"),
            ("acc", "wte"),
            ("backward_end", "wte"),
        ]


def test_dict_outputs_tensor_kwargs_and_independent_outputs():
    """`branches` returns {"a": a(h), "b": b(h)}: two outputs with no autograd node in common,
    whose gradients arrive at different times. Each stretch gets its own pair (documented):
    the pairs follow each other, never overlap, and carry the call's number."""
    model = KwargsDictModel()
    events: list[tuple[str, str, int]] = []
    for name in ("inner", "branches"):  # inner takes its tensor as a keyword argument

        def record(event: ModuleEvent, name: str = name) -> None:
            events.append((event.phase, name, event.call))

        on_module(model.get_submodule(name), **{phase: record for phase in PHASES})
    out = model(torch.randn(4, 32))
    (out.logits.sum() + out.aux).backward()
    assert events == [
        ("forward_start", "inner", 0),
        ("forward_end", "inner", 0),
        ("forward_start", "branches", 0),
        ("forward_end", "branches", 0),
        ("backward_start", "branches", 0),
        ("backward_end", "branches", 0),
        ("backward_start", "branches", 0),
        ("backward_end", "branches", 0),
        ("backward_start", "inner", 0),
        ("backward_end", "inner", 0),
    ]


def test_eval_and_no_grad_forwards_have_forward_events_only():
    model = ResNet().eval()
    events: list[tuple[str, int]] = []
    hooks = on_module(model.layer2, **recorder(events))
    with torch.no_grad():
        model(resnet_input())
    assert events == [("forward_start", 0), ("forward_end", 0)]
    assert hooks.calls == 1


def test_forward_that_raises_still_ends_and_has_no_backward():
    model = chain()
    events: list[tuple[str, int]] = []
    on_module(model[1], **recorder(events))
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 7))  # wrong width: model[0] raises before model[1] runs
    on_module(model[0], **recorder(events))
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 7))
    assert events == [("forward_start", 0), ("forward_end", 0)]  # model[0]'s only call


def test_second_backward_through_a_retained_graph_gets_another_pair():
    model = chain()
    events: list[tuple[str, int]] = []
    on_module(model[0], backward_start=recorder(events)["backward_start"])
    loss = model(torch.randn(2, 8)).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    assert events == [("backward_start", 0), ("backward_start", 0)]


def test_autograd_grad_with_captured_parameters_does_not_break():
    """Gradient-penalty style `torch.autograd.grad(loss, params)`: a captured parameter's
    AccumulateGrad node makes `_will_engine_execute_node` raise (pytorch #131753)."""
    model = chain()
    events: list[tuple[str, int]] = []
    on_module(model[0], **recorder(events))
    x = torch.randn(3, 8, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grads = torch.autograd.grad(model(x).sum(), [model[0].weight, x])
    assert all(g is not None for g in grads)
    assert events == [
        ("forward_start", 0),
        ("forward_end", 0),
        ("backward_start", 0),
        ("backward_end", 0),
    ]


# ---- the profiler around one module's backward -------------------------------------------------
def test_profiler_started_and_stopped_by_the_callbacks_captures_only_that_modules_backward():
    model = ResNet()
    ranges: dict[str, dict[str, Any]] = {name: {} for name in ("layer1", "layer2", "layer3")}
    for name, into in ranges.items():
        seq_range_hooks(getattr(model, name), into)
    prof = profiler_for_hooks()
    calls: list[ModuleEvent] = []

    def start(event: ModuleEvent) -> None:
        calls.append(event)
        prof.start()

    def stop(event: ModuleEvent) -> None:
        calls.append(event)
        prof.stop()

    on_module(model.layer2, backward_start=start, backward_end=stop)
    out = model(resnet_input())
    layer2 = ranges["layer2"]
    expected = nodes_in_range(layer2["root"], layer2["seq0"], layer2["seq1"])
    for into in ranges.values():
        del into["root"]  # hold no graph node past the backward
    out.sum().backward()
    assert [e.phase for e in calls] == ["backward_start", "backward_end"]

    events = prof.events()
    node_events = {(e.sequence_nr, e.name) for e in events if e.sequence_nr >= 0}
    seqs = {seq for seq, _ in node_events}
    evaluated = {
        e.sequence_nr for e in events if e.name.startswith(EVALUATE) and e.sequence_nr >= 0
    }
    # Every node of layer2 ran inside the window, with its own name...
    assert {(seq, name) for seq, name in expected.items()} <= node_events
    # ...and nothing else did: not one node of layer1 or layer3 (or the stem and head).
    assert seqs == set(expected), sorted(seqs ^ set(expected))
    for sibling in ("layer1", "layer3"):
        assert not seqs & set(range(ranges[sibling]["seq0"], ranges[sibling]["seq1"]))
    assert len(expected) >= 16  # two BasicBlocks with a downsample: a real subgraph
    # The profiler started inside the first node's `evaluate_function` range, so that one
    # wrapper is missing; every other node has it.
    assert evaluated <= seqs
    assert len(seqs - evaluated) <= 1
    # Gradient accumulation of layer2's parameters, and of no other parameter, is inside too.
    accumulated = [e for e in events if e.name == EVALUATE + "torch::autograd::AccumulateGrad"]
    assert len(accumulated) == sum(1 for _ in model.layer2.parameters())


# ---- removal, safety, numerics -----------------------------------------------------------------
def test_remove_and_context_manager_leave_no_hooks_and_fire_nothing():
    model = ResNet()
    before = hook_counts(model)
    events: list[tuple[str, int]] = []
    hooks = on_module(model.layer2, **recorder(events))
    assert hook_counts(model)["layer2"] == before["layer2"] + 2
    model(resnet_input()).sum().backward()
    assert len(events) == 4
    hooks.remove()
    hooks.remove()  # idempotent
    assert hooks.removed
    assert hook_counts(model) == before
    model(resnet_input()).sum().backward()
    assert len(events) == 4

    with on_module(model.layer2, **recorder(events)) as block:
        assert isinstance(block, ModuleCallbacks)
        out = model(resnet_input())
    # Removed between the forward and its backward: the backward fires nothing either.
    out.sum().backward()
    assert events[4:] == [("forward_start", 0), ("forward_end", 0)]
    assert hook_counts(model) == before


def test_remove_from_inside_a_backward_callback():
    model = Reused()
    events: list[tuple[str, int]] = []
    record = recorder(events)

    def end_and_remove(event: ModuleEvent) -> None:
        record["backward_end"](event)
        hooks.remove()

    hooks = on_module(
        model.shared, backward_start=record["backward_start"], backward_end=end_and_remove
    )
    model(torch.randn(2, 32)).sum().backward()
    assert events == [("backward_start", 2), ("backward_end", 2)]
    model(torch.randn(2, 32)).sum().backward()
    assert len(events) == 2


def grads_after_steps(model: nn.Module, x: torch.Tensor, steps: int = 2) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        opt.step()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_raising_callback_warns_once_and_training_is_bitwise_unchanged():
    reference = ResNet()
    model = copy.deepcopy(reference)
    x = resnet_input()

    def boom(event: ModuleEvent) -> None:
        raise ValueError(f"boom {event.call}")

    on_module(model.layer2, backward_start=boom, forward_end=boom)
    on_module(model.layer3, **{p: (lambda e: None) for p in PHASES})
    with pytest.warns(RuntimeWarning) as caught:
        got = grads_after_steps(model, x, steps=3)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2  # once per phase, not once per step
    assert (
        "on_module(Sequential): the backward_start callback raised ValueError: boom 0"
        in (messages[0])
    )
    assert "the forward_end callback raised ValueError: boom 0" in messages[1]
    want = grads_after_steps(reference, x, steps=3)
    assert len(got) == len(want)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_internal_error_warns_once_and_training_continues(monkeypatch: pytest.MonkeyPatch):
    from wandb_modprof.capture.step import torch_private as tp

    def broken() -> Any:
        raise RuntimeError("torch changed")

    reference = chain()
    model = copy.deepcopy(reference)
    events: list[tuple[str, int]] = []
    on_module(model[0], **recorder(events))
    monkeypatch.setattr(tp, "current_autograd_node", broken)
    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match=r"internal error in the backward pre-hook"):
        got = grads_after_steps(model, x)
    assert all(torch.equal(g, w) for g, w in zip(got, grads_after_steps(reference, x), strict=True))
    # Still one balanced pair per call: the end comes from the end-of-backward callback.
    assert events == [(phase, step) for step in range(2) for phase in PHASES]


def test_graph_dropped_without_backward_frees_activations_and_claims():
    model = chain()
    saved: list[weakref.ref[torch.Tensor]] = []
    model[1].register_forward_hook(lambda m, a, out: saved.append(weakref.ref(out)))
    events: list[tuple[str, int]] = []
    hooks = on_module(model, **recorder(events))
    model[0].weight.register_post_accumulate_grad_hook(lambda p: events.append(("acc", -1)))
    out = model(torch.randn(4, 8))
    assert saved[0]() is not None  # tanh's output, saved by the next Linear for backward
    del out  # no backward: the graph (and what it saved) must go now, without gc
    assert saved[0]() is None
    assert len(hooks._backward.live) == 0
    events.clear()
    model(torch.randn(4, 8)).sum().backward()  # the next call owns the accumulation again
    assert events == [
        ("forward_start", 1),
        ("forward_end", 1),
        ("backward_start", 1),
        ("acc", -1),
        ("backward_end", 1),
    ]


def test_deepcopy_of_a_model_with_callbacks_copies_them_inert():
    model = chain()
    events: list[tuple[str, int]] = []
    on_module(model[0], **recorder(events))
    twin = copy.deepcopy(model)
    twin(torch.randn(2, 8)).sum().backward()
    assert events == []


# ---- together with watch, checkpointing ---------------------------------------------------------
def test_works_while_the_model_is_watched():
    model = ResNet()
    events: list[tuple[str, int]] = []
    on_module(model.layer2, **recorder(events))
    handle = wandb_modprof.watch(
        model, log_freq=1, run=disabled_run()
    )  # step 1 is the structure pass
    x = resnet_input()
    for _ in range(3):
        model(x).sum().backward()
    prof = handle.unwatch()
    assert prof.num_samples == 2
    assert len(prof.structures()) == 1
    records = {r.key: r for r in prof.invocations()}
    assert records["layer2#0"].bwd_ms is not None
    assert records["layer2#0"].bwd_ms > 0
    assert events == [(phase, step) for step in range(3) for phase in PHASES]


def test_non_reentrant_checkpointing_balanced_backward_no_recompute_forward_events():
    model = TinyGPT(checkpointing="non_reentrant")
    events: list[tuple[str, int]] = []
    inner: list[tuple[str, int]] = []
    on_module(model.blocks[0], **recorder(events))
    on_module(model.blocks[0].mlp, **recorder(inner))
    for step in range(2):
        events.clear()
        inner.clear()
        model(gpt_input()).float().pow(2).mean().backward()
        expected = [(phase, step) for phase in PHASES]
        assert events == expected  # the recompute in backward fired no forward events
        assert inner == expected


def test_reentrant_checkpointing_has_forward_events_only():
    """The module's nodes are made during backward, by the recompute: documented limit."""
    model = TinyGPT(checkpointing="reentrant")
    events: list[tuple[str, int]] = []
    on_module(model.blocks[1], **recorder(events))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        model(gpt_input()).float().pow(2).mean().backward()
    assert events == [("forward_start", 0), ("forward_end", 0)]


# ---- the public boundary -----------------------------------------------------------------------
def test_bad_arguments_are_clear_errors():
    lin = nn.Linear(2, 2)
    with pytest.raises(ModProfError, match=r"expected a torch.nn.Module .* got builtins.str"):
        on_module("layer3", backward_start=print)  # type: ignore[arg-type]
    with pytest.raises(ModProfError, match=r"`backward_end` to be a callable .* got int"):
        on_module(lin, backward_end=3)  # type: ignore[arg-type]
    with pytest.raises(ModProfError, match=r"at least one of forward_start"):
        on_module(lin)
    assert hook_counts(lin) == {"<root>": 0}


def test_repr_names_the_module_the_callbacks_and_the_state():
    lin = nn.Linear(2, 2)
    hooks = on_module(lin, forward_start=print, backward_end=print)
    assert repr(hooks) == "ModuleCallbacks(Linear: forward_start, backward_end; 0 calls)"
    hooks.remove()
    assert repr(hooks).endswith("; 0 calls, removed)")


# ---- the example script ------------------------------------------------------------------------
def test_example_script_traces_only_layer3s_backward(tmp_path: Path):
    script = ROOT / "examples" / "layer_backward.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "aten::convolution_backward" in done.stdout  # the printed table
    trace_path = tmp_path / "layer3_backward.json"
    assert done.stdout.rstrip().endswith(
        f"Trace of layer3's backward on step 3 written to {trace_path} "
        "(open it in ui.perfetto.dev)."
    )

    # The same model, built in this process: layer3's nodes as offsets from its first one.
    spec = importlib.util.spec_from_file_location("layer_backward", script)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.build_model()
    into: dict[str, Any] = {}
    seq_range_hooks(model.layer3, into)
    model(torch.randn(2, 3, 32, 32))
    nodes = nodes_in_range(into.pop("root"), into["seq0"], into["seq1"])
    want = {(seq - into["seq0"], name) for seq, name in nodes.items()}

    trace = json.loads(trace_path.read_text())
    traced = {
        (e["args"]["Sequence number"], e["name"].removeprefix(EVALUATE))
        for e in trace["traceEvents"]
        if "Sequence number" in e.get("args", {})
    }
    first = min(seq for seq, _ in traced)
    assert {(seq - first, name) for seq, name in traced} == want
    accumulate = EVALUATE + "torch::autograd::AccumulateGrad"
    accumulated = [e for e in trace["traceEvents"] if e.get("name") == accumulate]
    assert len(accumulated) == sum(1 for _ in model.layer3.parameters())
