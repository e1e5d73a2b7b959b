"""The "Load" mode (`view/load.py`) on a routed top-1 mixture of experts with a dead expert
(its router bias far below the others': no token ever goes to it).

Truth by construction: the model records the router's `bincount` at every forward; the load
of an expert is its rows per sampled step (0 on a step that did not call it), its share that
over the experts' sum, the imbalance their max over their mean, the dead expert counted with
0 rows."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from helpers import disabled_run

import wandb_modprof
from wandb_modprof.sinks.text.values import mode_values

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from test_routed_moe import EXPERTS, Top1, batch

DEAD, STEPS = 5, 24


def dead_expert_model() -> Top1:
    torch.manual_seed(0)
    model = Top1()
    model.router = torch.nn.Linear(model.router.in_features, EXPERTS, bias=True)
    with torch.no_grad():
        model.router.bias.zero_()
        model.router.bias[DEAD] = -1e4
    return model


@pytest.fixture(scope="module")
def run() -> tuple[wandb_modprof.Profile, list[list[int]]]:
    model = dead_expert_model()
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    driver = handle._capture.structures
    passes: list[int] = []
    for step in range(STEPS):
        before = driver.passes
        model.zero_grad(set_to_none=True)
        model(batch(step)).pow(2).mean().backward()
        if driver.passes > before:
            passes.append(step)
    prof = handle.unwatch()
    sampled = [model.loads[s] for s in range(STEPS) if s not in passes]
    return prof, sampled[prof.snapshot().cold_left_out :]


def truth(loads: list[list[int]]) -> tuple[list[float], float]:
    per = [sum(load[e] for load in loads) / len(loads) for e in range(EXPERTS)]
    total = sum(per)
    return [100 * p / total for p in per], max(per) / (total / EXPERTS)


def test_each_experts_share_of_the_rows_and_the_lists_imbalance(
    run: tuple[wandb_modprof.Profile, list[list[int]]],
) -> None:
    prof, loads = run
    shares, imbalance = truth(loads)
    assert shares[DEAD] == 0 and imbalance > 1
    rows = {
        str(r["node_key"]): r
        for r in prof.table().resolved()
        if r["row_kind"] == "node" and re.fullmatch(r"experts\.\d+#0", str(r["node_key"]))
    }
    assert sorted(rows) == sorted(f"experts.{e}#0" for e in range(EXPERTS))  # the dead one too
    for e in range(EXPERTS):
        row = rows[f"experts.{e}#0"]
        assert row["load_share"] == pytest.approx(shares[e], rel=1e-9, abs=1e-9), e
        assert row["load_imbalance"] == pytest.approx(imbalance, rel=1e-9), e
        idle = "load_idle_samples" in str(row["missing"]).split(",")
        assert idle == (e != DEAD), e  # only the dead expert sat out every sample
    assert rows[f"experts.{DEAD}#0"]["load_idle_samples"] == len(loads)
    # the summary's values are the table's
    values = {v.key: v.value for v in mode_values(prof, "load").modules}
    for e in range(EXPERTS):
        assert values[f"experts.{e}#0"] == pytest.approx(shares[e], rel=1e-9, abs=1e-9)


def test_the_dead_expert_is_named_and_not_a_call_without_flops(
    run: tuple[wandb_modprof.Profile, list[list[int]]],
) -> None:
    prof, loads = run
    (meta,) = [r for r in prof.table().records() if r.get("meta_key") == "never_called"]
    assert meta["meta_number"] == 1
    assert meta["meta_value"] == f"1 never called in {len(loads)} samples: experts.{DEAD}"
    assert f"experts.{DEAD}#0" not in prof.stats()
    assert prof.flops_unknown == 0
    assert mode_values(prof, "load").plan == (meta["meta_value"],)
