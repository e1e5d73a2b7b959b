"""Every file the loader accepts goes through every sink: generated files (a real profile with
values set to extremes, times reversed, calls repeated or re-parented, at random JSON paths,
fixed seed) are either refused by `load` with a ModProfError naming the field and the rule, or
give a summary, a table, an HTML report, a Chrome trace that is strict JSON, a comparison, the
W&B rows and (every 10th) an SVG, with no exception but ModProfError.

The values are changed at a record's JSON path in version 7's layout (an object per record); a
file that loads is saved again as version 8 (columns) and that file must load too, to the same
profile, and is the one drawn: version 8 holds whatever version 7 holds."""

from __future__ import annotations

import copy
import json
import math
import random
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.sinks.file.profile_file import save_profile
from wandb_modprof.sinks.text.compare import compare, format_comparison
from wandb_modprof.sinks.wandb import packed

SEED = 20261202
CASES = 180

_VALUES: list[Any] = [
    0, -1, 1, 0.5, -0.5, 1e-300, 1e12, -1e12, 1e13, 1e15, 1e300, 1e308, -1e308, 2**62,
    -(2**62), 2**63 - 1, -(2**63), "nan", "inf", "-inf",
]  # fmt: skip


class _Model(nn.Module):
    """A module called twice, a nested one, a ReLU: a small real profile with runs."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.block(x)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _Model()
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(torch.randn(3, 4)).sum().backward()
    path = save_profile(prof.snapshot(), tmp_path_factory.mktemp("sinks") / "p.json", version=7)
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _numbers(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The JSON path of every number (and non-finite number string) in `doc`."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _numbers(v, (*at, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _numbers(v, (*at, i))]
    is_number = isinstance(doc, (int, float)) and not isinstance(doc, bool)
    return [at] if is_number or doc in ("nan", "inf", "-inf") else []


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[part]
    doc[path[-1]] = value


def _extremes(rng: random.Random, doc: dict[str, Any]) -> str:
    paths = _numbers(doc)
    picked = rng.sample(paths, rng.randint(1, 3))
    for path in picked:
        _set(doc, path, rng.choice(_VALUES))
    return f"values at {picked}"


def _plausible(rng: random.Random, doc: dict[str, Any]) -> str:
    """Values the rules allow, at their edges: zero, NaN, times of hours to the limit, sizes
    near 2**62 (what a file may hold and every sink must draw)."""
    paths = _numbers(doc)
    picked = rng.sample(paths, rng.randint(1, 4))
    for path in picked:
        old = _get(doc, path)
        if isinstance(old, int) and not isinstance(old, bool):
            value: Any = rng.choice([0, 1, 2**40, 2**62, old])
        else:
            value = rng.choice([0.0, "nan", 1e-300, 3.6e6, 1e11, 1e12, abs(float(old)) * 1e6])
        _set(doc, path, value)
    return f"plausible values at {picked}"


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _extreme_time(rng: random.Random, doc: dict[str, Any]) -> str:
    """A time of the last sample (what the summary, the timeline and the trace draw)."""
    sample = doc["last_sample"]
    paths = [p for p in _numbers(sample) if str(p[-1]).endswith("_ms")]
    path = rng.choice(paths)
    value = rng.choice([1e308, -1e308, 1e300, 1e15, 1e13, -1e13, "inf", "-inf", "nan"])
    _set(sample, path, value)
    return f"last_sample{list(path)} = {value}"


def _reversed_times(rng: random.Random, doc: dict[str, Any]) -> str:
    sample = doc["last_sample"]
    if rng.random() < 0.5 and sample["runs"]:
        run = rng.choice(sample["runs"])
        run["start_ms"], run["end_ms"] = run["end_ms"] + 1.0, run["start_ms"]
        return "a run that ends before it starts"
    inv = rng.choice(sample["invocations"])
    field = rng.choice(["fwd_ms", "bwd_ms", "fwd_wall_ms", "bwd_span_ms", "recompute_ms"])
    inv[field] = -abs(inv.get(field) or 1.0)
    return f"a negative {field}"


def _tree(rng: random.Random, doc: dict[str, Any]) -> str:
    invs = doc["last_sample"]["invocations"]
    if rng.random() < 0.5:
        invs.append(copy.deepcopy(rng.choice(invs)))
        return "a repeated call key"
    a, b = rng.sample(range(len(invs)), 2)
    invs[a]["parent_key"], invs[b]["parent_key"] = invs[b]["key"], invs[a]["key"]
    return "a parent cycle (or a re-parented call)"


_MUTATIONS: list[Callable[[random.Random, dict[str, Any]], str]] = [
    _extremes,
    _plausible,
    _extreme_time,
    _plausible,
    _reversed_times,
    _tree,
]


def _as_v7(prof: wandb_modprof.Profile, tmp_path: Path) -> bytes:
    return save_profile(prof.snapshot(), tmp_path / "v7.modprof.json", version=7).read_bytes()


def _strict_json(text: str) -> Any:
    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _through_every_sink(prof: wandb_modprof.Profile, base: Any, out: Path, svg: bool) -> None:
    prof.summary()
    table = prof.table()
    packed.logged(table.columns, table.rows)  # the W&B table's rows, as logged
    prof.to_html(out / "r.html")
    trace = _strict_json(prof.export_chrome_trace(out / "t.json").read_text())
    assert isinstance(trace, dict) and trace.get("traceEvents") is not None
    for mode in ("fwd_bwd", "act"):
        format_comparison(compare(base, prof, mode), 10)
    if svg:
        prof.to_svg(out / "p.svg")


def test_every_file_the_loader_accepts_goes_through_every_sink(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    path = tmp_path / "case.modprof.json"
    base_path = tmp_path / "base.modprof.json"
    base_path.write_text(json.dumps(saved))
    base = wandb_modprof.load(base_path)
    outcomes = {"loaded": 0, "refused": 0, "refused by a sink": 0}
    failures: list[str] = []
    for case in range(CASES):
        doc = copy.deepcopy(saved)
        what = _MUTATIONS[case % len(_MUTATIONS)](rng, doc)
        path.write_text(json.dumps(doc))
        try:
            loaded = wandb_modprof.load(path)
        except ModProfError:
            outcomes["refused"] += 1
            continue
        outcomes["loaded"] += 1
        try:
            columns = loaded.save(tmp_path / "columns.modprof.json")  # (version 8)
            prof = wandb_modprof.load(columns)
            again = prof.save(tmp_path / "again.modprof.json").read_bytes()
            assert again == columns.read_bytes(), "version 8 read back differently"
            # the same profile as the version-7 file's: written as version 7, the same bytes
            assert _as_v7(prof, tmp_path) == _as_v7(loaded, tmp_path), "not the same profile"
            _through_every_sink(prof, base, tmp_path, svg=case % 10 == 0)
        except ModProfError:
            outcomes["refused by a sink"] += 1
        except Exception as error:  # AssertionError too: listed with the others
            where = traceback.extract_tb(error.__traceback__)[-1]
            failures.append(
                f"seed {SEED} case {case} ({what}): {type(error).__name__}: "
                f"{str(error)[:160]} at {where.filename}:{where.lineno}"
            )
    assert not failures, f"{len(failures)} of {CASES} cases:\n" + "\n".join(failures[:15])
    # both kinds of file were generated: the test can fail either way
    assert outcomes["loaded"] > CASES // 6 and outcomes["refused"] > CASES // 6, outcomes
    print(f"{CASES} generated files: {outcomes}")


def test_impossible_files_are_refused_naming_the_field_and_the_rule(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "bad.modprof.json"
    inv = ("last_sample", "invocations")
    cases: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (
            lambda d: _set(d, (*inv, 1, "fwd_ms"), 1e308),
            r"last_sample\.invocations\[1\]\.fwd_ms: expected a time within",
        ),
        (
            lambda d: _set(d, (*inv, 1, "fwd_ms"), -2.0),
            r"last_sample\.invocations\[1\]\.fwd_ms: expected >= 0 \(a duration\)",
        ),
        (
            lambda d: d["last_sample"]["runs"][0].update(start_ms=5.0, end_ms=4.0),
            r"last_sample\.runs\[0\]\.end_ms: expected >= start_ms \(5\.0\), got 4\.0",
        ),
        (
            lambda d: d["last_sample"]["invocations"].append(d["last_sample"]["invocations"][1]),
            r"last_sample\.invocations\[\d+\]\.key: .* repeats an earlier call's key",
        ),
        (
            lambda d: (
                _set(d, (*inv, 1, "parent_key"), d["last_sample"]["invocations"][2]["key"])
                or _set(d, (*inv, 2, "parent_key"), d["last_sample"]["invocations"][1]["key"])
            ),
            r"last_sample\.invocations\[\d\]\.parent_key: a cycle of parents",
        ),
        (
            lambda d: _set(d, ("stats", "<root>#0", "metrics", "fwd_ms", "max"), 1e300),
            r'stats\["<root>#0"\]\.metrics\["fwd_ms"\]\.max: expected a time within',
        ),
    ]
    for mutate, message in cases:
        doc = copy.deepcopy(saved)
        mutate(doc)
        path.write_text(json.dumps(doc))
        with pytest.raises(ModProfError, match=r"^cannot load '.*bad\.modprof\.json': " + message):
            wandb_modprof.load(path)
    assert math.isfinite(saved["last_sample"]["invocations"][1]["fwd_ms"])  # (the base loads)
