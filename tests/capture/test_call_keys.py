"""Call keys name the same work on every step (`capture/forward/call_keys`): a mixture of
experts that routes each step to different experts through one shared activation module keeps
one key per expert's activation; ordinary models keep their `name#k` keys."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import disabled_run
from models import (
    BATCH,
    EXPERTS,
    TOP_K,
    CustomFunctionModel,
    FrozenStem,
    KwargsDictModel,
    MoEModel,
    ResNet,
    Reused,
    TinyGPT,
    TwoBranchCat,
    gpt2_from_config,
    gpt_input,
    hidden,
    resnet_input,
    route_of,
    routed_input,
)
from torch import nn

import wandb_modprof
from wandb_modprof.capture.forward.call_keys import KEY_SEPARATOR, CallKeys
from wandb_modprof.capture.forward.invocation import tensors_in
from wandb_modprof.view.graphs import merge, view_graphs

# the experts each step routes to: every expert is used, in changing company and positions
ROUTES = [(0, 1), (2, 3), (1, 3), (0, 2), (1, 2), (0, 3), (2, 3), (0, 1)]


def act_key(expert: int) -> str:
    return f"moe.experts.{expert}#0{KEY_SEPARATOR}moe.act_fn#0"


def run_moe(steps: int, log_freq: int = 1) -> Any:
    torch.manual_seed(0)
    model = MoEModel()
    handle = wandb_modprof.watch(model, log_freq=log_freq, run=disabled_run())
    for step in range(steps):
        model(routed_input(ROUTES[step % len(ROUTES)], step)).pow(2).mean().backward()
    return handle.unwatch()


def test_a_shared_activation_keeps_one_key_per_expert(tmp_path: Path) -> None:
    prof = run_moe(len(ROUTES))
    prof.save(tmp_path / "moe.modprof.json")  # prefixed keys pass the file's call-tree rules
    assert wandb_modprof.load(tmp_path / "moe.modprof.json").stats().keys() == prof.stats().keys()
    stats = prof.stats()
    assert prof.num_samples >= 4
    for e in range(EXPERTS):
        act = stats[act_key(e)]
        assert act.parent_key == f"moe.experts.{e}#0"
        # Only expert e's activation ever folded into its key: its saved input, BATCH x
        # hidden(e) floats, is the same in every sample (another expert's differs in size).
        saved = act.metrics["act_self_bytes"]
        assert saved.min == saved.max == BATCH * hidden(e) * 4
        # ... and it was sampled exactly when its expert was
        assert saved.count == stats[f"moe.experts.{e}#0"].metrics["fwd_ms"].count
    # no key mixes experts: every call of the shared module is under one expert's call
    shared = [k for k, s in stats.items() if s.module_name == "moe.act_fn"]
    assert sorted(shared) == sorted(act_key(e) for e in range(EXPERTS))
    # the structure pass and the graphs derived from timed steps use the same keys
    assert prof.structures()
    for structure in prof.structures():
        for call in structure.calls:
            assert call.key in stats
            if call.module_name == "moe.act_fn":
                assert call.key == f"{call.parent_key}{KEY_SEPARATOR}moe.act_fn#0"


def test_counting_per_name_would_have_mixed_the_experts() -> None:
    """The old key (the k-th call of `moe.act_fn` in the step) names different experts on
    different steps of this model: what the test above would catch."""
    torch.manual_seed(0)
    model = MoEModel()
    widths: list[int] = []
    handle = model.moe.act_fn.register_forward_pre_hook(
        lambda m, args: widths.append(args[0].shape[-1])
    )
    for step, route in enumerate(ROUTES):
        before = len(widths)
        model(routed_input(route, step))
        assert widths[before:] == [hidden(e) for e in sorted(route)]  # the routing worked
    handle.remove()
    firsts = widths[::TOP_K]  # what `moe.act_fn#0` would have folded, step after step
    assert len(set(firsts)) > 1


Case = tuple[Callable[[], nn.Module], Callable[[], Any]]
ZOO: dict[str, Case] = {
    "resnet": (lambda: ResNet(widths=(8, 16)), lambda: resnet_input(2, 16)),
    "tiny_gpt": (TinyGPT, lambda: gpt_input(2, 16)),
    "reused": (Reused, lambda: torch.randn(4, 32)),
    "kwargs_dict": (KwargsDictModel, lambda: torch.randn(4, 32)),
    "two_branch_cat": (TwoBranchCat, lambda: torch.randn(4, 16)),
    "frozen_stem": (FrozenStem, lambda: torch.randn(4, 32)),
    "custom_function": (CustomFunctionModel, lambda: torch.randn(4, 32)),
    "gpt2": (
        lambda: gpt2_from_config(layers=2),
        lambda: torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0)),
    ),
}


def per_name_keys(model: nn.Module, x: Any) -> list[str]:
    """The keys as they were before `call_keys`: `name#k`, `k` counting calls of that name in
    the step (plain module hooks, nothing of ours)."""
    names = {id(m): (n or "<root>") for n, m in model.named_modules()}
    counts: dict[str, int] = {}
    keys: list[str] = []

    def pre(module: nn.Module, args: Any) -> None:
        name = names[id(module)]
        keys.append(f"{name}#{counts.get(name, 0)}")
        counts[name] = counts.get(name, 0) + 1

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return keys


@pytest.mark.parametrize("case", sorted(ZOO))
def test_ordinary_models_keep_their_keys(case: str) -> None:
    make, data = ZOO[case]
    torch.manual_seed(0)
    model = make()
    x = data()
    expected = per_name_keys(model, x)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):  # timed (graph derived), the structure pass, timed
            out = model(x)
            loss = sum(t.float().pow(2).mean() for t in tensors_in(out) if t.requires_grad)
            loss.backward()  # type: ignore[union-attr]
    assert [r.key for r in prof.invocations()] == expected
    for structure in prof.structures():
        assert [c.key for c in structure.calls] == expected


def test_the_rule_on_call_sequences() -> None:
    """Exact keys for the cases of the rule: nested calls, a shared module, a container called
    twice (its second call's children are keyed under it), recursion."""
    keys = CallKeys()
    calls = [
        ("<root>", -1),  # 0
        ("blocks.0", 0),  # 1: nested in the root's call
        ("blocks.0.fc", 1),  # 2
        ("blocks.0.fc", 1),  # 3: reused in the same call: #1, as always
        ("shared", 1),  # 4: not inside blocks.0: keyed under its caller
        ("shared.inner", 4),  # 5: inside a prefixed call: keyed under it too
        ("blocks.0", 0),  # 6: the container's second call
        ("blocks.0.fc", 6),  # 7: keyed under that call
        ("rec", 0),  # 8
        ("rec", 8),  # 9: recursion stays nested
        ("rec.fc", 9),  # 10: and its children too
        ("<root>", 0),  # 11: a root that calls itself
        ("blocks.0", 11),  # 12
    ]
    got = [keys.enter(name, caller)[0] for name, caller in calls]
    assert got == [
        "<root>#0",
        "blocks.0#0",
        "blocks.0.fc#0",
        "blocks.0.fc#1",
        "blocks.0#0 > shared#0",
        "blocks.0#0 > shared#0 > shared.inner#0",
        "blocks.0#1",
        "blocks.0#1 > blocks.0.fc#0",
        "rec#0",
        "rec#1",
        "rec.fc#0",
        "<root>#1",
        "blocks.0#2",
    ]


# ---- calls that appear after the graph was drawn ------------------------------------------
def routed_watch(steps: int) -> Any:
    torch.manual_seed(0)
    model = MoEModel()
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
    for step in range(1, steps + 1):
        model(routed_input(route_of(step), step)).pow(2).mean().backward()
    return handle.unwatch()


def unlinked_modules(prof: Any) -> set[str]:
    """Module nodes drawn with no edge in their parent's view."""
    out: set[str] = set()
    for graph in view_graphs(merge(prof.snapshot().structures, prof.stats().values())):
        linked = {e.src_key for e in graph.edges} | {e.dst_key for e in graph.edges}
        out |= {n.node_key for n in graph.nodes if n.kind == "module"} - linked
    return out


def meta_of(prof: Any) -> dict[str, dict[str, Any]]:
    return {r["meta_key"]: r for r in prof.table().records() if r["row_kind"] == "meta"}


def test_calls_seen_only_on_sampled_steps_get_their_edges() -> None:
    prof = routed_watch(8)
    stats = prof.stats()
    assert all(f"moe.experts.{e}#0" in stats for e in range(EXPERTS))
    # experts 2 and 3 never ran on a structure pass's step: sampled steps derived their graph
    assert unlinked_modules(prof) == set()
    derived = [s for s in prof.structures() if not all(c.flops_known for c in s.calls)]
    assert derived
    assert "unseen_calls" not in meta_of(prof)


def test_calls_no_graph_saw_are_flagged() -> None:
    """After 4 steps expert 2 ran only on step 2, the first sample with a new sequence (which
    no graph was derived from, since the sequence was not yet known to vary): its calls have
    no edges, and the table and the panel say so."""
    prof = routed_watch(4)
    unlinked = unlinked_modules(prof)
    assert unlinked == {
        "moe.experts.2#0",
        "moe.experts.2.w1#0",
        "moe.experts.2.w2#0",
        act_key(2),
    }
    row = meta_of(prof)["unseen_calls"]
    assert row["meta_number"] == len(unlinked)
    assert "appeared after the graph was drawn" in row["meta_value"]
    svg = prof.to_svg()  # the panel's banner (vl-convert renders the spec)
    assert "appeared after the graph was drawn" in svg


def test_tables_without_unseen_calls_have_no_such_row() -> None:
    prof = run_moe(len(ROUTES))
    assert unlinked_modules(prof) == set()
    assert "unseen_calls" not in meta_of(prof)
