"""The checkpoint planner's parts on synthetic trees: the tree knapsack against exhaustive
search, the kept-bytes estimate, and how modules become items (several calls, shared modules,
unmeasured calls)."""

from __future__ import annotations

import doctest
import importlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wandb_modprof import ModProfError
from wandb_modprof.records.sample import ModuleStats, RunningStat
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.view.checkpoint_knapsack import max_freed, plan_antichain
from wandb_modprof.view.checkpoint_plan import checkpoint_plan


@pytest.mark.parametrize(
    "module", ["records.checkpoint", "view.checkpoint_knapsack", "view.checkpoint_calls"]
)
def test_doctests(module: str):
    result = doctest.testmod(importlib.import_module(f"wandb_modprof.{module}"))
    assert result.failed == 0 and result.attempted > 0


def _ancestors(parents: list[int], i: int) -> set[int]:
    out, p = set(), parents[i]
    while p >= 0:
        out.add(p)
        p = parents[p]
    return out


def _is_antichain(parents: list[int], chosen: list[int]) -> bool:
    return not any(_ancestors(parents, i) & set(chosen) for i in chosen)


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[int], list[int], list[float], list[bool], int]:
    n = draw(st.integers(1, 9))
    parents = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)]
    freed = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    cost = draw(st.lists(st.floats(0.0, 100.0), min_size=n, max_size=n))
    selectable = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    need = draw(st.integers(1, 3000))
    return parents, freed, cost, selectable, need


@settings(max_examples=300, deadline=None)
@given(trees())
def test_the_knapsack_is_optimal_up_to_its_steps(tree):
    """Against every antichain: the plan is one, frees at least `need`, and costs no more
    than the best that frees `need` plus a step per item (what rounding down may lose)."""
    parents, freed, cost, selectable, need = tree
    n, buckets = len(parents), 256
    chosen = plan_antichain(parents, freed, cost, selectable, need, buckets)
    widest, widest_items = max_freed(parents, freed, selectable)
    assert _is_antichain(parents, widest_items)
    assert sum(freed[i] for i in widest_items) == widest
    slack = need + n * need / (buckets - 1)
    best: dict[bool, float] = {}
    for size in range(n + 1):
        for subset in itertools.combinations(range(n), size):
            if not all(selectable[i] for i in subset) or not _is_antichain(parents, list(subset)):
                continue
            total = sum(freed[i] for i in subset)
            assert total <= widest
            for roomy in (False, True):
                if total >= (slack if roomy else need):
                    best[roomy] = min(best.get(roomy, float("inf")), sum(cost[i] for i in subset))
    if chosen is None:
        assert True not in best  # only a need within rounding of the widest is missed
        return
    assert _is_antichain(parents, chosen) and all(selectable[i] for i in chosen)
    assert sum(freed[i] for i in chosen) >= need
    if True in best:
        assert sum(cost[i] for i in chosen) <= best[True] + 1e-9


def test_ten_thousand_items():
    parents = [-1] + [max(0, i - 1 - (i * 7919) % 40) for i in range(1, 10_000)]
    freed = [(i * 104729) % 1_000_000 for i in range(10_000)]
    cost = [((i * 31) % 97) / 10 for i in range(10_000)]
    need = sum(freed) // 40
    chosen = plan_antichain(parents, freed, cost, [True] * 10_000, need)
    assert chosen is not None and sum(freed[i] for i in chosen) >= need
    assert _is_antichain(parents, chosen)


def _stat(value: float) -> RunningStat:
    return RunningStat(1, value, 0.0, value, value, value, value)


def _data(calls: list[tuple[str, str | None, int | None, int, float]]) -> ProfileData:
    """(key, parent key, act_bytes, act_self_bytes, fwd_ms) per call, in forward order."""
    stats = {}
    for order, (key, parent, act, own, fwd) in enumerate(calls):
        name, index = key.split(" > ")[-1].rsplit("#", 1)
        metrics = {"act_self_bytes": _stat(own), "fwd_ms": _stat(fwd), "bwd_ms": _stat(2 * fwd)}
        if act is not None:
            metrics["act_bytes"] = _stat(act)
        stats[key] = ModuleStats(key, name, "Linear", int(index), parent, 0, order, metrics)
    return ProfileData("Net", 1, stats, None, ())


def test_a_module_called_twice_is_one_item_of_both_calls():
    data = _data(
        [
            ("<root>#0", None, 400, 0, 10.0),
            ("block#0", "<root>#0", 200, 0, 3.0),
            ("block.fc#0", "block#0", 50, 50, 1.0),
            ("block.act#0", "block#0", 150, 150, 1.0),
            ("block#1", "<root>#0", 200, 0, 3.0),
            ("block.fc#1", "block#1", 50, 50, 1.0),
            ("block.act#1", "block#1", 150, 150, 1.0),
        ]
    )
    plan = checkpoint_plan(data, 150, call_ms=0.0)
    assert [(c.module_name, c.calls, c.bytes_freed) for c in plan.calls] == [("block", 2, 300)]
    assert plan.recompute_ms == 6.0 and plan.step_ms_now == 30.0 and plan.margin_bytes == 100
    assert plan.predicted_activation_bytes == 100 and plan.predicted_step_ms == 36.0
    assert "over 2 calls" in plan.calls[0].why


def test_each_planned_call_is_priced_with_the_cost_of_checkpointing_it():
    """Two children free what their parent frees for less recompute (1 + 1 ms against 2.5):
    without a cost per call they are chosen; at 1 ms per checkpointed call the parent alone is
    cheaper (3.5 against 4), and the predicted step time holds that cost."""
    data = _data(
        [
            ("<root>#0", None, 400, 0, 10.0),
            ("p#0", "<root>#0", 300, 0, 2.5),
            ("p.a#0", "p#0", 150, 0, 1.0),
            ("p.a.fc#0", "p.a#0", 50, 50, 0.5),
            ("p.a.act#0", "p.a#0", 100, 100, 0.5),
            ("p.b#0", "p#0", 150, 0, 1.0),
            ("p.b.fc#0", "p.b#0", 50, 50, 0.5),
            ("p.b.act#0", "p.b#0", 100, 100, 0.5),
        ]
    )
    free = checkpoint_plan(data, 220, call_ms=0.0)
    assert [c.module_name for c in free.calls] == ["p.a", "p.b"]
    assert free.predicted_step_ms == free.step_ms_now + 2.0 and free.checkpoint_ms == 0.0
    priced = checkpoint_plan(data, 220, call_ms=1.0)
    assert [c.module_name for c in priced.calls] == ["p"]
    assert priced.checkpoint_call_ms == 1.0 and priced.checkpoint_ms == 1.0
    assert priced.predicted_step_ms == priced.step_ms_now + 2.5 + 1.0
    assert "(+1 ms of checkpointing)" in priced.calls[0].why


def test_a_module_shared_by_two_parents_is_left_out():
    data = _data(
        [
            ("<root>#0", None, 400, 0, 10.0),
            ("c#0", "<root>#0", None, 0, 1.0),
            ("a#0", "<root>#0", 200, 0, 3.0),
            ("a.fc#0", "a#0", 50, 50, 1.0),
            ("act#0", "a#0", 150, 150, 1.0),
            ("b#0", "<root>#0", 200, 0, 3.0),
            ("b.fc#0", "b#0", 50, 50, 1.0),
            ("b#0 > act#0", "b#0", 150, 150, 1.0),
        ]
    )
    plan = checkpoint_plan(data, "100%")
    reasons = dict(plan.excluded)
    assert reasons["act#0"].startswith("called from 2 modules (a, b): wrapping the module")
    assert reasons["act#0"].endswith("(and its 1 other call(s))")
    assert reasons["c#0"] == "no act_bytes or fwd_ms measured"
    assert [c.module_name for c in checkpoint_plan(data, 100, call_ms=0.0).calls] == ["a", "b"]


def test_a_shared_output_is_counted_as_kept():
    """`a` ends in a save (200 B) that `b`'s first leaf does not repeat (it saved 0): the same
    storage, which stays saved when `a` is checkpointed."""
    rows: list[tuple[str, str | None, int | None, int, float]] = [
        ("<root>#0", None, 400, 0, 10.0),
        ("a#0", "<root>#0", 300, 0, 3.0),
        ("a.fc#0", "a#0", 100, 100, 1.0),
        ("a.relu#0", "a#0", 200, 200, 1.0),
        ("b#0", "<root>#0", 100, 0, 3.0),
        ("b.fc#0", "b#0", 0, 0, 1.0),
        ("b.out#0", "b#0", 100, 100, 1.0),
    ]
    with pytest.raises(ModProfError, match=r"best reachable is 300 bytes \(75%\), checkpointing b"):
        checkpoint_plan(_data(rows), 0.5)
    rows[5] = ("b.fc#0", "b#0", 50, 50, 1.0)  # b's first leaf saves its own: a's output is not
    plan = checkpoint_plan(_data(rows), 0.5)
    assert plan.module_names == ("a",) and plan.calls[0].bytes_freed == 200


def test_no_activation_bytes_is_an_error():
    data = _data([("<root>#0", None, None, 0, 1.0)])
    with pytest.raises(ModProfError, match="expected a profile with activation bytes measured"):
        checkpoint_plan(data, "50%")
