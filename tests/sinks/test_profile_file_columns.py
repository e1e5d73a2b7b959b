"""Version 8 of the profile file: the columns (`sinks/file/profile_columns.py`), the tables
(`profile_tables.py`), the statistics per metric (`profile_statistics.py`). Each column has one
form, which loading demands; every rule of a record holds for its columns, with the same
messages as version 7."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import math
import re
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models import TinyGPT, gpt_input
from torch import nn

import wandb_modprof
from wandb_modprof import METRICS, ModProfError, ModuleStats, Profile, RunningStat
from wandb_modprof.records.sample import TIME_METRICS
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.records.stat_columns import ColumnMetrics
from wandb_modprof.sinks.file.profile_columns import float_column, floats, floats_column
from wandb_modprof.sinks.file.profile_file import save_profile
from wandb_modprof.sinks.file.profile_schema import FileError

ROOT = "<root>#0"
V7_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_gpt.v7.modprof.json"


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _load(tmp_path: Path, doc: Any) -> Profile:
    path = tmp_path / "bad.modprof.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return wandb_modprof.load(path)


def _refused(tmp_path: Path, doc: Any, message: str) -> None:
    with pytest.raises(ModProfError, match=r"^cannot load '.*bad\.modprof\.json': " + message):
        _load(tmp_path, doc)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small real profile as version 8: three samples (two in the statistics), so times
    vary and sizes do not."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with wandb_modprof.profile(model) as prof:
        for _ in range(4):
            model(torch.randn(3, 4)).sum().backward()
    path = prof.save(tmp_path_factory.mktemp("columns") / "p.modprof.json")
    doc: dict[str, Any] = json.loads(path.read_text())
    assert doc["version"] == 8
    return doc


def _copy(doc: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(doc)


# ---- float columns -------------------------------------------------------------------------
_floats = st.floats() | st.sampled_from([0.0, -0.0, 1.0, 2.0**53, 2.0**53 - 1, -(2.0**60), 5e-324])


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.none() | _floats, max_size=6), same=st.booleans())
def test_a_float_column_reads_back_bit_for_bit_in_its_one_form(
    values: list[float | None], same: bool
) -> None:
    if same and values:
        values = values[:1] * len(values)
    nulls = np.array([v is None for v in values], bool)
    array = np.array([math.nan if v is None else v for v in values], np.float64)
    col = json.loads(json.dumps(float_column(array, nulls)))
    back, back_nulls = floats(col, len(values), True, lambda i: f"x[{i}]", "x")
    got = [
        None if back_nulls is not None and back_nulls[i] else float(v) for i, v in enumerate(back)
    ]
    for v, g in zip(values, got, strict=True):
        assert (v is None) == (g is None)
        if v is not None and g is not None:  # NaN as NaN (its payload kept in base64)
            assert _bits(v) == _bits(g) or (math.isnan(v) and math.isnan(g))
    known = [v for v in values if v is not None]
    all_same = len(values) >= 2 and len({_bits(math.nan if v is None else v) for v in values}) == 1
    if all_same and (not known or len(known) == len(values)):
        assert isinstance(col, dict) and col["times"] == len(values)
    elif all(v.is_integer() and abs(v) < 2**53 and _bits(v) != _bits(-0.0) for v in known
             if math.isfinite(v)) and all(math.isfinite(v) for v in known):  # fmt: skip
        assert isinstance(col, list) and all(type(v) is int or v is None for v in col)
    elif len(known) < len(values):
        assert isinstance(col, list) and None in col
    else:
        assert isinstance(col, str)  # base64


def _b64(*values: float) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}d", *values)).decode("ascii")


_ONE_AND_A_HALF = _b64(1.5)  # "AAAAAAAA+D8=": its last character before "=" holds 2 unused bits


def test_a_float_field_s_none_and_nan_stay_apart() -> None:
    values = (1.5, None, math.nan, -0.0, None)
    col = floats_column(values)
    assert col == [1.5, None, "nan", -0.0, None]
    read, nulls = floats(col, 5, True, str, "x")
    assert nulls is not None and nulls.tolist() == [False, True, False, False, True]
    assert math.isnan(read[2]) and _bits(read[3]) == _bits(-0.0)
    assert floats_column((math.nan, math.nan)) == {"repeat": "nan", "times": 2}
    assert floats_column((None, None)) == {"repeat": None, "times": 2}


@pytest.mark.parametrize(
    ("col", "n", "nullable", "message"),
    [
        (_b64(1.0), 1, False, r"x: expected an array of integers \(whole numbers\), got base64"),
        (_b64(1.5, 2.0), 2, False, None),
        (_ONE_AND_A_HALF[:-1], 1, False, "x: not valid base64"),
        (_ONE_AND_A_HALF.replace("D8=", "D9="), 1, False, r"x: not in canonical base64"),
        (_ONE_AND_A_HALF, 2, False, r"x: expected 16 \(2 numbers\) bytes of base64, got 8"),
        ("*" + _ONE_AND_A_HALF[1:], 1, False, "x: not valid base64"),
        ([1.5, 2.5], 2, False, r"x\[0\]: expected an integer \(else the column is base64\)"),
        ([1, 2.5], 2, False, r"x\[1\]: expected an integer"),
        ([1, 2**53], 2, False, r"x\[1\]: expected an integer with \|x\| < 2\*\*53"),
        ([1, None], 2, False, r'x\[1\]: expected a number or "nan", "inf", "-inf", got null'),
        ([1, None], 2, True, None),
        ([0.5, None, "nan", "-inf", 2**60], 5, True, None),
        ([0.5, None, "evil"], 3, True, r'x\[2\]: expected a number or .* or null, got "evil"'),
        ([None, None], 2, True, r'x: expected \{"repeat": null, "times": 2\}'),
        ([3, 3, 3], 3, False, r'x: expected \{"repeat": 3, "times": 3\}'),
        (_b64(1.5, 1.5), 2, False, r'x: expected \{"repeat": 1.5, "times": 2\}'),
        ({"repeat": 1.5, "times": 1}, 1, False, r"x\.times: expected an integer >= 2, got 1"),
        ({"repeat": 1.5, "times": 3}, 2, False, r"x: expected 2 values \(one per record\), got 3"),
        ({"repeat": 1.5}, 2, False, r'x: missing field "times"'),
        ({"repeat": 1.5, "times": 2, "n": 1}, 2, False, r'x: unknown field "n"'),
        ({"repeat": "fast", "times": 2}, 2, False, r"x\.repeat: expected a number"),
        ({"repeat": None, "times": 2}, 2, False, r"x\.repeat: expected a number .* got null"),
        (7, 1, False, r"x: expected an array, got 7"),
    ],
)
def test_a_float_column_in_another_form_is_refused(
    col: Any, n: int, nullable: bool, message: str | None
) -> None:
    if message is None:  # (the forms that load, beside them)
        floats(col, n, nullable, lambda i: f"x[{i}]", "x")
        return
    with pytest.raises(FileError, match="^" + message):
        floats(col, n, nullable, lambda i: f"x[{i}]", "x")


# ---- the file: tables and statistics --------------------------------------------------------
def test_a_real_profile_is_written_as_columns_and_read_as_arrays(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    assert list(saved)[:3] == ["format", "version", "wandb_modprof_version"]
    invocations = saved["last_sample"]["invocations"]
    assert list(invocations) == INVOCATION_FIELDS and isinstance(invocations["key"], list)
    assert invocations["call_index"] == {"repeat": 0, "times": 4}  # one value, written once
    assert saved["stats"]["key"] == [ROOT, "0#0", "1#0", "2#0"]
    fwd = saved["stats"]["metrics"]["fwd_ms"]
    assert fwd["varied"] is True and isinstance(fwd["std"], str)  # times vary: base64
    sizes = saved["stats"]["metrics"]["param_bytes"]
    assert sizes["varied"] == [] and sizes["std"] == []  # sizes do not: one value each
    assert sizes["count"] == {"repeat": 2, "times": 4} and sizes["mean"][1] == 80  # Linear(4, 4)
    assert list(saved["stats"]["metrics"]) == [m for m in METRICS if m in saved["stats"]["metrics"]]
    prof = _load(tmp_path, saved)
    stats = prof.stats()
    assert all(isinstance(s.metrics, ColumnMetrics) for s in stats.values())
    assert stats[ROOT].metrics["param_bytes"].std == 0.0
    assert prof.snapshot().statistic == "median"


INVOCATION_FIELDS = list(wandb_modprof.InvocationRecord.__dataclass_fields__)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["last_sample"]["invocations"]["key"].__setitem__(1, 7),
            r"last_sample\.invocations\[1\]\.key: expected a string, got 7",
        ),
        (
            lambda d: d["last_sample"]["invocations"].update(key={"repeat": "a#0", "times": 4}),
            r"last_sample\.invocations\.key: expected an array \(a table's first column, or a ",
        ),
        (
            lambda d: d["last_sample"]["runs"].update(kind={"repeat": "node", "times": 10**18}),
            r"last_sample\.runs\.kind: expected an array \(a table's first column",
        ),
        (
            lambda d: d["last_sample"]["memory"].update(t_ms={"repeat": 0, "times": 2**62}),
            r"last_sample\.memory\.t_ms: expected an array \(a table's first column, or a list",
        ),
        (
            lambda d: d["last_sample"]["invocations"].update(
                fwd_ms={"repeat": 1.5, "times": 2**62}
            ),
            r"last_sample\.invocations\.fwd_ms: expected 4 values \(one per record\), got 4611",
        ),
        (
            lambda d: d["stats"]["metrics"]["param_bytes"].update(std=""),
            r'stats\.metrics\["param_bytes"\]\.std: expected an array of integers .* got base64',
        ),
        (
            lambda d: d["structures"]["calls"][0].update(inputs={"repeat": {"a": 1}, "times": 4}),
            r"structures\[0\]\.calls\.inputs\.repeat: expected an array, got an object",
        ),
        (
            lambda d: d["structures"]["calls"][0].update(inputs=[["x"], [["y"]], ["x"], ["x"]]),
            r"structures\[0\]\.calls\[1\]\.inputs\[0\]: expected a string, got an array",
        ),
        (
            lambda d: d["last_sample"]["invocations"]["parent_key"].__setitem__(1, True),
            r"last_sample\.invocations\[1\]\.parent_key: expected a string or null, got true",
        ),
        (
            lambda d: d["last_sample"]["invocations"].update(call_index=[0, 0, 0, 0]),
            r'last_sample\.invocations\.call_index: expected \{"repeat": 0, "times": 4\}',
        ),
        (
            lambda d: d["last_sample"]["invocations"].update(call_index={"repeat": 0, "times": 3}),
            r"last_sample\.invocations\.call_index: expected 4 values \(one per record\), got 3",
        ),
        (
            lambda d: d["last_sample"]["invocations"].update(call_index={"repeat": -1, "times": 4}),
            r"last_sample\.invocations\[0\]\.call_index: expected >= 0 \(a count or size\)",
        ),
        (
            lambda d: d["last_sample"]["invocations"].update(
                call_index={"repeat": "0", "times": 4}
            ),
            r'last_sample\.invocations\.call_index\.repeat: expected an integer, got "0"',
        ),
        (
            lambda d: d["last_sample"]["invocations"]["depth"].pop(),
            r"last_sample\.invocations\.depth: expected 4 values \(one per record\), got 3",
        ),
        (
            lambda d: d["last_sample"]["invocations"].pop("depth"),
            r'last_sample\.invocations: missing field "depth"',
        ),
        (
            lambda d: d["last_sample"]["invocations"].update(extra=[]),
            r'last_sample\.invocations: unknown field "extra"',
        ),
        (
            lambda d: d["last_sample"].update(invocations=[]),
            r"last_sample\.invocations: expected an object \(a table of InvocationRecord\)",
        ),
        (
            lambda d: d["last_sample"]["invocations"]["depth"].__setitem__(1, True),
            r"last_sample\.invocations\[1\]\.depth: expected an integer, got true",
        ),
        (
            lambda d: d["last_sample"]["invocations"]["depth"].__setitem__(1, -1),
            r"last_sample\.invocations\[1\]\.depth: expected >= 0 \(a count or size\), got -1",
        ),
        (
            lambda d: d["last_sample"]["invocations"]["depth"].__setitem__(1, 2**63),
            r"last_sample\.invocations\[1\]\.depth: integer out of range",
        ),
        (
            lambda d: d["stats"]["key"].__setitem__(1, ROOT),
            r'stats\[1\]\.key: "<root>#0" repeats an earlier key',
        ),
        (
            lambda d: d["stats"]["depth"].__setitem__(0, 2),
            r'stats\["<root>#0"\]\.depth: expected 0 \(a call without a parent\), got 2',
        ),
        (
            lambda d: d["stats"]["metrics"].update(evil=d["stats"]["metrics"]["fwd_ms"]),
            r'stats\.metrics\["evil"\]: unknown metric \(known: fwd_ms',
        ),
        (
            lambda d: d["stats"].update(metrics=dict(reversed(d["stats"]["metrics"].items()))),
            r'stats\.metrics\["\w+"\]: out of order: the metrics go in the order fwd_ms, ',
        ),
        (
            lambda d: d["stats"]["metrics"]["fwd_ms"].update(count={"repeat": None, "times": 4}),
            r'stats\.metrics\["fwd_ms"\]\.count: no key has a statistic',
        ),
        (
            lambda d: d["stats"]["metrics"]["fwd_ms"].update(count=[-1, 2, 2, 2]),
            r'stats\["<root>#0"\]\.metrics\["fwd_ms"\]\.count: expected >= 0 \(a count',
        ),
        (
            lambda d: d["stats"]["metrics"]["fwd_ms"].update(count=[2, 2, 2]),
            r'stats\.metrics\["fwd_ms"\]\.count: expected 4 values \(one per record\), got 3',
        ),
        (
            lambda d: d["stats"]["metrics"]["fwd_ms"].update(varied=[0, 1, 2, 3]),
            r'stats\.metrics\["fwd_ms"\]\.varied: expected true \(every key',
        ),
        (
            lambda d: d["stats"]["metrics"]["fwd_ms"].update(varied=[1, 0]),
            r'stats\.metrics\["fwd_ms"\]\.varied\[1\]: expected increasing rows, got 0 after 1',
        ),
        (
            lambda d: d["stats"]["metrics"]["fwd_ms"].update(varied=[9]),
            r'stats\.metrics\["fwd_ms"\]\.varied\[0\]: expected a key with a statistic of fwd_ms',
        ),
        (
            lambda d: d["stats"]["metrics"]["param_bytes"].update(
                varied=[0], std={"repeat": 0, "times": 1}
            ),
            r'stats\.metrics\["param_bytes"\]\.std\.times: expected an integer >= 2, got 1',
        ),
        (
            lambda d: d["stats"]["metrics"]["param_bytes"].update(
                varied=[1], std=[0], min=[80], max=[80], last=[80], median=[80]
            ),
            r'stats\.metrics\["param_bytes"\]\.varied\[0\]: 1 \(stats\["0#0"\]\) has one value',
        ),
        (
            lambda d: d["stats"]["metrics"]["fwd_ms"].pop("median"),
            r'stats\.metrics\["fwd_ms"\]: missing field "median"',
        ),
        (
            lambda d: d["stats"]["metrics"]["fwd_ms"].update(std="AAAA"),
            r'stats\.metrics\["fwd_ms"\]\.std: expected 32 \(4 numbers\) bytes of base64, got 3',
        ),
    ],
)
def test_a_damaged_version_8_file_is_refused_naming_where(
    saved: dict[str, Any], tmp_path: Path, edit: Any, message: str
) -> None:
    doc = _copy(saved)
    edit(doc)
    _refused(tmp_path, doc, message)


# ---- the statistics: the screen at once, then the record rules -----------------------------
_stat_values = st.floats() | st.sampled_from([0.0, -0.0, -1.0, 1e12, 1e13, -1e13, math.inf])


@settings(max_examples=150, deadline=None)
@given(
    metric=st.sampled_from(METRICS),
    count=st.integers(-3, 5),
    values=st.lists(_stat_values, min_size=6, max_size=6),
    no_median=st.booleans(),
)
def test_the_statistics_load_exactly_where_version_7_loads_them(
    metric: str, count: int, values: list[float], no_median: bool
) -> None:
    """The columns' checks (a numpy screen, then the record rules for what it flags) refuse
    exactly what version 7's per-record checks refuse, with the same message."""
    mean, std, low, high, last, median = values
    stat = RunningStat(count, mean, std, low, high, last, None if no_median else median)
    module = ModuleStats(ROOT, "", "M", 0, None, 0, 0, {metric: stat}, None)
    data = ProfileData("M", 1, {ROOT: module}, None, ())
    outcomes: list[tuple[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for version in (7, 8):
            path = save_profile(data, Path(tmp) / f"v{version}.modprof.json", version=version)
            try:
                back = wandb_modprof.load(path).stats()[ROOT].metrics[metric]
            except ModProfError as e:
                outcomes.append(("refused", str(e).split(": ", 1)[1]))
                continue
            cells = [getattr(back, f.name) for f in dataclasses.fields(RunningStat)]
            outcomes.append(("loaded", [_same_bits(v) for v in cells]))
    assert outcomes[0] == outcomes[1], (metric, stat, outcomes)


def _same_bits(value: Any) -> Any:
    """A value to compare: a float by its bits, but any NaN as "nan" (version 7 writes the
    string, version 8 the bits)."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else _bits(value)
    return value


def test_a_time_beyond_the_limit_in_a_statistic_is_refused_with_its_path(tmp_path: Path) -> None:
    stat = RunningStat(2, 1.0, 0.5, 0.5, 1e13, 1.0, 1.0)
    module = ModuleStats(ROOT, "", "M", 0, None, 0, 0, {TIME_METRICS[0]: stat}, None)
    path = save_profile(ProfileData("M", 1, {ROOT: module}, None, ()), tmp_path / "p.json")
    with pytest.raises(ModProfError, match=re.escape('stats["<root>#0"].metrics["fwd_ms"].max')):
        wandb_modprof.load(path)


def test_statistics_a_run_cannot_write_load_as_dicts_with_the_same_values(tmp_path: Path) -> None:
    """A count of 0 or a null median (a version-1 profile's) does not fit the arrays of a
    live profile: such statistics load as dicts of `RunningStat`, in `METRICS` order."""
    zero = RunningStat(0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0)
    unknown = RunningStat(3, 2.0, 1.0, 1.0, 3.0, 3.0, None)
    for metrics in ({"bwd_ms": zero, "fwd_ms": unknown}, {"fwd_ms": unknown}, {"gc_ms": zero}):
        module = ModuleStats(ROOT, "", "M", 0, None, 0, 0, metrics, None)
        data = ProfileData("M", 1, {ROOT: module}, None, ())
        back = wandb_modprof.load(save_profile(data, tmp_path / "p.json")).snapshot()
        loaded = back.stats[ROOT].metrics
        assert type(loaded) is dict and loaded == metrics
        assert list(loaded) == [m for m in METRICS if m in metrics]
        assert back.statistic == ("mean" if "fwd_ms" in metrics else "median")


def test_a_hand_built_profile_with_an_unknown_metric_is_not_saved(tmp_path: Path) -> None:
    module = ModuleStats(ROOT, "", "M", 0, None, 0, 0, {"speed": RunningStat(1, 1, 0, 1, 1, 1)})
    data = ProfileData("M", 1, {ROOT: module}, None, ())
    with pytest.raises(ModProfError, match=r"cannot save stats\[\"<root>#0\"\]: unknown metric"):
        save_profile(data, tmp_path / "p.json")
    module = ModuleStats("other#0", "", "M", 0, None, 0, 0, {})
    data = ProfileData("M", 1, {ROOT: module}, None, ())
    with pytest.raises(ModProfError, match=r'cannot save stats\["<root>#0"\]: .* of "other#0"'):
        save_profile(data, tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()


# ---- size, repeated values, what a small file can ask for ----------------------------------
def test_version_8_is_smaller_than_version_7(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    with wandb_modprof.profile(model) as prof:
        for _ in range(4):
            model(gpt_input()).float().pow(2).mean().backward()
    data = prof.snapshot()
    v7 = save_profile(data, tmp_path / "v7.json", version=7).stat().st_size
    v8 = save_profile(data, tmp_path / "v8.json").stat().st_size
    assert v8 * 3 < v7, (v7, v8)


def test_columns_of_equal_values_are_written_once_and_read_back(tmp_path: Path) -> None:
    """Two records alike but for their keys: every other column, a structure call's inputs
    too, is one repeated value, and reads back as the records. The first column of a table
    and the memory curve's lists (outside a table) say how many values there are: arrays."""
    real = wandb_modprof.load(V7_FIXTURE).snapshot()
    assert real.last is not None and real.last.memory is not None
    inv = dataclasses.replace(real.last.invocations[3], parent_key=None, depth=0, order=0)
    invocations = tuple(dataclasses.replace(inv, key=k) for k in ("a#0", "b#0"))
    run = dataclasses.replace(real.last.runs[0], owner_key="a#0")
    memory = dataclasses.replace(real.last.memory, t_ms=(1.5, 1.5), live_bytes=(8, 8))
    last = dataclasses.replace(real.last, invocations=invocations, runs=(run, run), memory=memory)
    call = dataclasses.replace(
        real.structures[0].calls[3], parent_key=None, depth=0, inputs=("x", "x"),
        compiled_region=None,
    )  # fmt: skip
    calls = tuple(dataclasses.replace(call, key=k, order=i) for i, k in enumerate(("a#0", "b#0")))
    structure = dataclasses.replace(real.structures[0], calls=calls, edges=())
    module = dataclasses.replace(real.stats["blocks.0#0"], parent_key=None, depth=0)
    stats = {k: dataclasses.replace(module, key=k) for k in ("a#0", "b#0")}
    data = ProfileData("M", 3, stats, last, (structure,))
    path = save_profile(data, tmp_path / "p.modprof.json")
    doc = json.loads(path.read_text())
    columns = doc["last_sample"]["invocations"]
    assert columns["fwd_ms"] == {"repeat": inv.fwd_ms, "times": 2}
    assert columns["module_type"] == {"repeat": inv.module_type, "times": 2}
    assert doc["last_sample"]["memory"]["live_bytes"] == [8, 8]
    assert doc["last_sample"]["memory"]["t_ms"] == _b64(1.5, 1.5)
    assert doc["last_sample"]["runs"]["kind"] == ["node", "node"]  # (the first column)
    assert doc["structures"]["calls"][0]["inputs"] == {"repeat": ["x", "x"], "times": 2}
    assert doc["stats"]["metrics"]["fwd_ms"]["mean"] == {
        "repeat": module.mean("fwd_ms"),
        "times": 2,
    }
    back = wandb_modprof.load(path).snapshot()
    assert back.last == last and back.structures == (structure,)
    assert back.stats == stats
    assert save_profile(back, tmp_path / "again.modprof.json").read_bytes() == path.read_bytes()


def test_a_small_file_cannot_make_loading_slow(saved: dict[str, Any], tmp_path: Path) -> None:
    """A value written once for many records is checked once: a hostile edge node (a long
    string of "|", each one a prefix to look up) shared by 5,000 edges is refused at once."""
    doc = _copy(saved)
    n = 5000
    doc["structures"]["edges"][0] = {
        "view_key": [ROOT] * n,  # (the first column: an array)
        "src_key": {"repeat": "|" * 100_000, "times": n},
        "dst_key": {"repeat": ROOT, "times": n},
    }
    started = time.perf_counter()
    _refused(tmp_path, doc, r'structures\[0\]\.edges\[0\]\.src_key: "\|\|\|.*" is not a call')
    assert time.perf_counter() - started < 5.0
