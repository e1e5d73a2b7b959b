"""The terminal summaries (`Profile.summary()`, `wandb-modprof summary --mode`): their numbers
are written by `view/units.py` only, and `mode_values` reads the statistics directly, giving
exactly the values the full table (with the layout) gives."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

import pytest
import torch
from helpers import profiled, reused_layer_profile
from models import (
    Branchy,
    CustomFunctionModel,
    FrozenStem,
    ResNet,
    Reused,
    TinyGPT,
    TwoBranchCat,
    gpt2_from_config,
    gpt_input,
    resnet_input,
)
from torch import nn

import wandb_modprof
import wandb_modprof.view.layout
import wandb_modprof.view.table
from wandb_modprof.records.modes import MODE_KEYS, mode
from wandb_modprof.records.ranks import RankData
from wandb_modprof.records.roofline import BOUNDS
from wandb_modprof.records.sample import ModuleStats, RunningStat
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.sinks.text.summary import format_mode_summary, format_summary
from wandb_modprof.sinks.text.values import ModeValues, ModuleValue, mode_values
from wandb_modprof.view.checkpoint_cells import STATE_CODES
from wandb_modprof.view.table import build_table

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
    text = format_summary(big, 3)
    assert big.last is not None
    assert f"last sample (step {big.last.step}): forward 1000 ms, backward " in text
    assert text.splitlines()[2].endswith(", activations 2.5 TiB")
    forward = text.split("Top modules by forward time")[1].split("\n\n")[0].splitlines()
    assert forward[1].split() == ["module", "type", "self", "incl"]
    for line in forward[2:]:
        assert line.endswith("1000 ms  1000 ms"), line
    memory = text.split("Top modules by activation memory")[1].splitlines()
    assert all(line.endswith("2.5 TiB  2.5 TiB") for line in memory[2:]), memory
    # aligned: every row of a section as wide as its header
    assert len({len(line) for line in forward[1:]}) == 1
    # (a measured time may read "2.56 ms": only the big values are checked)
    assert "e+" not in text and "2.56 T" not in text and "1e+03" not in text


# ---- mode_values: the statistics read directly equal the table's module rows ---------------


def _missing(row: dict[str, Any], column: str) -> bool:
    """Whether the table row names `column` as missing ("*": every missable column)."""
    missing = str(row["missing"])
    return missing == "*" or column in missing.split(",")


PLANNED = STATE_CODES["planned"]


def _table_values(data: ProfileData, key: str) -> ModeValues:
    """`mode_values` as it was computed before: from the full table (with every view laid
    out), reading the module node rows with `Mode.value` and the mode's meta row."""
    m = mode(key)
    records = build_table(data, 1 << 40).resolved()
    meta = {str(r["meta_key"]): r for r in records if r["row_kind"] == "meta"}
    nodes = [r for r in records if r["row_kind"] == "node" and r["node_kind"] == "module"]
    calls = Counter(str(r["module_name"]) for r in nodes)
    modules = tuple(
        ModuleValue(
            str(r["node_key"]),
            str(r["module_name"]),
            str(r["module_type"]),
            calls[str(r["module_name"])],
            m.value(r),
            None if _missing(r, "gc_samples") else int(r["gc_samples"]),
            # what the mode ranks by (the efficiency mode: time lost) and the class, as written
            None
            if not m.rank_by or any(_missing(r, c) for c in m.rank_by)
            else sum(float(r[c]) for c in m.rank_by),
            "" if not m.bound_by or _missing(r, m.bound_by) else BOUNDS[int(r[m.bound_by]) - 1],
            # the "Checkpoint value" mode: the module is in the table's plan (at 50 %)
            m.key == "ckpt" and not _missing(r, "ckpt_state") and r["ckpt_state"] == PLANNED,
        )
        for r in nodes
    )
    row = meta.get(m.total) if m.total else None
    total = None
    if row is not None and row["missing"] != "meta_number":
        total = float(row["meta_number"])
    statistic = str(meta["statistic"]["meta_value"])
    return ModeValues(data.model_name, data.num_samples, m, modules, total, statistic)


def test_the_efficiency_comparison_is_not_vacuous(profiles: dict[str, ProfileData]) -> None:
    values = mode_values(profiles["resnet"], "eff")
    assert {v.bound for v in values.modules} >= {"compute", "memory"}, values.modules
    assert all(v.rank is not None and v.value is not None for v in values.modules)


def _gpt2() -> ProfileData:
    model = gpt2_from_config()
    x = torch.randint(0, 512, (2, 16))
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(x).logits.float().pow(2).mean().backward()
    return prof.snapshot()


def _with_ranks(data: ProfileData) -> ProfileData:
    """`data` as rank 0 of 3 ranks would hold it: per-rank fwd + bwd of every call (one rank
    slower, one call without ranks, one with a NaN, one at 0 on every rank, one under 1 ms)."""
    keys = list(data.stats)
    fwd_bwd: dict[str, dict[int, float]] = {}
    for i, key in enumerate(keys[:-1]):
        fwd_bwd[key] = {0: 1.0 + i, 1: 2.0 + i, 2: 1.5}
    fwd_bwd[keys[1]] = {0: math.nan, 1: 3.0}
    fwd_bwd[keys[2]] = {0: 0.0, 1: 0.0, 2: 0.0}
    fwd_bwd[keys[3]] = {0: 0.2, 2: 0.6}  # under 1 ms
    ranks = RankData(3, {0: 5, 1: 5, 2: 4}, fwd_bwd, fwd_bwd)
    return dataclasses.replace(data, ranks=ranks)


def _with_odd_numbers(data: ProfileData) -> ProfileData:
    """`data` with the numbers a loaded file can hold: NaN, inf, an int beyond a float."""
    odd = [math.nan, math.inf, 10**400, -math.inf, 0.0]
    stats = {}
    for i, (key, s) in enumerate(data.stats.items()):
        metrics = dict(s.metrics)
        for j, metric in enumerate(sorted(metrics)):
            if (i + j) % 3 == 0:
                value = odd[(i + j) % len(odd)]
                metrics[metric] = dataclasses.replace(metrics[metric], mean=value)
        stats[key] = dataclasses.replace(s, metrics=metrics)
    return dataclasses.replace(data, stats=stats)


@pytest.fixture(scope="module")
def profiles() -> dict[str, ProfileData]:
    torch.manual_seed(0)
    zoo: dict[str, tuple[nn.Module, torch.Tensor]] = {
        "resnet": (ResNet(), resnet_input(batch=2)),
        "tiny_gpt": (TinyGPT(), gpt_input()),
        "reused": (Reused(), torch.randn(4, 32)),
        "frozen": (FrozenStem(), torch.randn(4, 32)),
        "custom_function": (CustomFunctionModel(), torch.randn(4, 32)),
        "branchy": (Branchy(), torch.randn(4, 16)),
        "two_branch_cat": (TwoBranchCat(), torch.randn(4, 16)),
    }
    out = {name: profiled(model, x).snapshot() for name, (model, x) in zoo.items()}
    out["gpt2"] = _gpt2()
    gpt = TinyGPT()
    with wandb_modprof.profile(gpt, structure=False) as prof:
        for _ in range(3):
            gpt(gpt_input()).sum().backward()
    out["no_structure"] = prof.snapshot()
    # A graph but no sample: one forward whose backward never ran inside the block.
    tiny = TinyGPT()
    with wandb_modprof.profile(tiny) as prof:
        tiny(gpt_input())
    out["no_samples"] = prof.snapshot()
    assert out["no_samples"].num_samples == 0 and out["no_samples"].structures
    out["ranks"] = _with_ranks(out["tiny_gpt"])
    out["odd_numbers"] = _with_odd_numbers(out["resnet"])
    return out


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("key", MODE_KEYS)
def test_mode_values_equal_the_tables_in_every_mode(
    profiles: dict[str, ProfileData], key: str
) -> None:
    for name, data in profiles.items():
        fast, slow = mode_values(data, key), _table_values(data, key)
        assert [dataclasses.replace(v, value=None) for v in fast.modules] == [
            dataclasses.replace(v, value=None) for v in slow.modules
        ], name
        for f, s in zip(fast.modules, slow.modules, strict=True):
            assert _same(f.value, s.value), (name, f, s)
        assert _same(fast.total, slow.total), (name, fast.total, slow.total)
        assert (fast.model_name, fast.num_samples, fast.mode) == (
            slow.model_name,
            slow.num_samples,
            slow.mode,
        )
        measured = [v for v in fast.modules if v.value is not None]
        if name in ("resnet", "gpt2") and key in ("fwd", "bwd", "act", "param", "flops"):
            assert measured, (name, key)  # the comparison is not vacuous
        if name in ("resnet", "gpt2") and key == "ckpt":
            assert measured and any(v.planned for v in fast.modules), (name, key)
        if name == "ranks" and key == "imbalance":
            assert len(measured) >= 3, measured


def test_mode_values_and_summary_do_not_lay_out(
    profiles: dict[str, ProfileData], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_layout(*args: object, **kw: object) -> None:
        raise AssertionError("the layout ran")

    monkeypatch.setattr(wandb_modprof.view.layout, "layout_view", no_layout)
    monkeypatch.setattr(wandb_modprof.view.table, "layout_view", no_layout)
    data = profiles["gpt2"]
    for key in MODE_KEYS:
        assert format_mode_summary(mode_values(data, key), 5)
    assert format_summary(data, 5)
    with pytest.raises(AssertionError, match="the layout ran"):  # the patch is in effect
        build_table(data)


def test_per_module_memory_is_shared_once_in_the_summary() -> None:
    prof = reused_layer_profile()
    text = format_mode_summary(mode_values(prof, "param"), 10)
    rows = [line for line in text.splitlines() if "big#" in line]
    assert len(rows) == 2
    assert sum("(same)" in row for row in rows) == 1
    assert sum(row.rstrip().endswith("%") for row in rows) == 1


# ---- names from the model or a file: escaped, never terminal escape sequences ---------------
TITLE_AND_RED = "\x1b]0;owned\x07\x1b[31mRED"  # retitles the terminal, then colours it red
ODD = {"a\x1bb": "a\\x1bb", "注意力": "注意力", "a\ud800": "a\\ud800", "c\x9bd": "c\\x9bd"}


def _profile_with_odd_names() -> wandb_modprof.Profile:
    model = type(TITLE_AND_RED, (nn.Sequential,), {})(nn.Linear(4, 4))
    for name in ODD:
        model._modules[name] = nn.Linear(4, 4)
    torch.manual_seed(0)
    return profiled(model, torch.randn(3, 4))


def _check_shown_escaped(text: str) -> None:
    assert not any((c < " " and c != "\n") or "\x7f" <= c <= "\x9f" for c in text), repr(text)
    text.encode("utf-8")  # no lone surrogate left
    assert "\\x1b]0;owned\\x07\\x1b[31mRED" in text
    for shown in ODD.values():
        assert f"{shown}#0" in text, shown


def _aligned(block: list[str]) -> None:
    """Every line of a table (header and rows) as wide: the widths are the escaped text's."""
    assert len({len(line) for line in block}) == 1, block


def test_summary_shows_names_escaped_and_aligned() -> None:
    prof = _profile_with_odd_names()
    text = prof.summary()
    assert str(prof) == text
    _check_shown_escaped(text)
    forward = text.split("Top modules by forward time\n")[1].split("\n\n")[0].splitlines()
    assert forward[0].split() == ["module", "type", "self", "incl"]
    _aligned(forward)
    for key in ("fwd", "param"):
        shown = format_mode_summary(mode_values(prof, key), 10)
        _check_shown_escaped(shown)
        rows = shown.splitlines()[2:]
        _aligned([r for r in rows if not r.startswith("(")])


def test_compare_shows_names_escaped_and_aligned() -> None:
    from wandb_modprof.sinks.text.compare import compare, format_comparison

    prof = _profile_with_odd_names()
    text = format_comparison(compare(prof, prof, "param", "x\x1b[2J", "y"), 10)
    _check_shown_escaped(text)
    assert "A = x\\x1b[2J (" in text
    _aligned([line for line in text.splitlines() if line.startswith("  ")])
