"""The loader's value rules: no repeated key, counts and sizes >= 0, statistics that make
sense, backward runs of a known kind charged to a call of their sample."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError

ROOT = "<root>#0"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
    assert prof.last_sample is not None and prof.last_sample.runs
    return prof.save(tmp_path_factory.mktemp("rules") / "p.modprof.json").read_text()


def _load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.modprof.json"
    path.write_text(text)
    wandb_modprof.load(path)


@pytest.mark.parametrize(
    ("before", "message"),
    [
        ('"format": "evil", ', 'duplicate key "format" in a JSON object'),
        ('"version": 2, ', 'duplicate key "version" in a JSON object'),
        ('"num_samples": 7, ', 'duplicate key "num_samples" in a JSON object'),
    ],
)
def test_a_repeated_key_is_refused(saved: str, tmp_path: Path, before: str, message: str) -> None:
    assert saved.startswith("{")
    with pytest.raises(ModProfError, match=re.escape(message) + "$"):
        _load(tmp_path, "{" + before + saved[1:])


def _stat(doc: dict[str, Any], metric: str) -> dict[str, Any]:
    stat: dict[str, Any] = doc["stats"][ROOT]["metrics"][metric]
    return stat


_M = ("stats", ROOT, "metrics", "fwd_ms")
_AT = 'stats["<root>#0"].metrics'
_INV = "last_sample.invocations[0]"
_RUN = "last_sample.runs[0]"


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
    saved: str, tmp_path: Path, where: tuple[Any, ...], value: Any, message: str
) -> None:
    doc = json.loads(saved)
    node = doc
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    with pytest.raises(
        ModProfError, match=r"^cannot load '.*bad\.modprof\.json': " + re.escape(message)
    ):
        _load(tmp_path, json.dumps(doc))


def test_values_at_the_edge_of_the_rules_load_and_one_step_beyond_fail(
    saved: str, tmp_path: Path
) -> None:
    doc = json.loads(saved)
    inv = doc["last_sample"]["invocations"][0]
    doc["num_samples"] = 0
    inv["seq_start"] = -1  # "none", as the profiler writes it
    inv["fwd_mem_delta_bytes"] = -4096  # memory freed: any sign
    _stat(doc, "fwd_ms").update(std="nan", min="nan", max=1.0)  # NaN passes every rule
    _stat(doc, "fwd_self_ms").update(min=-1.0, max=-1.0, mean=-1.0, last=-1.0, median=-1.0)
    _stat(doc, "act_bytes").update(min=0.0, max=0.0, std=0.0, median=0.0)
    _load(tmp_path, json.dumps(doc))
    for node, name, beyond in [
        (doc, "num_samples", -1),
        (inv, "seq_start", -2),
        (_stat(doc, "act_bytes"), "min", -1e-300),
        (_stat(doc, "act_bytes"), "std", -1e-300),
    ]:
        edge, node[name] = node[name], beyond
        with pytest.raises(ModProfError, match=rf"{name}: expected >= "):
            _load(tmp_path, json.dumps(doc))
        node[name] = edge
