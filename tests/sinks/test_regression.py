"""The regression gate (`sinks/text/regression.py`, `wandb_modprof.check_regression`, `wandb-modprof
compare --fail-above`) on phantom models, whose module times are known by construction
(`tests/phantom.py`): a module made slower by a known amount fails the gate, the same model
against itself passes, a change its samples' spread explains is not counted, one slow outlier in
either profile does not decide, and a 4x slower module fails with a busy loop on every core."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import wandb_modprof
from tests.phantom import Cost, Phantom
from wandb_modprof import ModProfError
from wandb_modprof.api import cli as _cli
from wandb_modprof.sinks.text.regression import (
    GATED_MODES,
    TOTAL_KEY,
    CheckedCall,
    Side,
    ratio,
    regression_check,
)

# Enough samples that each call's fastest is one no other process stretched, with a busy loop
# on every core (each 2-5 ms window is stretched in about half the samples there; with 5
# samples some of ~30 windows were stretched in all of them).
SAMPLES = 15
STEPS = SAMPLES + 1  # the block's second forward is the untimed structure pass
TIMED = [0, *range(2, STEPS)]  # the steps of the block that are samples


class Weighted(Phantom):
    """The phantom with a parameter: after one step it has a gradient, so the first sample is
    not taken for the process's start-up (and left out of the statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * self.scale)


def _profile(model: Phantom, costs: list[Cost] | None = None) -> wandb_modprof.Profile:
    """`SAMPLES` samples of `model`; `costs[i]`: the cost of `plain.cells.0` in the i-th."""
    x = torch.ones(4, requires_grad=True)
    model(x).sum().backward()  # not the process's first step of this model: no cold start
    cell = model.plain.cells[0]
    with wandb_modprof.profile(model) as prof:
        for step in range(STEPS):
            if costs is not None and step in TIMED:
                cell.cost = costs[TIMED.index(step)]
            model(x).sum().backward()
    assert prof.num_samples == SAMPLES
    return prof


def _slowed(fwd_ms: float, bwd_ms: float) -> Phantom:
    model = Weighted()
    model.plain.cells[0].cost = Cost(fwd_ms, bwd_ms)
    return model


@pytest.fixture(scope="module")
def phantoms() -> dict[str, wandb_modprof.Profile]:
    """The base phantom twice (A/A), and once with `plain.cells.0` (2 + 3 ms) at 3 + 4.5 ms:
    its fwd + bwd x1.5, its stage `plain` (~17 ms) x ~1.15, the model (~51 ms) x ~1.05."""
    return {
        "base": _profile(Weighted()),
        "again": _profile(Weighted()),
        "slow": _profile(_slowed(3.0, 4.5)),
    }


@pytest.mark.accuracy  # timings: run serially, with the cores to themselves
def test_a_module_made_slower_fails_and_the_same_model_passes(phantoms):
    same = wandb_modprof.check_regression(phantoms["base"], phantoms["again"], 1.10)
    assert same.passed, same.format()
    # the model total, the 12 calls (each >= 1 % of it) and the step phases >= 1 % of the step
    assert same.compared == 13 + _phases_over(phantoms["base"], phantoms["again"], 0.01)

    check = wandb_modprof.check_regression(phantoms["base"], phantoms["slow"], 1.10)
    assert not check.passed
    assert [c.key for c in check.regressed] == ["plain.cells.0#0", "plain#0"], check.format()
    cell, stage = check.regressed
    assert 1.4 < cell.fastest_ratio < 1.6 and 1.10 < stage.fastest_ratio < 1.25
    text = check.format()
    assert text.splitlines()[1] == "FAILED: 2 regressed (their fastest samples; A, B: medians):"
    # the model total: x ~1.05 (its median may read more on a busy machine: not counted)
    assert "plain.cells.0#0" in text and TOTAL_KEY not in [c.key for c in check.regressed]

    # the stage holds ~35 % of the step, the cell ~15 %: neither counts above half
    half = wandb_modprof.check_regression(phantoms["base"], phantoms["slow"], 1.10, min_share=0.5)
    # the model total only, and the phases holding half of the step (the backward's)
    assert half.passed, half.format()
    assert half.compared == 1 + _phases_over(phantoms["base"], phantoms["slow"], 0.5)
    # a looser limit than the cell's x1.5 passes; the FLOPs did not change
    assert wandb_modprof.check_regression(phantoms["base"], phantoms["slow"], 1.6).passed
    flops = wandb_modprof.check_regression(phantoms["base"], phantoms["slow"], 1.0, mode="flops")
    assert flops.passed, flops.format()


def _phases_over(a: Any, b: Any, share: float) -> int:
    """The step phases the gate compares at `min_share=share`: measured in both profiles,
    holding `share` of the step (the sum of the phases' medians) in either."""
    pa, pb = a.snapshot().phases, b.snapshot().phases
    return sum(
        1
        for p in pa.median_ms
        if p in pb.median_ms
        and max(pa.median_ms[p] / pa.step_ms(), pb.median_ms[p] / pb.step_ms()) >= share
    )


@pytest.mark.accuracy
def test_a_change_within_the_sample_spread_is_not_counted():
    """The cell goes from ~5 ms to ~17 ms (x3.4): steady samples fail the gate; samples that
    swing between the two values on both sides (the median moves from a low sample to a high
    one, the fastest stays low) are within the spread, not counted."""
    low, high = Cost(2.0, 3.0), Cost(7.0, 10.0)
    steady = regression_check(
        _profile(Weighted(), [low] * SAMPLES), _profile(Weighted(), [high] * SAMPLES), 1.10
    )
    assert [c.key for c in steady.regressed][:1] == ["plain.cells.0#0"], steady.format()

    swinging = regression_check(
        _profile(Weighted(), [low] * 9 + [high] * 6),
        _profile(Weighted(), [low] * 6 + [high] * 9),
        1.10,
    )
    assert swinging.passed, swinging.format()
    (cell,) = [c for c in swinging.within_noise if c.key == "plain.cells.0#0"]
    # the median moved (x3.4 on a quiet machine), the work did not
    assert cell.ratio > 1.10 and cell.fastest_ratio < 1.10
    assert "within the samples' spread, not counted" in swinging.format()


@pytest.mark.accuracy
def test_one_slow_outlier_in_either_profile_does_not_decide():
    """One sample of the cell 10x slower (a pause inside it): in the baseline it hides no
    regression (the cell at x3.75 fails, as its median and spread would have hidden), and in
    the new profile it makes none."""
    low, high, outlier = Cost(2.0, 3.0), Cost(7.5, 11.25), Cost(20.0, 30.0)
    hidden = regression_check(
        _profile(Weighted(), [low] * 7 + [outlier] + [low] * 7),
        _profile(Weighted(), [high] * SAMPLES),
        1.10,
    )
    assert "plain.cells.0#0" in [c.key for c in hidden.regressed], hidden.format()
    (cell,) = [c for c in hidden.regressed if c.key == "plain.cells.0#0"]
    assert 3.4 < cell.fastest_ratio < 4.1
    made = regression_check(
        _profile(Weighted(), [low] * SAMPLES),
        _profile(Weighted(), [low] * 7 + [outlier] + [low] * 7),
        1.10,
    )
    assert made.passed, made.format()


def _runnable() -> int:
    """Tasks running or ready to run on the machine now (`/proc/loadavg`), the most of 5 reads
    10 ms apart; this process's own thread counts 1."""
    try:
        reads = []
        for _ in range(5):
            reads.append(int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]))
            time.sleep(0.01)
        return max(reads)
    except (OSError, ValueError, IndexError):
        return 1


@contextmanager
def busy_cores() -> Iterator[None]:
    """A busy loop on every core, in processes of their own, for the duration: as many as
    make one per core with those already running (the machine may be busy already; two per
    core stretch a 17 ms module in every one of 15 samples, which no statistic sees through)."""
    cores = os.cpu_count() or 1
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(max(0, cores - (_runnable() - 1)))
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


@pytest.mark.accuracy
def test_a_4x_slower_module_fails_and_the_same_model_passes_on_busy_cores():
    with busy_cores():
        base, again = _profile(Weighted()), _profile(Weighted())
        slow = _profile(_slowed(8.0, 12.0))  # plain.cells.0: 2 + 3 ms -> 8 + 12 ms
    same = regression_check(base, again, 1.10)
    assert same.passed, same.format()
    check = regression_check(base, slow, 1.10)
    assert [c.key for c in check.regressed][:1] == ["plain.cells.0#0"], check.format()
    assert 3.5 < check.regressed[0].fastest_ratio < 4.5, check.format()


def test_one_sample_lets_the_ratio_alone_decide():
    one = Weighted()
    x = torch.ones(4, requires_grad=True)
    one(x).sum().backward()
    with wandb_modprof.profile(one) as prof:
        one(x).sum().backward()
    check = regression_check(prof, prof, 1.0)
    assert check.passed  # equal values: a ratio of 1 is not above 1
    assert "its fastest sample is its only one" in check.format()


def test_the_ratios():
    assert ratio(0.0, 2.0) == math.inf and ratio(0.0, 0.0) == 1.0 and ratio(2.0, 3.0) == 1.5
    call = CheckedCall("a#0", "Linear", 0.5, Side(10.0, 4.0, 5), Side(30.0, 4.2, 5))
    assert call.ratio == 3.0 and call.fastest_ratio == pytest.approx(1.05)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fail_above": 0.9}, "fail_above expected a finite ratio >= 1 (e.g. 1.10); got 0.9"),
        ({"fail_above": math.nan}, "fail_above expected a finite ratio >= 1"),
        ({"fail_above": math.inf}, "fail_above expected a finite ratio >= 1"),
        ({"fail_above": "1.1"}, "fail_above expected a ratio >= 1 (e.g. 1.10); got '1.1'"),
        ({"fail_above": True}, "fail_above expected a ratio >= 1"),
        ({"min_share": -0.1}, "min_share expected a fraction in [0, 1]; got -0.1"),
        ({"min_share": math.nan}, "min_share expected a fraction in [0, 1]; got nan"),
        ({"mode": "grad_norm"}, "mode 'grad_norm' has no model total to take shares of"),
        ({"mode": "nope"}, "mode expected one of 'fwd', "),
    ],
)
def test_bad_settings_are_refused(phantoms, kwargs, message):
    with pytest.raises(ModProfError) as error:
        wandb_modprof.check_regression(phantoms["base"], phantoms["base"], **kwargs)
    assert message in str(error.value)


def test_every_mode_with_a_total_gates_and_paths_are_read(phantoms, tmp_path):
    base = phantoms["base"].save(tmp_path / "base.modprof.json")
    for mode in GATED_MODES:
        check = wandb_modprof.check_regression(base, str(base), mode=mode)
        assert check.passed and check.label_a == "base.modprof.json", (mode, check.format())
    with pytest.raises(ModProfError, match=r"new expected a wandb_modprof\.Profile"):
        wandb_modprof.check_regression(base, {"not": "a profile"})  # type: ignore[arg-type]
    with pytest.raises(ModProfError, match="No such file"):
        wandb_modprof.check_regression(base, tmp_path / "missing.modprof.json")


@pytest.fixture(scope="module")
def saved(phantoms, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gate")
    return {name: p.save(folder / f"{name}.modprof.json") for name, p in phantoms.items()}


@pytest.mark.accuracy
def test_the_command_line_gate_exits_1_on_a_regression(saved, capsys):
    argv = ["compare", str(saved["base"]), str(saved["slow"]), "--top", "3"]
    assert _cli.main(argv) == 0  # no gate asked for: a comparison only
    assert "regression check" not in capsys.readouterr().out
    assert _cli.main([*argv, "--fail-above", "1.10"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: 2 regressed" in out and "plain.cells.0#0" in out
    assert _cli.main([*argv, "--fail-above", "1.10", "--min-share", "0.5"]) == 0
    assert "PASSED: no call regressed" in capsys.readouterr().out
    same = ["compare", str(saved["base"]), str(saved["again"]), "--fail-above", "1.1"]
    assert _cli.main(same) == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--min-share", "0.1"], "--min-share expected --fail-above beside it"),
        (["--fail-above", "0.5"], "argument --fail-above: expected a finite ratio >= 1, got 0.5"),
        (["--fail-above", "x"], "argument --fail-above: expected a ratio >= 1, got 'x'"),
        (["--fail-above", "1.1", "--min-share", "2"], "expected a fraction in [0, 1], got 2"),
        (["--fail-above", "1.1", "--mode", "peak"], "mode 'peak' has no model total"),
    ],
)
def test_the_command_line_refuses_bad_gates(saved, capsys, extra, error):
    argv = ["compare", str(saved["base"]), str(saved["again"]), *extra]
    assert _cli.main(argv) == 2
    captured = capsys.readouterr()
    assert error in captured.err and "regression check" not in captured.out
