"""The `rows` metric: the rows (tokens) each module call processed, its first tensor
argument's element count over its last dimension (`[B, T, D]` -> `B * T`), folded into
statistics like any metric, shown as a table column (the median) and kept by the profile file,
with each structure call's `rows` / `rows_linear`; files written before them still load.

The truth is computed from the inputs fed: batch and sequence sizes vary per step, so the
statistics of a call are those of the rows of the steps the profile counted (its first step
is a structure pass, the first sampled one is left out as the cold start: `cold_left_out`)."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError, Profile
from wandb_modprof.sinks.file.profile_file import VERSION, save_profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# (batch, sequence) per step; the counted steps' rows (the last three: 12, 5, 4) have a median
# (5) apart from their mean (7), so the table's column is told apart from the mean
SIZES = [(2, 3), (3, 5), (4, 3), (1, 5), (2, 2)]


class _KeywordOnly(nn.Module):
    """Takes its tensor as a keyword-only argument."""

    def forward(self, *, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


class _NoTensor(nn.Module):
    """Takes no tensor: an int, and makes one (no rows to measure)."""

    def forward(self, n: int) -> torch.Tensor:
        return torch.ones(n)


class _Model(nn.Module):
    """A stack of Linear layers on a [B, T, D] input, a keyword-only call, a call without a
    tensor argument, and a Linear on the flattened [B * T, D] rows."""

    def __init__(self) -> None:
        super().__init__()
        self.stack = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        self.scale = _KeywordOnly()
        self.bias = _NoTensor()
        self.flat = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.scale(x=self.stack(x)) + self.bias(4)
        return self.flat(y.reshape(-1, 4))


# per call key, its rows as a function of (batch, sequence); None: no tensor argument
TRUTH: dict[str, Any] = {
    "<root>#0": lambda b, t: b * t,
    "stack#0": lambda b, t: b * t,
    "stack.0#0": lambda b, t: b * t,
    "stack.1#0": lambda b, t: b * t,
    "stack.2#0": lambda b, t: b * t,
    "scale#0": lambda b, t: b * t,  # (its keyword-only [B, T, 4] tensor)
    "flat#0": lambda b, t: b * t,  # ([B * T, 4]: 2-D, its rows are its first dimension)
    "bias#0": None,
}


def _profiled(sizes: list[tuple[int, int]] = SIZES) -> Profile:
    torch.manual_seed(0)
    model = _Model()
    data = torch.Generator().manual_seed(1)
    with wandb_modprof.profile(model) as prof:
        for b, t in sizes:
            model(torch.randn(b, t, 8, generator=data)).sum().backward()
    return prof


@pytest.fixture(scope="module")
def prof() -> Profile:
    return _profiled()


def _counted(prof: Profile) -> list[tuple[int, int]]:
    """The sizes of the steps whose samples are in the statistics: the last ones."""
    counted = prof.num_samples - prof.snapshot().cold_left_out
    assert 0 < counted < len(SIZES)
    return SIZES[-counted:]


def test_each_call_s_rows_statistics_are_those_of_its_inputs(prof: Profile) -> None:
    stats = prof.stats()
    assert set(TRUTH) <= set(stats)
    counted = _counted(prof)
    for key, rows_of in TRUTH.items():
        if rows_of is None:
            assert "rows" not in stats[key].metrics, key  # never measured: no statistic
            assert stats[key].count("rows") == 0 and stats[key].typical("rows") is None
            continue
        truth = [rows_of(b, t) for b, t in counted]
        stat = stats[key].metrics["rows"]
        assert stat.count == len(truth), key
        assert stat.mean == pytest.approx(statistics.fmean(truth)), key
        assert (stat.min, stat.max, stat.last) == (min(truth), max(truth), truth[-1]), key
        assert stat.median == statistics.median(truth), key
        assert stat.std == pytest.approx(statistics.pstdev(truth)), key


def test_the_last_sample_s_records_hold_the_last_step_s_rows(prof: Profile) -> None:
    assert prof.last_sample is not None
    b, t = SIZES[-1]
    got = {inv.key: inv.rows for inv in prof.last_sample.invocations}
    assert got == {key: None if f is None else f(b, t) for key, f in TRUTH.items()}


def test_a_plain_sequential_on_2d_inputs_has_the_batch_as_rows() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2))
    batches = [3, 5, 2, 9, 4]
    data = torch.Generator().manual_seed(2)
    with wandb_modprof.profile(model) as prof:
        for b in batches:
            model(torch.randn(b, 6, generator=data)).sum().backward()
    counted = batches[-(prof.num_samples - prof.snapshot().cold_left_out) :]
    for key in ("<root>#0", "0#0", "1#0", "2#0"):
        stat = prof.stats()[key].metrics["rows"]
        assert (stat.count, stat.min, stat.max) == (len(counted), min(counted), max(counted))
        assert stat.mean == pytest.approx(statistics.fmean(counted))


def test_the_table_shows_the_median_rows_and_names_a_call_without_them_missing(
    prof: Profile,
) -> None:
    counted = _counted(prof)
    median = statistics.median(b * t for b, t in counted)
    assert median != statistics.fmean(b * t for b, t in counted)  # (the median, not the mean)
    nodes = {
        r["node_key"]: r
        for r in prof.table().resolved()
        if r["row_kind"] == "node" and r["node_kind"] == "module"
    }
    for key in ("stack#0", "scale#0", "stack.0#0", "stack.2#0", "flat#0"):
        assert nodes[key]["rows"] == median, key
        assert "rows" not in nodes[key]["missing"].split(","), key
    assert nodes["bias#0"]["rows"] == 0.0
    assert "rows" in nodes["bias#0"]["missing"].split(",")


def _with_call_rows(prof: Profile) -> Any:
    """The profile's data with each structure call's `rows` / `rows_linear` set to values
    the file must keep (whatever the structure pass recorded)."""
    data = prof.snapshot()
    structures = tuple(
        dataclasses.replace(
            s,
            calls=tuple(
                dataclasses.replace(c, rows=None if i % 3 == 2 else 10 + i, rows_linear=i % 2 == 0)
                for i, c in enumerate(s.calls)
            ),
        )
        for s in data.structures
    )
    assert structures and structures[0].calls
    return dataclasses.replace(data, structures=structures)


@pytest.mark.parametrize("version", [7, VERSION])
def test_rows_round_trip_through_the_profile_file(
    prof: Profile, version: int, tmp_path: Path
) -> None:
    data = _with_call_rows(prof)
    path = save_profile(data, tmp_path / "p.modprof.json", version=version)
    back = wandb_modprof.load(path)
    for key, stats in prof.stats().items():
        assert dict(back.stats()[key].metrics).get("rows") == dict(stats.metrics).get("rows")
    assert back.stats()["stack#0"].metrics["rows"].count == len(_counted(prof))
    assert back.last_sample == prof.last_sample  # (every record's `rows` with it)
    written = [(c.key, c.rows, c.rows_linear) for s in data.structures for c in s.calls]
    read = [(c.key, c.rows, c.rows_linear) for s in back.structures() for c in s.calls]
    assert read == written and {r for _, r, _ in read} > {None}
    assert {linear for *_, linear in read} == {True, False}
    again = save_profile(back.snapshot(), tmp_path / "again.modprof.json", version=version)
    assert again.read_bytes() == path.read_bytes()


def test_the_version_7_fixture_loads_without_rows() -> None:
    prof = wandb_modprof.load(FIXTURES / "tiny_gpt.v7.modprof.json")
    assert prof.stats() and all("rows" not in s.metrics for s in prof.stats().values())
    assert prof.last_sample is not None and prof.last_sample.invocations
    assert all(inv.rows is None for inv in prof.last_sample.invocations)
    calls = [c for s in prof.structures() for c in s.calls]
    assert calls and all(c.rows is None and not c.rows_linear for c in calls)
    assert all(r["rows"] == 0.0 for r in prof.table().records() if r["row_kind"] == "node")


def _saved(prof: Profile, tmp_path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(prof.save(tmp_path / "p.modprof.json").read_text())
    assert doc["version"] == VERSION
    return doc


def _load(doc: dict[str, Any], tmp_path: Path) -> Profile:
    path = tmp_path / "edited.modprof.json"
    path.write_text(json.dumps(doc))
    return wandb_modprof.load(path)


def test_a_version_8_file_written_before_rows_loads_without_them(
    prof: Profile, tmp_path: Path
) -> None:
    doc = _saved(prof, tmp_path)
    assert "rows" in doc["last_sample"]["invocations"] and "rows" in doc["stats"]["metrics"]
    del doc["last_sample"]["invocations"]["rows"]
    del doc["stats"]["metrics"]["rows"]
    for calls in doc["structures"]["calls"]:
        del calls["rows"], calls["rows_linear"]
    old = _load(doc, tmp_path)
    assert old.last_sample is not None
    assert [i.rows for i in old.last_sample.invocations] == [None] * len(TRUTH)
    assert all("rows" not in s.metrics for s in old.stats().values())
    assert all(c.rows is None and not c.rows_linear for s in old.structures() for c in s.calls)
    # everything else as it was
    assert old.stats()["stack#0"].metrics["fwd_ms"] == prof.stats()["stack#0"].metrics["fwd_ms"]
    assert old.last_sample == dataclasses.replace(
        prof.last_sample,
        invocations=tuple(dataclasses.replace(i, rows=None) for i in prof.last_sample.invocations),
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d, n: d["last_sample"]["invocations"].update(rows=[-1] + [None] * (n - 1)),
            r"last_sample\.invocations\[0\]\.rows: expected >= 0 \(a count or size\), got -1",
        ),
        (
            lambda d, n: d["last_sample"]["invocations"].update(rows=[True] + [None] * (n - 1)),
            r"last_sample\.invocations\[0\]\.rows: expected an integer or null, got true",
        ),
        (
            lambda d, n: d["structures"]["calls"][0].update(rows=[-3] + [None] * (n - 1)),
            r"structures\[0\]\.calls\[0\]\.rows: expected >= 0 \(a count or size\), got -3",
        ),
        (
            lambda d, n: d["structures"]["calls"][0].update(rows_linear=[1] + [False] * (n - 1)),
            r"structures\[0\]\.calls\[0\]\.rows_linear: expected true or false, got 1",
        ),
        (
            lambda d, n: d["structures"]["calls"][0].update(rows_linear=[None] + [True] * (n - 1)),
            r"structures\[0\]\.calls\[0\]\.rows_linear: expected true or false, got null",
        ),
        (
            lambda d, n: d["stats"]["metrics"]["rows"].update(
                varied=[0], std=[0], min=[-1], max=[12], last=[4], median=[5]
            ),
            r'stats\["<root>#0"\]\.metrics\["rows"\]\.min: expected >= 0 \(rows >= 0\), got -1\.0',
        ),
    ],
)
def test_rows_values_out_of_range_are_refused_naming_where(
    prof: Profile, edit: Any, message: str, tmp_path: Path
) -> None:
    doc = _saved(prof, tmp_path)
    n = len(TRUTH)
    assert len(doc["structures"]["calls"][0]["key"]) == n
    edit(doc, n)
    with pytest.raises(ModProfError, match=message):
        _load(doc, tmp_path)
