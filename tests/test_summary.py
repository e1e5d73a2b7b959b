"""The terminal summaries (`Profile.summary()`, `wandb-modprof summary --mode`): their numbers
are written by `sinks/units.py` only, and `mode_values` reads the statistics directly, giving
exactly the values the full table (with the layout) gives."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import profiled
from models import TinyGPT, gpt_input

from wandb_modprof.records.sample import ModuleStats, RunningStat
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.sinks.summary import format_summary

TIB = 1024**4
BIG = {"fwd_ms": 999.96, "fwd_self_ms": 999.96, "act_bytes": 2.5 * TIB, "act_self_bytes": 2.5 * TIB}


def _stat(mean: float) -> RunningStat:
    return RunningStat(count=1, mean=mean, std=0.0, min=mean, max=mean, last=mean)


def with_big_values(data: ProfileData) -> ProfileData:
    """`data` with every call's forward at 999.96 ms and activations at 2.5 TiB, and the
    parameters of every call at 2.5 TiB (numbers whose prefix changes when rounded)."""
    assert data.last is not None
    stats: dict[str, ModuleStats] = {}
    for key, s in data.stats.items():
        metrics = dict(s.metrics)
        metrics.update({m: _stat(v) for m, v in BIG.items()})
        metrics["param_bytes"] = _stat(2.5 * TIB)
        stats[key] = dataclasses.replace(s, metrics=metrics)
    totals = dataclasses.replace(data.last.totals, fwd_ms=999.96, act_bytes=int(2.5 * TIB))
    last = dataclasses.replace(data.last, totals=totals)
    return dataclasses.replace(data, stats=stats, last=last)


@pytest.fixture(scope="module")
def big() -> ProfileData:
    torch.manual_seed(0)
    return with_big_values(profiled(TinyGPT(), gpt_input()).snapshot())


def test_the_summary_writes_numbers_as_units_does(big: ProfileData) -> None:
    text = format_summary(big.model_name, big.num_samples, big.stats, big.last, 3)
    assert "last step: forward 1000 ms, backward " in text
    assert text.splitlines()[1].endswith(", activations 2.5 TiB")
    forward = text.split("Top modules by forward time")[1].split("\n\n")[0].splitlines()
    assert forward[1].split() == ["module", "type", "self", "incl"]
    for line in forward[2:]:
        assert line.endswith("1000 ms  1000 ms"), line
    memory = text.split("Top modules by activation memory")[1].splitlines()
    assert all(line.endswith("2.5 TiB  2.5 TiB") for line in memory[2:]), memory
    # aligned: every row of a section as wide as its header
    assert len({len(line) for line in forward[1:]}) == 1
    assert "e+" not in text and "2.56" not in text
