"""The model's first step in its process (`Sample.cold_start`): marked where the numbers are
shown, left out of the statistics once a later sample exists, skipped with `warmup=`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import disabled_run
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.api import cli as _cli
from wandb_modprof.view.meta import COLD_LEFT_OUT, COLD_ONLY

ROOT = "<root>#0"


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        return self.fc(self.pool(torch.relu(self.conv2(x))).flatten(1))


def _x() -> torch.Tensor:
    return torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _cold_meta(prof: wandb_modprof.Profile) -> list[tuple[str, float]]:
    return [
        (str(r["meta_value"]), float(r["meta_number"]))
        for r in prof.table().records()
        if r["row_kind"] == "meta" and r["meta_key"] == "cold_start"
    ]


def _first_step_in_a_fresh_process() -> None:
    """Run in a fresh interpreter: the CNN's first step there is provably slower (one-time
    start-up), and only that step is marked. One intra-op thread: beside other work on a
    2-core machine, an OpenMP thread that loses its core holds up every parallel op, which
    drowns a one-time cost of a few milliseconds."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, x = SmallCNN(), _x()
    with wandb_modprof.profile(model, structure=False) as first:
        model(x).sum().backward()
    assert first.last_sample is not None and first.last_sample.cold_start is True
    assert "WARNING: the only sample is the model's first step" in first.summary()
    assert _cold_meta(first) == [(COLD_ONLY, 0.0)]
    cold = {k: s.metrics["fwd_ms"].median for k, s in first.stats().items()}
    with wandb_modprof.profile(model, structure=False) as later:
        for _ in range(5):
            model(x).sum().backward()
    assert later.last_sample is not None and later.last_sample.cold_start is False
    assert _cold_meta(later) == [] and "first step" not in later.summary()
    # the fastest warm step: other processes only ever add time, to the cold step as to any
    warm = {k: s.metrics["fwd_ms"].min for k, s in later.stats().items()}
    # what the mark is for: the first step is slower, one module (the first to run a kernel
    # of its kind, or to allocate) several times so
    assert cold[ROOT] > warm[ROOT], (cold, warm)
    assert max(cold[k] / warm[k] for k in warm) > 3, (cold, warm)


@pytest.mark.accuracy  # a timing claim: run serially, with the cores to itself
def test_the_first_step_in_a_process_is_marked_and_provably_slower() -> None:
    here = Path(__file__).resolve().parent
    code = (
        f"import sys; sys.path[:0] = [{str(here.parent)!r}, {str(here)!r}]; "
        "import test_cold_start as t; t._first_step_in_a_fresh_process()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_a_first_step_is_left_out_once_a_later_sample_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, x = SmallCNN(), _x()
    with wandb_modprof.profile(model, structure=False) as prof:
        model(x).sum().backward()
        first = prof.last_sample
        assert first is not None and first.cold_start and prof.num_samples == 1
        for _ in range(3):
            model(x).sum().backward()
    data = prof.snapshot()
    assert data.cold_left_out == 1 and prof.num_samples == 4  # every sample taken
    root = prof.stats()[ROOT].metrics["fwd_ms"]
    assert root.count == 3  # the three later steps only
    assert _cold_meta(prof) == [(COLD_LEFT_OUT, 1.0)]
    assert "first step left out of the statistics" in prof.summary()
    page = prof.to_html(tmp_path / "report.html").read_text()
    assert "left out of the statistics" in page
    # the file keeps both: what was left out, and the mark of the last sample
    saved = prof.save(tmp_path / "p.modprof.json")
    back = wandb_modprof.load(saved)
    assert back.snapshot().cold_left_out == 1 and back.stats() == prof.stats()
    assert _cli.main(["summary", str(saved)]) == 0  # the command line says it too
    assert "first step left out of the statistics" in capsys.readouterr().out


def test_a_model_that_trained_before_is_not_marked() -> None:
    model, x = SmallCNN(), _x()
    model(x).sum().backward()  # a gradient on every parameter: its first step is behind it
    with wandb_modprof.profile(model, structure=False) as prof:
        model(x).sum().backward()
    assert prof.last_sample is not None and prof.last_sample.cold_start is False
    assert prof.snapshot().cold_left_out == 0 and _cold_meta(prof) == []


def test_a_model_trained_with_gradients_cleared_or_forward_only_is_not_marked() -> None:
    """`optimizer.zero_grad()` leaves no gradient behind; the optimizer's in-place updates
    (`_version`) and a batch norm's batch count still say the model ran before."""
    x = _x()
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    with wandb_modprof.profile(model, structure=False) as prof:
        model(x).sum().backward()
    assert prof.last_sample is not None and prof.last_sample.cold_start is False
    forward_only = SmallCNN()
    with torch.no_grad():
        forward_only(x)  # train mode: bn1 counts the batch
    with wandb_modprof.profile(forward_only, structure=False) as prof:
        forward_only(x).sum().backward()
    assert prof.last_sample is not None and prof.last_sample.cold_start is False
    fresh = SmallCNN()
    with wandb_modprof.profile(fresh, structure=False) as prof:
        fresh(x).sum().backward()
    assert prof.last_sample is not None and prof.last_sample.cold_start is True


def test_warmup_runs_the_first_steps_untimed() -> None:
    model, x = SmallCNN(), _x()
    with wandb_modprof.profile(
        model, structure=False, settings=wandb_modprof.Settings(warmup=2)
    ) as prof:
        for _ in range(2):
            model(x).sum().backward()
        assert prof.num_samples == 0
        model(x).sum().backward()
    assert prof.num_samples == 1
    assert prof.last_sample is not None and prof.last_sample.cold_start is False
    other = SmallCNN()
    handle = wandb_modprof.watch(
        other,
        log_freq=1,
        run=disabled_run(),
        settings=wandb_modprof.Settings(warmup=3, offload=False),
        structure=False,
    )
    try:
        for _ in range(5):
            other(x).sum().backward()
    finally:
        prof = handle.unwatch()
    assert prof.num_samples == 2 and prof.snapshot().cold_left_out == 0


def test_the_worker_process_leaves_the_first_step_out_too() -> None:
    model, x = SmallCNN(), _x()
    handle = wandb_modprof.watch(
        model,
        log_freq=1,
        run=disabled_run(),
        structure=False,
        settings=wandb_modprof.Settings(offload=True),
    )
    try:
        for _ in range(4):
            model(x).sum().backward()
    finally:
        prof = handle.unwatch()
    data = prof.snapshot()
    assert data.cold_left_out == 1 and data.num_samples == 4
    assert prof.stats()[ROOT].metrics["fwd_ms"].count == 3


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1"])
def test_a_bad_warmup_is_refused(bad: object) -> None:
    with pytest.raises(ModProfError, match="warmup must be an integer >= 0"):
        wandb_modprof.profile(SmallCNN(), settings=wandb_modprof.Settings(warmup=bad))  # type: ignore[arg-type]
