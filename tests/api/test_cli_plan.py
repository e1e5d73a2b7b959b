"""`wandb-modprof plan PROFILE --budget B`: the plan printed and written as JSON that
`apply_checkpoint_plan` accepts; bad budgets and outputs are usage errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from models import TinyGPT

import wandb_modprof
from wandb_modprof_cli import EXIT_INPUT, EXIT_OK, main


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    model = TinyGPT()
    x = torch.randint(0, 64, (2, 16))
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(x).float().pow(2).mean().backward()
    return prof.save(tmp_path_factory.mktemp("plan") / "gpt.modprof.json"), model


def test_the_plan_is_printed_and_written_as_json_that_applies(
    saved: tuple[Path, torch.nn.Module], capsys: pytest.CaptureFixture[str]
) -> None:
    path, model = saved
    assert main(["plan", str(path), "--budget", "50%"]) == EXIT_OK
    out = capsys.readouterr().out
    written = path.with_name("gpt.plan.json")
    plan = wandb_modprof.CheckpointPlan.from_json(json.loads(written.read_text("utf-8")))
    assert plan.calls and plan.predicted_activation_bytes <= plan.budget_bytes
    assert plan.budget_bytes == pytest.approx(plan.activation_bytes_now / 2, abs=1)
    for name in plan.module_names:
        assert name in out
    assert f"written to {written}" in out
    with wandb_modprof.apply_checkpoint_plan(model, written) as applied:
        assert applied.module_names == plan.module_names
    # a share and a byte count name the same budget
    for budget in ("0.5", str(plan.budget_bytes)):
        other = path.with_name(f"b{budget}.json")
        assert main(["plan", str(path), "--budget", budget, "-o", str(other)]) == EXIT_OK
        same = json.loads(other.read_text("utf-8"))
        assert abs(same["budget_bytes"] - plan.budget_bytes) <= 1


@pytest.mark.parametrize("budget", ["half", "0", "-5%", "150%"])
def test_a_bad_budget_is_a_usage_error(
    saved: tuple[Path, torch.nn.Module], budget: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = saved
    assert main(["plan", str(path), "--budget", budget, "-o", str(path.with_name("x.json"))]) == (
        EXIT_INPUT
    )
    assert "budget" in capsys.readouterr().err


def test_the_plan_never_overwrites_its_profile(
    saved: tuple[Path, torch.nn.Module], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = saved
    before = path.read_bytes()
    assert main(["plan", str(path), "--budget", "50%", "-o", str(path)]) == EXIT_INPUT
    assert path.read_bytes() == before
    assert "is the input profile" in capsys.readouterr().err


def test_summary_in_checkpoint_mode_marks_the_plan_at_half(
    saved: tuple[Path, torch.nn.Module], capsys: pytest.CaptureFixture[str]
) -> None:
    """`summary --mode ckpt`: ranked by bytes freed per ms of recompute, the plan at 50 % (the
    panel's) named line by line and its modules marked as the panel marks them."""
    path, _ = saved
    plan = wandb_modprof.load(path).checkpoint_plan("50%")
    assert main(["summary", str(path), "--mode", "ckpt", "--top", "30"]) == EXIT_OK
    out = capsys.readouterr().out
    n = len(plan.calls)
    assert f"Plan at 50 %: {n} module{'' if n == 1 else 's'}" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    marked = {r[2].split("#")[0] for r in rows if r[1] == "○"}
    assert marked == set(plan.module_names)
