"""The loader's value rules: no repeated key, counts and sizes >= 0, statistics that make
sense, backward runs of a known kind charged to a call of their sample. Each rule is checked
on files of version 8 (columns) and of version 7 (an object per record), written from a real
profile with one value changed, and named with the same message."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.sinks.file.profile_file import VERSION, save_profile

ROOT = "<root>#0"
VERSIONS = [7, VERSION]


@pytest.fixture(scope="module")
def data() -> ProfileData:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
    assert prof.last_sample is not None and prof.last_sample.runs
    return prof.snapshot()


def _edit(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """`value` with the field at `path` (a file's JSON path: `last_sample` is
    `ProfileData.last`) set to `new`."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, ProfileData) and head == "last_sample":
        head = "last"
    if isinstance(value, tuple):
        return (*value[:head], _edit(value[head], rest, new), *value[head + 1 :])
    if isinstance(value, Mapping):
        return {**value, head: _edit(value[head], rest, new)}
    return dataclasses.replace(value, **{head: _edit(getattr(value, head), rest, new)})


def _load(tmp_path: Path, data: ProfileData, version: int) -> None:
    wandb_modprof.load(save_profile(data, tmp_path / "bad.modprof.json", version=version))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("before", "message"),
    [
        ('"format": "evil", ', 'duplicate key "format" in a JSON object'),
        ('"version": 2, ', 'duplicate key "version" in a JSON object'),
        ('"num_samples": 7, ', 'duplicate key "num_samples" in a JSON object'),
    ],
)
def test_a_repeated_key_is_refused(
    data: ProfileData, tmp_path: Path, version: int, before: str, message: str
) -> None:
    saved = save_profile(data, tmp_path / "p.modprof.json", version=version).read_text()
    assert saved.startswith("{")
    path = tmp_path / "bad.modprof.json"
    path.write_text("{" + before + saved[1:])
    with pytest.raises(ModProfError, match=re.escape(message) + "$"):
        wandb_modprof.load(path)


_M = ("stats", ROOT, "metrics", "fwd_ms")
_AT = 'stats["<root>#0"].metrics'
_INV = "last_sample.invocations[0]"
_RUN = "last_sample.runs[0]"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (("num_samples",), -5, "num_samples: expected >= 0 (a count or size), got -5"),
        ((*_M, "count"), -1, f'{_AT}["fwd_ms"].count: expected >= 0'),
        ((*_M, "std"), -0.5, f'{_AT}["fwd_ms"].std: expected >= 0'),
        ((*_M, "min"), 1e9, f'{_AT}["fwd_ms"].min: expected <= max'),
        (
            ("stats", ROOT, "metrics", "param_bytes", "min"),
            -8.0,
            f'{_AT}["param_bytes"].min: expected >= 0',
        ),
        (("stats", ROOT, "order"), -1, 'stats["<root>#0"].order: expected >= 0'),
        (("last_sample", "invocations", 0, "act_bytes"), -1, f"{_INV}.act_bytes: expected >= 0"),
        (
            ("last_sample", "invocations", 0, "param_count"),
            -3,
            f"{_INV}.param_count: expected >= 0",
        ),
        (("last_sample", "invocations", 0, "seq_start"), -2, f"{_INV}.seq_start: expected >= -1"),
        (("last_sample", "step"), -1, "last_sample.step: expected >= 0"),
        (("last_sample", "totals", "act_bytes"), -1, "last_sample.totals.act_bytes: expected >= 0"),
        (
            ("last_sample", "runs", 0, "kind"),
            "evil",
            f'{_RUN}.kind: expected "node" or "recompute", got "evil"',
        ),
        (
            ("last_sample", "runs", 0, "owner_key"),
            "nobody#0",
            f'{_RUN}.owner_key: "nobody#0" is not a key of invocations',
        ),
        (
            ("structures", 0, "calls", 0, "fwd_flops"),
            -1,
            "structures[0].calls[0].fwd_flops: expected >= 0",
        ),
    ],
)
def test_values_out_of_range_are_refused(
    data: ProfileData,
    tmp_path: Path,
    version: int,
    where: tuple[Any, ...],
    value: Any,
    message: str,
) -> None:
    with pytest.raises(
        ModProfError, match=r"^cannot load '.*bad\.modprof\.json': " + re.escape(message)
    ):
        _load(tmp_path, _edit(data, where, value), version)


@pytest.mark.parametrize("version", VERSIONS)
def test_values_at_the_edge_of_the_rules_load_and_one_step_beyond_fail(
    data: ProfileData, tmp_path: Path, version: int
) -> None:
    inv = ("last_sample", "invocations", 0)
    stat = ("stats", ROOT, "metrics")
    edges: list[tuple[tuple[Any, ...], Any]] = [
        (("num_samples",), 0),
        ((*inv, "seq_start"), -1),  # "none", as the profiler writes it
        ((*inv, "fwd_mem_delta_bytes"), -4096),  # memory freed: any sign
        ((*stat, "fwd_ms"), dict(std=math.nan, min=math.nan, max=1.0)),  # NaN passes every rule
        ((*stat, "fwd_self_ms"), dict(min=-1.0, max=-1.0, mean=-1.0, last=-1.0, median=-1.0)),
        ((*stat, "act_bytes"), dict(min=0.0, max=0.0, std=0.0, median=0.0)),
    ]
    edged = data
    for where, edge in edges:
        edged = _edit(edged, where, _value(edged, where, edge))
    _load(tmp_path, edged, version)
    for where, beyond, name in [
        (("num_samples",), -1, "num_samples"),
        ((*inv, "seq_start"), -2, "seq_start"),
        ((*stat, "act_bytes"), dict(min=-1e-300), "min"),
        ((*stat, "act_bytes"), dict(std=-1e-300), "std"),
    ]:
        with pytest.raises(ModProfError, match=rf"{name}: expected >= "):
            _load(tmp_path, _edit(edged, where, _value(edged, where, beyond)), version)


def _value(data: ProfileData, where: tuple[Any, ...], new: Any) -> Any:
    """`new`, or (a dict) the statistic at `where` with those fields changed."""
    if not isinstance(new, dict):
        return new
    stat: Any = data
    for head in where:
        stat = stat[head] if isinstance(stat, Mapping) else getattr(stat, head)
    return dataclasses.replace(stat, **new)
