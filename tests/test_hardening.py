"""Regressions from the review of the W&B, report, CLI and integration code: warnings turned
into errors never crash training, a refused watch leaves no optimizer hook, undecodable text
reaches files as U+FFFD, and per-module memory is shared once in summaries."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from helpers import disabled_run, profiled
from models import TinyGPT
from test_wandb_log import RecordingRun
from torch import nn

import wandb_modprof
from wandb_modprof._errors import ModProfError
from wandb_modprof.sinks.summary import format_mode_summary
from wandb_modprof.sinks.values import mode_values


def test_warnings_as_errors_never_crash_training(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    reference = TinyGPT()
    reference.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 64, (2, 16))
    run = RecordingRun(fail=True)  # every log raises, like a finished run or a full disk
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="wandb_modprof"):
        warnings.simplefilter("error")  # python -W error / pytest filterwarnings = error
        handle = wandb_modprof.watch(model, log_freq=1, run=run)
        for _ in range(4):
            out = model(tokens).sum()
            out.backward()
            expected = reference(tokens).sum()
            expected.backward()
            assert torch.equal(out, expected)
        handle.unwatch()
    assert run.calls  # logging was attempted and failed
    assert any("could not log modprof/TinyGPT" in r.getMessage() for r in caplog.records)


def test_a_refused_watch_leaves_no_optimizer_hook() -> None:
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = disabled_run()
    handle = wandb_modprof.watch(model, log_freq=2, run=run, optimizer=optimizer)
    hooks = len(optimizer._optimizer_step_post_hooks)
    for _ in range(3):
        with pytest.raises(ModProfError, match="already being watched"):
            wandb_modprof.watch(model, log_freq=2, run=run, optimizer=optimizer)
    assert len(optimizer._optimizer_step_post_hooks) == hooks
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ModProfError, match="timing='device'"):  # refused while building
        wandb_modprof.watch(nn.Linear(2, 2), run=run, optimizer=other, timing="device")
    assert len(other._optimizer_step_post_hooks) == 0
    handle.unwatch()
    assert len(optimizer._optimizer_step_post_hooks) == 0


def _profile_of_a_reused_layer() -> wandb_modprof.Profile:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big = nn.Linear(64, 64)
            self.head = nn.Linear(64, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.big(self.big(x)))

    return profiled(Twice(), torch.randn(4, 64))


def test_undecodable_text_is_written_as_replacement_characters(tmp_path) -> None:
    prof = _profile_of_a_reused_layer()
    path = prof.to_html(tmp_path / "r.html", title="bad\udcffname")  # a non-UTF-8 argv byte
    text = path.read_text("utf-8")
    assert "bad\ufffdname" in text and len(text) > 100_000


def test_per_module_memory_is_shared_once_in_the_summary() -> None:
    prof = _profile_of_a_reused_layer()
    text = format_mode_summary(mode_values(prof, "param"), 10)
    rows = [line for line in text.splitlines() if "big#" in line]
    assert len(rows) == 2
    assert sum("(same)" in row for row in rows) == 1
    assert sum(row.rstrip().endswith("%") for row in rows) == 1
