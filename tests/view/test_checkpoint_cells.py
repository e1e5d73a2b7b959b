"""The checkpoint plan the table carries (`view.checkpoint_cells`): per module call its bytes
freed, its "Checkpoint value" (bytes per ms of recompute) and where its module stands in the
plan, which must be the plan `Profile.checkpoint_plan` gives at the same budget; the plan's
meta row; the cases without a plan."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from models import TinyGPT, gpt_input
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.records.checkpoint import STATES
from wandb_modprof.records.modes import mode
from wandb_modprof.view.checkpoint_calls import estimate_calls
from wandb_modprof.view.checkpoint_cells import STATE_CODES
from wandb_modprof.view.columns import CHECKPOINT_COLUMNS
from wandb_modprof.view.graphs import merge

CODE_STATE = {code: state for state, code in STATE_CODES.items()}


def _profile(model: nn.Module, x: torch.Tensor) -> wandb_modprof.Profile:
    torch.manual_seed(0)
    model(x).float().pow(2).mean().backward()
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(x).float().pow(2).mean().backward()
    return prof


@pytest.fixture(scope="module")
def gpt() -> wandb_modprof.Profile:
    torch.manual_seed(0)
    return _profile(TinyGPT(), gpt_input(2, 16))


def _modules(table: Any) -> list[dict[str, Any]]:
    return [r for r in table.resolved() if r["row_kind"] == "node" and r["node_kind"] == "module"]


def _meta(table: Any) -> dict[str, dict[str, Any]]:
    return {str(r["meta_key"]): r for r in table.resolved() if r["row_kind"] == "meta"}


def _measured(row: dict[str, Any], column: str) -> bool:
    return row["missing"] != "*" and column not in str(row["missing"]).split(",")


@pytest.mark.parametrize("budget", ["50%", 0.75, "25%"])
def test_the_table_marks_the_plan_the_api_gives(gpt: wandb_modprof.Profile, budget: Any) -> None:
    plan = gpt.checkpoint_plan(budget)
    table = gpt.table(checkpoint_budget=budget)
    rows = _modules(table)
    marked = {r["module_name"] for r in rows if r["ckpt_state"] == STATE_CODES["planned"]}
    assert plan.module_names and marked == set(plan.module_names)
    # every call of a planned module is marked; no other call is
    for r in rows:
        if r["module_name"] in marked:
            assert r["ckpt_state"] == STATE_CODES["planned"], r["node_key"]
    meta = _meta(table)["ckpt_plan"]
    lines = str(meta["meta_value"]).split("\n")
    n = len(plan.calls)
    assert lines[0].endswith(f": {n} module{'' if n == 1 else 's'}"), lines
    assert meta["meta_number"] == plan.budget_bytes
    extra = plan.predicted_step_ms - plan.step_ms_now
    assert lines[2].startswith("+") and lines[2].endswith(
        f"step time (+{100 * extra / plan.step_ms_now:.3g} %)"
    ), lines


def test_bytes_freed_and_value_are_the_estimates_per_ms_of_forward(
    gpt: wandb_modprof.Profile,
) -> None:
    data = gpt.snapshot()
    tree = merge(data.structures, data.stats.values())
    estimates = {e.call.key: e for e in estimate_calls(tree.calls, data.stats)}
    rows = _modules(gpt.table())
    checked = 0
    for r in rows:
        e = estimates[str(r["node_key"])]
        state = CODE_STATE[int(r["ckpt_state"])]
        if state in ("planned", "candidate"):
            assert r["ckpt_freed_bytes"] == e.freed_bytes
            assert e.fwd_ms is not None
            assert r["ckpt_value"] == pytest.approx(e.freed_bytes / e.fwd_ms, rel=1e-9)
            assert mode("ckpt").value(r) == pytest.approx(r["ckpt_value"])
            checked += 1
    assert checked == len(rows)  # TinyGPT: every module may be planned
    # a leaf frees nothing (its input is what it saved, and the checkpoint keeps it)
    leaves = [r for r in rows if r["module_type"] in ("Linear", "LayerNorm", "GELU")]
    assert leaves and all(r["ckpt_freed_bytes"] == 0 and r["ckpt_value"] == 0 for r in leaves)
    assert max(r["ckpt_value"] for r in rows) > 0


class _Shared(nn.Module):
    """One Linear called from two different parent modules: no tree plan can price it."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(16, 16)
        self.a = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
        self.b = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
        self.a.append(self.shared)
        self.b.append(self.shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_a_module_no_plan_can_take_has_its_state_and_no_value() -> None:
    table = _profile(_Shared(), torch.randn(8, 16)).table()
    rows = _modules(table)
    by_name: dict[str, set[str]] = {}
    for r in rows:
        by_name.setdefault(str(r["module_name"]), set()).add(CODE_STATE[int(r["ckpt_state"])])
        if CODE_STATE[int(r["ckpt_state"])] not in ("planned", "candidate"):
            assert not _measured(r, "ckpt_value") and not _measured(r, "ckpt_freed_bytes")
    shared = [n for n in by_name if n.split(".")[-1] in ("shared", "3")]
    assert shared and all(by_name[n] == {"shared"} for n in shared), by_name
    assert by_name["a"] <= {"planned", "candidate"}


def test_a_budget_no_plan_reaches_is_said_and_nothing_is_marked(
    gpt: wandb_modprof.Profile,
) -> None:
    with pytest.raises(ModProfError):
        gpt.checkpoint_plan(1)
    table = gpt.table(checkpoint_budget=1)
    meta = _meta(table)["ckpt_plan"]
    assert str(meta["meta_value"]).startswith("No plan reaches ")
    assert "the least is " in str(meta["meta_value"])
    assert "meta_number" in str(meta["missing"])
    states = {CODE_STATE[int(r["ckpt_state"])] for r in _modules(table)}
    assert "planned" not in states and "candidate" in states


def test_no_budget_no_plan(gpt: wandb_modprof.Profile) -> None:
    table = gpt.table(checkpoint_budget=None)
    assert "ckpt_plan" not in _meta(table)
    for r in _modules(table):
        assert not any(_measured(r, c) for c in CHECKPOINT_COLUMNS)


@pytest.mark.parametrize("budget", ["half", 0, 1.5, -3, True, "0%", "150%", [0.5]])
def test_a_bad_budget_is_a_clear_error(gpt: wandb_modprof.Profile, budget: Any) -> None:
    with pytest.raises(ModProfError, match=r"checkpoint_budget=.*expected .*; got"):
        gpt.table(checkpoint_budget=budget)


def test_every_state_has_a_code_and_words() -> None:
    from wandb_modprof.records.checkpoint import STATE_TEXT

    assert set(STATE_CODES) == set(STATES) == set(STATE_TEXT)
    assert sorted(STATE_CODES.values()) == list(range(1, len(STATES) + 1))


def test_a_process_without_the_measurement_plans_unpriced_and_says_so(
    gpt: wandb_modprof.Profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process that only builds tables has not imported torch's compiler stack, which
    measuring checkpoint's own cost would (about a second): its table's plan leaves that cost
    out, is the plan priced at 0, and its last line says so."""
    import wandb_modprof.view.checkpoint_cells as cells

    monkeypatch.setattr(cells, "known_call_ms", lambda: None)
    data = gpt.snapshot()
    tree = merge(data.structures, data.stats.values())
    got = cells.checkpoint_cells(data, tree.calls, data.stats)
    ((_, text, _),) = got.meta
    assert text.split("\n")[2].endswith(", checkpointing not priced")
    plan = gpt.checkpoint_plan("50%")  # (priced: this process measured it)
    assert plan.checkpoint_call_ms > 0
    from wandb_modprof.view.checkpoint_plan import checkpoint_plan

    unpriced = checkpoint_plan(data, "50%", call_ms=0.0)
    marked = {
        next(c.module_name for c in tree.calls if c.key == key)
        for key, v in got.values.items()
        if v["ckpt_state"] == STATE_CODES["planned"]
    }
    assert marked == set(unpriced.module_names)


def test_a_table_build_never_takes_the_measurement() -> None:
    """In a fresh process that builds tables, nothing imports `torch._dynamo`, and even with it
    imported (as in a training process) a table build measures nothing; once measured, the
    cost is small and positive and tables use it."""
    import subprocess
    import sys

    code = (
        "import sys; import wandb_modprof.view.table, wandb_modprof.sinks.text.summary\n"
        "from wandb_modprof.capture.backward.checkpoint_cost import known_call_ms, "
        "checkpoint_call_ms\n"
        "print(known_call_ms(), 'torch._dynamo' in sys.modules)\n"
        "import torch._dynamo; print(known_call_ms())\n"
        "cost = checkpoint_call_ms(); print(0 < cost < 50, known_call_ms() == cost)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:3] == ["None False", "None", "True True"], out.stdout
