"""FLOP counts survive structure passes that rerun (`capture/structure/kept_counts.py`): a routed
mixture of experts whose sampled steps call other experts than the steps the structure passes
ran on keeps, for every call any pass counted, its FLOPs (and bytes and ops) in the final
profile, whatever sequence the newest graph holds. Before, a graph derived from a sampled step
(no FLOPs) stood in front of the passes' counts: the root's total read 0 and experts the passes
had counted had none.

Expected counts are by construction: a `Linear` without bias is 2 x in x out FLOPs per token,
and nothing else in the model has a FLOP formula (mean, softmax, topk, relu, adds: 0)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import torch
from helpers import disabled_run
from torch import nn

import wandb_modprof
from wandb_modprof.capture.structure.pass_schedule import MAX_STRUCTURES
from wandb_modprof.records.calls import CallInfo
from wandb_modprof.view.graphs import merge

DIM, TOKENS, EXPERTS, TOP_K, HIDDEN = 8, 4, 6, 2, 16
ROUTER_FLOPS = 2 * TOKENS * DIM * EXPERTS
LINEAR_FLOPS = 2 * TOKENS * DIM * HIDDEN  # up and down alike
EXPERT_FLOPS = 2 * LINEAR_FLOPS
TOTAL_FLOPS = ROUTER_FLOPS + TOP_K * EXPERT_FLOPS  # every step: the router and two experts

# Neighbouring pairs: the steps at even and at odd indices each call every expert, and no two
# neighbouring steps call the same pair. Under `watch(log_freq=2)` and under `profile` the
# structure passes take every other step: they see other routes than the sampled steps
# between them (whose graphs are derived, without FLOPs), yet every expert in some pass.
NEIGHBOURS = [(e, (e + 1) % EXPERTS) for e in range(EXPERTS)]
STEPS = 30


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class TopK(nn.Module):
    """Top-2 of 6 experts for the whole batch; the router reads the first features, so the
    input picks the experts (`routed`)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS, bias=False)
        with torch.no_grad():
            self.router.weight.copy_(torch.eye(EXPERTS, DIM))
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.router(x).mean(0).softmax(-1)
        out = x
        for e in sorted(weights.topk(TOP_K).indices.tolist()):
            out = out + weights[e] * self.experts[e](x)
        return out


def routed(experts: tuple[int, ...], seed: int) -> torch.Tensor:
    x = torch.randn(TOKENS, DIM, generator=torch.Generator().manual_seed(seed)) * 0.1
    x[:, list(experts)] += 5.0
    return x


def train(model: TopK, routes: list[tuple[int, int]], steps: int = STEPS) -> None:
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        model(routed(routes[step % len(routes)], step)).sum().backward()


@contextmanager
def watched(model: nn.Module) -> Iterator[Callable[[], wandb_modprof.Profile]]:
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
    result: list[wandb_modprof.Profile] = []
    try:
        yield lambda: result[0]
    finally:
        result.append(handle.unwatch())


@contextmanager
def profiled(model: nn.Module) -> Iterator[Callable[[], wandb_modprof.Profile]]:
    with wandb_modprof.profile(model) as prof:
        yield lambda: prof


Capture = Callable[[nn.Module], AbstractContextManager[Callable[[], wandb_modprof.Profile]]]


def final_calls(prof: wandb_modprof.Profile) -> dict[str, CallInfo]:
    """Each call as the table and the panel read it: the passes merged, newest last."""
    return {c.key: c for c in merge(prof.structures(), prof.stats().values()).calls}


def experts_that_ran(prof: wandb_modprof.Profile) -> list[str]:
    return [key for key, s in prof.stats().items() if s.module_type == "Expert"]


def meta_number(prof: wandb_modprof.Profile, key: str) -> tuple[float, str]:
    (row,) = [r for r in prof.table().records() if r["row_kind"] == "meta" and r["meta_key"] == key]
    return float(row["meta_number"]), str(row["missing"])


def module_missing(prof: wandb_modprof.Profile) -> dict[str, str]:
    """The `missing` cell of every module node row of the table, by call key."""
    return {
        str(r["node_key"]): str(r["missing"])
        for r in prof.table().resolved()
        if r["row_kind"] == "node" and r["node_kind"] == "module"
    }


@pytest.mark.parametrize("capture", [watched, profiled])
def test_every_expert_a_pass_counted_keeps_its_flops_when_routing_reruns_the_pass(
    capture: Capture,
) -> None:
    model = TopK()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # six sequences: under the cap, nothing to warn about
        with capture(model) as result:
            train(model, NEIGHBOURS)
    prof = result()
    # New routes need no pass: every expert a pass did not meet takes the counts of one it
    # did (its twin). At most the first sample's graph, the pass's, and the routed graph.
    assert len(prof.structures()) <= 3 < MAX_STRUCTURES
    ran = experts_that_ran(prof)
    assert len(ran) == EXPERTS  # every expert ran on some sampled step
    calls = final_calls(prof)
    counted = [k for k in ran if calls[k].flops_known and calls[k].fwd_flops > 0]
    assert counted == ran, f"{len(counted)} of {len(ran)} experts that ran have FLOPs"
    for key in ran:
        expert = calls[key]
        assert (expert.fwd_flops, expert.fwd_self_flops) == (EXPERT_FLOPS, 0), key
        # backward: the gradient of the weight; of the input too where it needs one (`down`'s)
        for part, gradients in (("up", 1), ("down", 2)):
            linear = calls[key.replace("#", f".{part}#")]
            assert linear.flops_known and linear.fwd_flops == LINEAR_FLOPS, linear.key
            # the rest of its work is kept with it: bytes and ops, forward and backward
            assert linear.work_known and linear.fwd_bytes > 0 and linear.fwd_ops > 0
            assert linear.bwd_flops == gradients * LINEAR_FLOPS, linear.key
            assert linear.bwd_work_known and linear.bwd_bytes > 0 and linear.bwd_ops > 0
    root = next(iter(calls.values()))
    assert root.parent_key is None and root.flops_known
    assert root.fwd_flops == TOTAL_FLOPS  # (not 0)
    assert meta_number(prof, "total_fwd_flops") == (TOTAL_FLOPS, "")
    assert not any("fwd_flops" in m.split(",") for m in module_missing(prof).values())
    assert prof.flops_unknown == 0


class WideExpert(Expert):
    """An expert of another width: no other expert is its twin (`known_calls.twin_class`)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 2 * HIDDEN, bias=False)
        self.down = nn.Linear(2 * HIDDEN, DIM, bias=False)


def with_wide_expert_2() -> TopK:
    model = TopK()
    model.experts[2] = WideExpert()
    return model


def test_a_call_no_pass_ran_is_counted_as_unknown() -> None:
    """Expert 2, wider than the others, runs on sampled steps only (the passes, on every other
    step, route elsewhere): no count exists for it or its Linears, and no identical expert
    lends it one. They are the only calls without FLOPs, the table lists the FLOP columns in
    their `missing` cell, and `Profile.flops_unknown` counts them."""
    routes = [(0, 1), (2, 3), (4, 5), (1, 2), (3, 4), (0, 5)]  # even indices: no expert 2
    model = with_wide_expert_2()
    with watched(model) as result:
        train(model, routes)
    prof = result()
    calls = final_calls(prof)
    unknown = sorted(k for k, c in calls.items() if not c.flops_known)
    assert unknown == ["experts.2#0", "experts.2.down#0", "experts.2.up#0"]
    assert prof.flops_unknown == len(unknown)
    missing = module_missing(prof)
    for key, cell in missing.items():
        assert ("fwd_flops" in cell.split(",")) == (key in unknown), (key, cell)
    # the others keep their counts, the root's total included
    assert calls["experts.3#0"].fwd_flops == EXPERT_FLOPS
    assert meta_number(prof, "total_fwd_flops") == (TOTAL_FLOPS, "")
    # the table says so too: the panel's Compute modes show the meta row's text
    (row,) = [r for r in prof.table().records() if r.get("meta_key") == "flops_unknown"]
    assert row["meta_number"] == 3
    assert str(row["meta_value"]).startswith("3 calls without FLOPs: no structure pass ran them")


# Every pair of experts once: more routes than `MAX_STRUCTURES`.
ALL_PAIRS = [(0, 2), (2, 4), (2, 3), (1, 2), (2, 5), (0, 3), (0, 4), (1, 4), (1, 5), (0, 5),
             (0, 1), (4, 5), (3, 4), (1, 3), (3, 5)]  # fmt: skip


def test_a_new_route_at_every_step_keeps_every_expert_counted() -> None:
    """Every pair of experts in turn: one pass, no warning about sequences, the root's total
    the one every step has, and every expert that ran counted exactly (its own pass's count,
    or its twin's at the same rows)."""
    model = TopK()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
        train(model, ALL_PAIRS, steps=40)
        passes = len(handle._capture.structures.records)
        prof = handle.unwatch()
    assert passes == 1
    calls = final_calls(prof)
    ran = experts_that_ran(prof)
    assert len(ran) == EXPERTS
    for key in ran:
        assert calls[key].flops_known and calls[key].fwd_flops == EXPERT_FLOPS, key
        assert calls[key].rows == TOKENS and calls[key].rows_linear, key
    root = next(iter(calls.values()))
    assert root.flops_known and root.fwd_flops == TOTAL_FLOPS
    assert prof.flops_unknown == 0


def test_a_derived_graph_is_filled_from_what_the_passes_kept() -> None:
    """`fill` on a graph derived from a sampled step (root -> a, b; no counts): `a`'s own
    counts come from the newest pass that followed it, and so does the root's total where its
    whole subtree is known; `b` no pass followed, so the root falls back to the newest count
    a pass's graph gave it, and `b` stays unknown."""
    from wandb_modprof.capture.structure.kept_counts import fill
    from wandb_modprof.capture.structure.known_calls import KnownCall, KnownCalls
    from wandb_modprof.records.calls import Structure

    def call(key: str, parent: str | None, flops: int | None = None) -> CallInfo:
        """A call without counts; with `flops`: one a pass's graph counted."""
        depth = int(parent is not None)
        return CallInfo(
            key, key, "M", 0, parent, depth, 0, (), (), flops or 0, 0, flops is not None
        )

    known = KnownCalls()
    for key, flops in (("root#0", 1), ("a#0", 10)):
        known.learn(key, KnownCall((), (), flops, 2 * flops, 4 * flops, 1, (), 8 * flops, 1))
    known.learn("a#0", KnownCall((), (), 20, 40, 80, 1, (), 160, 1))  # the newest pass's
    derived = Structure("s", True, (call("root#0", None), call("a#0", "root#0")), ())
    filled, complete = fill(derived, known, {}, {})
    root, a = filled.calls
    assert complete and (a.fwd_flops, a.fwd_self_flops, a.bwd_bytes) == (20, 20, 160)
    assert (root.fwd_flops, root.fwd_self_flops, root.fwd_bytes, root.fwd_ops) == (21, 1, 84, 2)
    assert root.flops_known and root.work_known and root.bwd_work_known

    counted = call("root#0", None, flops=99)
    with_b = Structure("t", True, (*derived.calls, call("b#0", "root#0")), ())
    filled, complete = fill(with_b, known, {"root#0": counted}, {})
    root, a, b = filled.calls
    assert not complete and root.flops_known and root.fwd_flops == 99
    assert a.fwd_flops == 20 and not b.flops_known and not b.bwd_work_known


def test_the_panel_says_which_calls_have_no_flops(chromium: Any) -> None:
    """In the FLOPs mode the panel's banner names how many calls have no count and the card of
    such a call says why; in a time mode neither shows."""
    from wandb_modprof.sinks import spec as _spec

    routes = [(0, 1), (2, 3), (4, 5), (1, 2), (3, 4), (0, 5)]
    model = with_wide_expert_2()
    with watched(model) as result:
        train(model, routes)
    rows = result().table().records()
    panel = chromium.open_panel(_spec.filled({}), rows, width=1100, height=640)
    try:
        assert [i.text for i in panel.items("message") if i.mark == "message" and i.text] == []
        panel.click("mode_entry", lambda i: i.datum.get("key") == "flops")
        banner = [i.text for i in panel.items("message") if i.text and "FLOPs:" in i.text]
        assert banner and "3 calls without FLOPs" in banner[0], banner
        panel.hover("node_rect", lambda i: i.datum.get("node_key") == "experts.2#0")
        lines = [i.text for i in panel.items("card_text") if i.text]
        assert "FLOPs not counted: no structure pass ran this call" in lines, lines
        panel.move_away()
        panel.hover("node_rect", lambda i: i.datum.get("node_key") == "experts.3#0")
        lines = [i.text for i in panel.items("card_text") if i.text]
        assert not any("not counted" in t for t in lines), lines
        assert panel.errors() == []
    finally:
        panel.close()
