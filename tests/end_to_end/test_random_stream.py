"""The user's random stream is the unwatched run's: nothing of ours draws from a global generator.

Each twin draws its data and its dropout masks from the global generators (torch's, numpy's,
Python's `random`) at every step, over enough steps to cross samples, structure passes, table
builds and every calibration of a fresh process (their caches are cleared first), and asks for
what users ask for between steps (a table, a plan, a report, a summary). Losses must be equal
bit for bit, and every generator's state equal at the end. `random_state.moved()` must stay
empty: the guard around our own work (`capture.step.random_state`) would hide a draw by
putting the state back, so a draw must also fail here, not only be repaired.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import disabled_run
from models import TinyGPT, gpt_input
from torch import nn

import wandb_modprof
from wandb_modprof.capture.backward import checkpoint_cost
from wandb_modprof.capture.step import hook_cost, random_state
from wandb_modprof.capture.structure import calibration

STEPS = 9


def _fresh_process_caches() -> None:
    """As in a new process: every once-per-process calibration runs again."""
    checkpoint_cost.checkpoint_call_ms.cache_clear()
    calibration.measured_roofline.cache_clear()
    hook_cost._measure.cache_clear()


class _DropoutMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.3), nn.Linear(32, 32), nn.Dropout(0.2)
        )
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _mlp_batch() -> torch.Tensor:
    scale = 1.0 + random.random() + float(np.random.rand())
    return torch.randn(8, 16) * scale


def _gpt_batch() -> torch.Tensor:
    return (gpt_input(batch=2, t=16) + int(random.random() * 3)) % 128


def _states() -> tuple[torch.Tensor, Any, Any]:
    return torch.random.get_rng_state(), np.random.get_state(), random.getstate()


def _train(
    make: Callable[[], nn.Module], batch: Callable[[], torch.Tensor], mode: str, out: Path
) -> tuple[list[float], tuple[torch.Tensor, Any, Any], int]:
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses: list[float] = []
    samples = 0
    if mode == "watch":
        handle = wandb_modprof.watch(model, log_freq=2, optimizer=opt, run=disabled_run())
    for step in range(STEPS):
        if mode == "profile" and step == 1:
            block = wandb_modprof.profile(model, optimizer=opt)
            prof = block.__enter__()
        x = batch()
        y = model(x)
        loss = (y.float() ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if mode == "profile" and step == STEPS - 2:
            block.__exit__(None, None, None)
        if mode != "plain" and step in (4, STEPS - 1):
            # what a user asks for between steps: every one builds tables or plans
            current = handle.profile() if mode == "watch" else prof
            if current.num_samples:
                current.table()
                current.summary()
                current.to_html(out / f"{mode}{step}.html")
                current.checkpoint_plan("50%")
    if mode == "watch":
        samples = handle.unwatch().num_samples
    elif mode == "profile":
        samples = prof.num_samples
    return losses, _states(), samples


class _TinyGPTLogits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gpt = TinyGPT()
        self.drop = nn.Dropout(0.1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.drop(self.gpt(idx))
        return logits


@pytest.mark.parametrize("mode", ["watch", "profile"])
@pytest.mark.parametrize(
    "make, batch", [(_DropoutMLP, _mlp_batch), (_TinyGPTLogits, _gpt_batch)], ids=["mlp", "gpt"]
)
def test_watched_twin_draws_the_unwatched_random_stream(
    make: Callable[[], nn.Module], batch: Callable[[], torch.Tensor], mode: str, tmp_path: Path
) -> None:
    _fresh_process_caches()
    random_state.forget_moved()
    plain_losses, plain_states, _ = _train(make, batch, "plain", tmp_path)
    _fresh_process_caches()
    losses, states, samples = _train(make, batch, mode, tmp_path)
    assert samples >= 2, "the twin must cross samples for the comparison to mean anything"
    assert checkpoint_cost.checkpoint_call_ms.cache_info().currsize == 1  # it was priced
    assert losses == plain_losses
    assert torch.equal(states[0], plain_states[0]), "torch's global generator moved"
    assert (states[1][1] == plain_states[1][1]).all() and states[1][2] == plain_states[1][2]
    assert states[2] == plain_states[2], "Python's random moved"
    assert random_state.moved() == (), random_state.moved()


def test_calibrations_draw_nothing() -> None:
    """Each calibration, run in a fresh state, leaves every generator where it was."""
    _fresh_process_caches()
    random_state.forget_moved()
    before = _states()
    checkpoint_cost.checkpoint_call_ms()
    calibration.measured_roofline("cpu", "float32")
    hook_cost._measure()
    after = _states()
    assert torch.equal(before[0], after[0])
    assert before[2] == after[2]
    assert random_state.moved() == ()


def test_the_guard_puts_a_moved_generator_back_and_says_where(
    caplog: pytest.LogCaptureFixture,
) -> None:
    random_state.forget_moved()
    before = _states()

    @random_state.keeping("a test's own work")
    def draws() -> float:
        np.random.rand()
        random.random()
        return float(torch.rand(()))

    draws()
    after = _states()
    assert torch.equal(before[0], after[0])
    assert (before[1][1] == after[1][1]).all() and before[1][2] == after[1][2]
    assert before[2] == after[2]
    assert random_state.moved() == ("a test's own work",)
    # (warnings are errors in this suite: the guard's warning goes to the log instead)
    assert any("a test's own work drew from a global random" in r.message for r in caplog.records)
    random_state.forget_moved()
