"""`prof.save(path)` / `wandb_modprof.load(path)`: exact round trip, strict and safe loading.

Files of version 8 (the one written: records as columns, `sinks/file/profile_tables.py`) and of
version 7 (an object per record, still loaded; written here by the writer kept for tests,
`save_profile(..., version=7)`): the tests that edit a file's JSON at a record's path use
version 7's layout, `test_profile_file_columns.py` version 8's."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import ResNet, TinyGPT, gpt_input, resnet_input
from torch import nn

import wandb_modprof
from wandb_modprof import (
    METRICS,
    BackwardRun,
    CallInfo,
    DataEdge,
    InvocationRecord,
    ModProfError,
    ModuleStats,
    Profile,
    RunningStat,
    Sample,
    StepTotals,
    Structure,
)
from wandb_modprof.records.sample import CURVE_SOURCES, TIME_METRICS, MemoryCurve
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.records.stat_columns import ColumnMetrics
from wandb_modprof.sinks.file.profile_columns import floats
from wandb_modprof.sinks.file.profile_file import VERSION, save_profile
from wandb_modprof.sinks.file.profile_schema import AT_LEAST, NON_NEGATIVE_METRICS, RUN_KINDS
from wandb_modprof.sinks.file.profile_times import DURATIONS, TIME_LIMIT_MS
from wandb_modprof.sinks.text.summary import format_mode_summary
from wandb_modprof.sinks.text.values import mode_values

ROOT = "<root>#0"


def _trained(model: nn.Module, x: torch.Tensor, steps: int = 3) -> Profile:
    """A real profile: a structure pass, then timed training steps."""
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            model(x).float().pow(2).mean().backward()
    return prof


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, and of the same types throughout (0.0 is not 0, () is not []);
    a statistics mapping compares as the dict it reads as (a live profile's statistics are
    rows of arrays, `records.stat_columns`; a loaded one's are dicts)."""
    if isinstance(a, ColumnMetrics) or isinstance(b, ColumnMetrics):
        a, b = dict(a), dict(b)
    if type(a) is not type(b):
        return False
    if is_dataclass(a):
        a, b = [getattr(a, f.name) for f in fields(a)], [getattr(b, f.name) for f in fields(b)]
    if isinstance(a, dict):
        if list(a) != list(b):
            return False
        a, b = list(a.values()), list(b.values())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):  # NaN == NaN, and -0.0 is not 0.0
        return math.isnan(a) == math.isnan(b) and (math.isnan(a) or f"{a}" == f"{b}")
    return bool(a == b)


def _save(prof: Profile, path: Path, version: int = VERSION) -> Path:
    """`prof.save(path)`, in file format `version`."""
    return save_profile(prof.snapshot(), path, version=version)


def _assert_round_trip(
    prof: Profile, tmp_path: Path, summary: bool = True, version: int = VERSION
) -> Profile:
    first = _save(prof, tmp_path / "a.modprof.json", version)
    back = wandb_modprof.load(first)
    assert back.model_name == prof.model_name and back.num_samples == prof.num_samples
    for getter in ("stats", "invocations", "structures", "to_dict"):
        assert _same(getattr(back, getter)(), getattr(prof, getter)()), getter
    assert _same(back.last_sample, prof.last_sample)
    if summary:
        assert back.summary() == prof.summary()
    second = _save(back, tmp_path / "b.modprof.json", version)
    assert second.read_bytes() == first.read_bytes()
    return back


# ---- round trip of real profiles -----------------------------------------------------------
@pytest.mark.parametrize("version", [7, VERSION])
@pytest.mark.parametrize(
    "make",
    [lambda: (ResNet(), resnet_input()), lambda: (TinyGPT(), gpt_input())],
    ids=["ResNet", "TinyGPT"],
)
def test_real_profile_round_trips_exactly(
    make: Callable[[], tuple[nn.Module, torch.Tensor]], version: int, tmp_path: Path
) -> None:
    prof = _trained(*make())
    assert prof.num_samples == 2 and prof.stats() and prof.last_sample is not None
    assert prof.structures() and prof.structures()[0].edges
    back = _assert_round_trip(prof, tmp_path, version=version)
    # plain equality too, where no NaN is involved
    assert back.stats() == prof.stats() and back.last_sample == prof.last_sample
    assert back.structures() == prof.structures() and back.to_dict() == prof.to_dict()


class _Recursive(nn.Module):
    """The root calls itself: `<root>#1` is a child of `<root>#0`, at depth 1."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, n: int = 2) -> torch.Tensor:
        return self(self.lin(x), n - 1) if n else x


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Linear(4, 4)
        self.use_c = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(x) if self.use_c else x * 2


class _Wrap(nn.Module):
    def forward(self, x: torch.Tensor, inner: nn.Module) -> torch.Tensor:
        return inner(x) + 1


class _Renested(nn.Module):
    """Dynamic control flow that moves a call: `p` runs under the root (calling `p.c`) in early
    steps and under `w` (without `p.c`) later."""

    def __init__(self) -> None:
        super().__init__()
        self.p = _Inner()
        self.w = _Wrap()
        self.wrapped = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w(x, self.p) if self.wrapped else self.p(x)


def test_real_profiles_satisfy_the_call_tree_rules(tmp_path: Path) -> None:
    """What loading demands of parents and depths, checked on what the profiler writes: GPT-2,
    a root that calls itself, and a call that moves to another depth between steps."""
    pytest.importorskip("transformers")
    from models import gpt2_from_config

    gpt2 = gpt2_from_config()
    with wandb_modprof.profile(gpt2) as prof:
        for _ in range(2):
            gpt2(torch.randint(0, 512, (2, 16))).logits.float().pow(2).mean().backward()
    _assert_round_trip(prof, tmp_path)
    back = _assert_round_trip(_trained(_Recursive(), torch.randn(2, 8)), tmp_path)
    assert back.stats()["<root>#1"].parent_key == ROOT and back.stats()["<root>#1"].depth == 1

    model = _Renested()
    with wandb_modprof.profile(model) as prof:
        for step in range(4):
            model.wrapped, model.p.use_c = step >= 2, step < 2
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    back = _assert_round_trip(prof, tmp_path)
    stats = back.stats()
    # `p` called by `w` (which does not contain it) is other work than `p` under the root:
    # its own key below `w#0` (`capture.forward.call_keys`), so `p#0` keeps its parent and depth.
    # A key still keeps its last sample's parent and depth, so the statistics only promise a
    # positive depth below a parent; each structure (one pass) is exact.
    assert stats["p#0"].parent_key == ROOT and stats["p#0"].depth == 1
    assert stats["w#0 > p#0"].parent_key == "w#0" and stats["w#0 > p#0"].depth == 2
    assert stats["p.c#0"].parent_key == "p#0" and stats["p.c#0"].depth == 2
    for structure in back.structures():
        depth = {c.key: c.depth for c in structure.calls}
        for c in structure.calls:
            assert c.depth == (0 if c.parent_key is None else depth[c.parent_key] + 1)
    assert back.table().rows


def test_empty_profile_round_trips(tmp_path: Path) -> None:
    model = TinyGPT()
    with wandb_modprof.profile(model, structure=False) as prof:
        pass
    back = _assert_round_trip(prof, tmp_path)
    assert back.num_samples == 0 and back.last_sample is None
    assert back.stats() == {} and back.structures() == [] and back.invocations() == []


def test_non_finite_norms_round_trip_as_strings(tmp_path: Path) -> None:
    model = TinyGPT()
    with torch.no_grad():  # a diverged model: an inf weight and a NaN weight
        model.ln_f.weight[0] = math.inf
        model.wpe.weight[0, 0] = math.nan
    prof = _trained(model, gpt_input())
    norms = {r.key: r.param_norm for r in prof.invocations()}
    assert norms["ln_f#0"] == math.inf and math.isnan(norms["wpe#0"] or 0.0)
    back = _assert_round_trip(prof, tmp_path)
    loaded = {r.key: r.param_norm for r in back.invocations()}
    assert loaded["ln_f#0"] == math.inf and math.isnan(loaded["wpe#0"] or 0.0)
    text = (tmp_path / "a.modprof.json").read_text()
    assert not re.search(r"\b(NaN|Infinity)\b", text)  # (not JSON)
    column = json.loads(text)["last_sample"]["invocations"]["param_norm"]
    assert isinstance(column, str)  # (no null: base64, NaN and infinities as their bits)
    values, _ = floats(column, None, False, str, "param_norm")
    assert math.inf in values.tolist() and np.isnan(values).any()
    text = _save(prof, tmp_path / "v7.modprof.json", 7).read_text()
    assert '"param_norm": "inf"' in text and '"param_norm": "nan"' in text
    assert not re.search(r"\b(NaN|Infinity)\b", text)


def test_file_header_paths_and_determinism(tmp_path: Path) -> None:
    prof = _trained(TinyGPT(), gpt_input())
    written = prof.save(str(tmp_path / "run.json"))  # str path, name kept as given
    assert written == tmp_path / "run.json" and sorted(os.listdir(tmp_path)) == ["run.json"]
    doc = json.loads(written.read_text(encoding="utf-8"))
    assert list(doc)[:3] == ["format", "version", "wandb_modprof_version"]
    assert doc["format"] == "wandb_modprof.profile" and doc["version"] == 8
    assert doc["wandb_modprof_version"] == wandb_modprof.__version__
    assert set(doc) - {"format", "version", "wandb_modprof_version"} == {
        "model_name",
        "num_samples",
        "stats",
        "last_sample",
        "structures",
        "cold_left_out",
        "phases",
    }
    again = prof.save(tmp_path / "run.json")  # overwritten in place, same bytes
    assert again.read_bytes() == written.read_bytes()


def test_int_in_float_field_loads_as_float_and_odd_strings_survive(tmp_path: Path) -> None:
    prof = _trained(TinyGPT(), gpt_input())
    path = _save(prof, tmp_path / "p.modprof.json", 7)
    doc = json.loads(path.read_text())
    doc["last_sample"]["invocations"][0]["fwd_ms"] = 0
    doc["model_name"] = "\ud800 nan \u00e9"  # lone surrogate, a float-like word, non-ASCII
    path.write_text(json.dumps(doc))
    back = wandb_modprof.load(path)
    assert back.invocations()[0].fwd_ms == 0.0 and type(back.invocations()[0].fwd_ms) is float
    assert back.model_name == "\ud800 nan \u00e9"
    assert back.save(tmp_path / "q.modprof.json").read_text().isascii()
    assert wandb_modprof.load(tmp_path / "q.modprof.json").model_name == back.model_name


# ---- save errors ---------------------------------------------------------------------------
def test_save_errors_name_the_path_and_leave_nothing_behind(tmp_path: Path) -> None:
    prof = _trained(TinyGPT(), gpt_input())
    with pytest.raises(ModProfError, match=r"cannot save profile to .*nope.*does not exist"):
        prof.save(tmp_path / "nope" / "p.modprof.json")
    (tmp_path / "dir.modprof.json").mkdir()
    with pytest.raises(ModProfError, match=r"cannot save profile to .*dir\.modprof\.json"):
        prof.save(tmp_path / "dir.modprof.json")
    assert os.listdir(tmp_path) == ["dir.modprof.json"]  # no temporary file left


def test_save_permission_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = _trained(TinyGPT(), gpt_input())

    def denied(*args: object, **kwargs: object) -> int:  # as root, chmod would not stop us
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(
        ModProfError, match=r"cannot save profile to '.*p\.json': Permission denied"
    ):
        prof.save(tmp_path / "p.json")


# ---- load errors ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A TinyGPT profile as version 7: an object per record, at the paths the cases edit."""
    torch.manual_seed(0)
    path = _save(_trained(TinyGPT(), gpt_input()), tmp_path_factory.mktemp("f") / "p.json", 7)
    return path.read_text()


def _load_text(tmp_path: Path, text: str | bytes) -> Profile:
    path = tmp_path / "bad.modprof.json"
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(text)
    return wandb_modprof.load(path)


_DELETE = object()
_M = ("stats", ROOT, "metrics", "fwd_ms")
_INV = ("last_sample", "invocations", 1)
_CALL = ("structures", 0, "calls", 1)
_EDGE = ("structures", 0, "edges", 0)
_STATS_ROOT = re.escape('stats["<root>#0"]')
_MEAN_NON_FINITE = _STATS_ROOT + re.escape('.metrics["fwd_ms"].mean: a non-finite number literal')
_VERSION = re.escape(wandb_modprof.__version__)
_STAT = {"count": 1, "mean": 1.0, "std": 0.0, "min": 1.0, "max": 1.0, "last": 1.0, "median": 1.0}


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (("format",), "other.profile", r"not a wandb_modprof profile: expected format .*other"),
        (("format",), _DELETE, r"not a wandb_modprof profile: .*got no format field"),
        (
            ("version",),
            999,
            rf"version 999 \(written by wandb_modprof {_VERSION}\); .* reads version "
            "1, 2, 3, 4, 5, 6, 7, 8; upgrade",
        ),
        (
            ("version",),
            0,
            r"unsupported file format version 0 .*reads version 1, 2, 3, 4, 5, 6, 7, 8$",
        ),
        (("version",), True, r"version: expected an integer, got true"),
        (("version",), "1", r'version: expected an integer, got "1"'),
        (("wandb_modprof_version",), 1, r"wandb_modprof_version: expected a string, got 1"),
        (
            (*_M, "mean"),
            _DELETE,
            _STATS_ROOT + re.escape('.metrics["fwd_ms"]: missing field "mean"'),
        ),
        (("num_samples",), "2", r'^cannot load .*: num_samples: expected an integer, got "2"$'),
        (("num_samples",), 2.0, r"num_samples: expected an integer, got 2\.0"),
        (("model_name",), None, r"model_name: expected a string, got null"),
        (("last_sample",), [], r"last_sample: expected an object \(Sample\), got an array"),
        ((*_INV, "depth"), True, r"invocations\[1\]\.depth: expected an integer, got true"),
        (
            (*_INV, "fwd_ms"),
            "fast",
            r'fwd_ms: expected a number or "nan", "inf", "-inf", got "fast"',
        ),
        ((*_INV, "bwd_ms"), True, r"bwd_ms: expected a number .* or null, got true"),
        ((*_INV, "fwd_ms"), 10**400, r"invocations\[1\]\.fwd_ms: integer too large for a float"),
        ((*_INV, "extra"), 1, r'last_sample\.invocations\[1\]: unknown field "extra"'),
        (("extra",), 1, r'^cannot load .*: unknown field "extra"$'),
        ((*_CALL, "inputs"), "x", r"structures\[0\]\.calls\[1\]\.inputs: expected an array"),
        ((*_CALL, "inputs"), [1], r"calls\[1\]\.inputs\[0\]: expected a string, got 1"),
        ((*_EDGE, "view_key"), "ghost#0", r'edges\[0\]\.view_key: "ghost#0" is not a call'),
        ((*_EDGE, "src_key"), "ghost#0|in:x", r'edges\[0\]\.src_key: "ghost#0\|in:x" is not'),
        (("stats", ROOT, "key"), "head#0", _STATS_ROOT + r'\.key: "head#0" does not match'),
        ((*_M[:-1], "evil"), _STAT, re.escape('.metrics["evil"]: unknown metric (known: fwd_ms')),
        (("stats",), [[[[[[]]]]]], r"stats: expected an object, got an array"),
        # integers are signed 64-bit
        ((*_M, "count"), 2**63, re.escape('.metrics["fwd_ms"].count: integer out of range')),
        (
            (*_M, "count"),
            -(2**63),
            r"count: integer out of range: expected \|x\| < 2\*\*63, got -9223372036854775808$",
        ),
        (
            ("num_samples",),
            2**63,
            r"num_samples: integer out of range: .*, got 9223372036854775808$",
        ),
        ((*_INV, "act_bytes"), 2**64, r"invocations\[1\]\.act_bytes: integer out of range"),
        ((*_CALL, "fwd_flops"), 2**63, r"calls\[1\]\.fwd_flops: integer out of range"),
        # the call trees hold together: parents known, no cycle, depths consistent
        (
            ("stats", "wte#0", "parent_key"),
            "ghost#0",
            re.escape('stats["wte#0"].parent_key: "ghost#0" is not a key of stats'),
        ),
        (
            ("stats", ROOT, "parent_key"),
            ROOT,
            _STATS_ROOT + re.escape('.parent_key: a cycle of parents: "<root>#0" -> "<root>#0"'),
        ),
        (
            ("stats", ROOT, "parent_key"),
            "wte#0",
            re.escape('a cycle of parents: "<root>#0" -> "wte#0" -> "<root>#0"'),
        ),
        (
            ("stats", ROOT, "depth"),
            3,
            _STATS_ROOT + re.escape(".depth: expected 0 (a call without a parent), got 3"),
        ),
        (
            ("stats", "wte#0", "depth"),
            0,
            re.escape('stats["wte#0"].depth: expected at least 1 (a call below a parent), got 0'),
        ),
        (
            (*_CALL, "parent_key"),
            "ghost#0",
            r'calls\[1\]\.parent_key: "ghost#0" is not a call of this structure',
        ),
        (
            (*_CALL, "parent_key"),
            "wte#0",
            re.escape('calls[1].parent_key: a cycle of parents: "wte#0" -> "wte#0"'),
        ),
        (
            (*_CALL, "depth"),
            2,
            re.escape("""calls[1].depth: expected 1 (its parent "<root>#0"'s depth + 1), got 2"""),
        ),
        ((*_CALL, "key"), ROOT, r'calls\[1\]\.key: "<root>#0" repeats an earlier call\'s key'),
        # compiled regions (version 4): a region must be the call's own or its parent's
        (
            (*_CALL, "compiled_region"),
            ROOT,
            re.escape(
                "calls[1].compiled_region: expected null, its own key (its parent's region), "
                'got "<root>#0"'
            ),
        ),
        ((*_CALL, "compiled_region"), 1, r"calls\[1\]\.compiled_region: expected a string"),
        # the memory curve (version 3)
        (("last_sample", "memory", "source"), "disk", r'memory\.source: expected "device" or'),
        (
            ("last_sample", "memory", "live_bytes"),
            [1],
            r"memory\.live_bytes: expected one value per time, got 1 values for \d+ times",
        ),
        (("last_sample", "memory", "t_ms", 1), -1.0, r"memory\.t_ms\[1\]: expected non-decreasing"),
        (("last_sample", "memory", "live_bytes", 2), -5, r"live_bytes\[2\]: expected >= 0"),
        (("last_sample", "memory", "t_ms"), "x", r"memory\.t_ms: expected an array"),
    ],
)
def test_corrupted_field_fails_with_its_json_path(
    where: tuple[str | int, ...], value: object, message: str, saved_text: str, tmp_path: Path
) -> None:
    doc = json.loads(saved_text)
    parent = doc
    for step in where[:-1]:
        parent = parent[step]
    if value is _DELETE:
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    with pytest.raises(ModProfError, match=message):
        _load_text(tmp_path, json.dumps(doc))


def _replace_first_float(text: str, literal: str) -> str:
    return re.sub(r'("mean": )[-0-9.e]+', lambda m: m.group(1) + literal, text, count=1)


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda t: t[: len(t) // 2], r"not valid JSON: .* at line \d+, column \d+"),
        (lambda t: "", r"not valid JSON: Expecting value at line 1, column 1"),
        (lambda t: "[]", r"not a wandb_modprof profile: expected a JSON object, got an array"),
        (lambda t: '"hi"', r'not a wandb_modprof profile: expected a JSON object, got "hi"'),
        (lambda t: _replace_first_float(t, "NaN"), _MEAN_NON_FINITE),
        (lambda t: _replace_first_float(t, "-Infinity"), _MEAN_NON_FINITE),
        (lambda t: _replace_first_float(t, "1e999"), _MEAN_NON_FINITE),
        (lambda t: _replace_first_float(t, "9" * 5000), r"not valid JSON: .*digits"),
        (lambda t: "[" * 100_000 + "]" * 100_000, r"not valid JSON: nested too deeply"),
    ],
    ids=[
        "truncated",
        "empty",
        "array",
        "string",
        "NaN",
        "-Infinity",
        "1e999",
        "5000 digits",
        "deep",
    ],
)
def test_corrupted_text_fails_cleanly(
    corrupt: Callable[[str], str], message: str, saved_text: str, tmp_path: Path
) -> None:
    with pytest.raises(ModProfError, match=r"^cannot load '.*bad\.modprof\.json': " + message):
        _load_text(tmp_path, corrupt(saved_text))


@pytest.fixture(scope="module")
def saved8_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same profile as version 8: records as columns."""
    torch.manual_seed(0)
    path = _save(_trained(TinyGPT(), gpt_input()), tmp_path_factory.mktemp("f8") / "p.json")
    return path.read_text()


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda t: t[: len(t) // 2], r"not valid JSON: .* at line \d+, column \d+"),
        (
            lambda t: t.replace('"depth":[0,', '"depth":[NaN,', 1),
            re.escape('stats["<root>#0"].depth: expected an integer, got NaN'),
        ),
        (
            lambda t: t.replace(
                '"call_index":{"repeat":0,', '"call_index":{"repeat":-Infinity,', 1
            ),
            re.escape("stats.call_index.repeat: expected an integer, got -Infinity"),
        ),
        (lambda t: t.replace('"depth":[0,', '"depth":[' + "9" * 5000 + ",", 1), "digits"),
        (lambda t: t.replace('"depth":[0,', '"depth":[' + "[" * 100_000, 1), "nested too deeply"),
    ],
    ids=["truncated", "NaN", "-Infinity", "5000 digits", "deep"],
)
def test_corrupted_version_8_text_fails_cleanly(
    corrupt: Callable[[str], str], message: str, saved8_text: str, tmp_path: Path
) -> None:
    assert saved8_text.count('"depth":[0,') == 3  # (stats, the last sample, the structure)
    with pytest.raises(ModProfError, match=r"^cannot load '.*bad\.modprof\.json': .*" + message):
        _load_text(tmp_path, corrupt(saved8_text))


def test_loading_a_version_8_file_runs_no_code(
    saved8_text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("code from the file ran")

    monkeypatch.setattr(os, "system", forbidden)
    payload = f"__import__('os').system('touch {tmp_path / 'pwned'}')"
    doc = json.loads(saved8_text)
    doc["model_name"] = payload
    doc["last_sample"]["invocations"]["module_type"] = {"repeat": "!!python/object", "times": 25}
    back = _load_text(tmp_path, json.dumps(doc))
    assert back.model_name == payload and back.invocations()[0].module_type.startswith("!!")
    tables = (doc["last_sample"]["invocations"], doc["stats"], doc["structures"]["calls"][0])
    for where in (doc, doc["last_sample"], *tables, doc["stats"]["metrics"]["fwd_ms"]):
        where["__class__"] = "os.system"
        with pytest.raises(ModProfError, match=r'unknown field "__class__"'):
            _load_text(tmp_path, json.dumps(doc))
        del where["__class__"]
    doc["stats"]["metrics"]["__class__"] = doc["stats"]["metrics"]["fwd_ms"]
    with pytest.raises(ModProfError, match=r"unknown metric"):
        _load_text(tmp_path, json.dumps(doc))
    assert not (tmp_path / "pwned").exists()


def test_not_utf8_missing_file_and_directory(saved_text: str, tmp_path: Path) -> None:
    with pytest.raises(ModProfError, match=r"not UTF-8 text \(byte 1\)"):
        _load_text(tmp_path, b"{\xff}")
    with pytest.raises(ModProfError, match=r"cannot load '.*missing\.modprof\.json': No such file"):
        wandb_modprof.load(tmp_path / "missing.modprof.json")
    with pytest.raises(ModProfError, match=r"cannot load '.*': Is a directory"):
        wandb_modprof.load(str(tmp_path))


def test_loading_runs_no_code_from_the_file(
    saved_text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("code from the file ran")

    monkeypatch.setattr(os, "system", forbidden)
    monkeypatch.setattr(os, "popen", forbidden)
    payload = f"__import__('os').system('touch {tmp_path / 'pwned'}')"
    doc = json.loads(saved_text)
    doc["model_name"] = payload
    doc["last_sample"]["invocations"][0]["module_type"] = "!!python/object:os.system"
    back = _load_text(tmp_path, json.dumps(doc))
    assert back.model_name == payload and back.invocations()[0].module_type.startswith("!!")
    for where in (doc, doc["last_sample"], doc["stats"][ROOT]["metrics"]["fwd_ms"]):
        where["__class__"] = "os.system"
        with pytest.raises(ModProfError, match=r'unknown field "__class__"'):
            _load_text(tmp_path, json.dumps(doc))
        del where["__class__"]
    doc["stats"][ROOT]["metrics"]["__class__"] = doc["stats"][ROOT]["metrics"]["fwd_ms"]
    with pytest.raises(ModProfError, match=r"unknown metric"):
        _load_text(tmp_path, json.dumps(doc))
    assert not (tmp_path / "pwned").exists()


# ---- property: any record values round-trip ------------------------------------------------
# Hypothesis infers the other fields from the type hints; its floats include NaN, +-inf, -0.0.
_floats = st.floats() | st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 1e308])
_ints = st.integers(-(2**63) + 1, 2**63 - 1)  # what the file format holds
_strs = st.text(max_size=8) | st.sampled_from(["nan", "-inf", "__class__", "a|in:x", "\ud800"])


# Times (`profile_times.py`): NaN or within the limit; durations (and a std) also >= 0.
_times = st.floats(-TIME_LIMIT_MS, TIME_LIMIT_MS) | st.sampled_from([0.0, -0.0, math.nan])
_durations = st.floats(0.0, TIME_LIMIT_MS) | st.sampled_from([0.0, math.nan])


@st.composite
def _stat(draw: st.DrawFn, metric: str) -> RunningStat:
    """Any statistic the schema's range rules allow (std >= 0, min <= max, min >= 0 for
    a byte or count metric, a median within [min, max], a time metric's values times; NaN
    passes every rule)."""
    if metric in TIME_METRICS:
        low, high = draw(_times), draw(_times)
        low, high = (high, low) if low > high else (low, high)
        within = st.just(low) if low == high else st.floats(low, high)
        bounded = all(map(math.isfinite, (low, high)))
        median = draw(st.none() | (within if bounded else _times))
        count = draw(st.integers(0, 2**63 - 1))
        return RunningStat(count, draw(_times), draw(_durations), low, high, draw(_times), median)
    low, high = draw(_floats), draw(_floats)
    if metric in NON_NEGATIVE_METRICS:
        low, high = abs(low), abs(high)
    low, high = (high, low) if low > high else (low, high)
    std = draw(_floats)
    count = draw(st.integers(0, 2**63 - 1))
    # the median lies in [min, max] (any value where either is not finite), or is unknown
    bounded = all(map(math.isfinite, (low, high)))
    # (0.0 and -0.0 are equal but no float lies "between" 0.0 and -0.0 for Hypothesis)
    within = st.just(low) if low == high else st.floats(low, high)
    median = draw(st.none() | (within if bounded else _floats))
    return RunningStat(count, draw(_floats), abs(std), low, high, draw(_floats), median)


def _builds(cls: type, **given: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`st.builds` with 64-bit integers in every integer field not given (Hypothesis would draw
    any size of integer, and the file holds 64-bit ones), from the schema's least value."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        if f.name not in given and hints[f.name] in (int, int | None):
            ints = st.integers(AT_LEAST.get(cls, {}).get(f.name, -(2**63) + 1), 2**63 - 1)
            given[f.name] = ints if hints[f.name] is int else st.none() | ints
    return st.builds(cls, **given)


_TIME_FIELDS = {
    f.name: _durations if f.name in DURATIONS else _times
    for f in fields(InvocationRecord)
    if f.name.endswith("_ms")
}


@st.composite
def _record(draw: st.DrawFn, key: str, parent: str | None, depth: int) -> InvocationRecord:
    """A call with any values the rules allow: times, durations, a backward window that does
    not end before it starts."""
    given = {name: st.just(None) if draw(st.booleans()) and name.startswith("bwd") else strategy
             for name, strategy in _TIME_FIELDS.items() if name != "fwd_ms"}  # fmt: skip
    rec: InvocationRecord = draw(
        _builds(
            InvocationRecord,
            key=st.just(key),
            parent_key=st.just(parent),
            depth=st.just(depth),
            fwd_ms=_durations,
            param_norm=_floats,
            **given,
        )
    )
    start, end = rec.bwd_start_ms, rec.bwd_end_ms
    if start is not None and end is not None and end < start:
        rec = dataclasses.replace(rec, bwd_start_ms=end, bwd_end_ms=start)
    return rec


@st.composite
def _sample(draw: st.DrawFn) -> Sample:
    tree = draw(_tree(exact=False))[:3]
    known = {k for k, _, _ in tree}
    records = tuple(
        draw(_record(k, p if p in known else None, d if p in known else 0)) for k, p, d in tree
    )
    owners = [r.key for r in records]
    run = _builds(
        BackwardRun,
        kind=st.sampled_from(RUN_KINDS),
        name=_strs,
        owner_key=st.sampled_from(owners) if owners else st.nothing(),
        start_ms=st.floats(-1e9, 1e9),
        end_ms=st.floats(1e9, TIME_LIMIT_MS),
    )
    runs = draw(st.lists(run, max_size=3 if owners else 0))
    step = draw(st.integers(0, 2**63 - 1))
    return Sample(
        step,
        records,
        draw(_builds(StepTotals, fwd_ms=_durations, bwd_ms=st.none() | _durations)),
        draw(_ints),
        tuple(runs),
        draw(st.none() | _ints),
        draw(st.none() | _curve()),
    )


@st.composite
def _curve(draw: st.DrawFn) -> MemoryCurve:
    """A curve as the schema allows it: times in order (any finite ones), sizes >= 0."""
    times = sorted(draw(st.lists(st.floats(-1e9, 1e9), max_size=5)))
    sizes = draw(st.lists(st.integers(0, 2**63 - 1), min_size=len(times), max_size=len(times)))
    return MemoryCurve(draw(st.sampled_from(CURVE_SOURCES)), tuple(times), tuple(sizes))


@st.composite
def _tree(draw: st.DrawFn, exact: bool, min_size: int = 0) -> list[tuple[str, str | None, int]]:
    """(key, parent key, depth) of calls forming a forest, in any order: depth 0 at a root;
    below a parent its depth + 1 if `exact` (one pass), any positive depth if not (statistics
    keep the last sample's depth of each key)."""
    keys = draw(st.lists(_strs, min_size=min_size, max_size=4, unique=True))
    depth: dict[str, int] = {}
    calls: list[tuple[str, str | None, int]] = []
    for i, key in enumerate(keys):
        parent = draw(st.none() | st.sampled_from(keys[:i])) if i else None
        if parent is None:
            depth[key] = 0
        else:
            depth[key] = depth[parent] + 1 if exact else draw(st.integers(1, 2**63 - 1))
        calls.append((key, parent, depth[key]))
    return list(draw(st.permutations(calls)))


@st.composite
def _stats(draw: st.DrawFn) -> dict[str, ModuleStats]:
    names = st.lists(st.sampled_from(METRICS), max_size=4, unique=True)
    metrics = names.flatmap(lambda ms: st.fixed_dictionaries({m: _stat(m) for m in ms})).map(
        # in METRICS order, as the profiler holds them: version 8 reads them back in that order
        lambda drawn: {m: drawn[m] for m in METRICS if m in drawn}
    )
    out: dict[str, ModuleStats] = {}
    for key, parent, depth in draw(_tree(exact=False)):
        out[key] = draw(
            _builds(
                ModuleStats,
                key=st.just(key),
                parent_key=st.just(parent),
                depth=st.just(depth),
                metrics=metrics,
            )
        )
    return out


@st.composite
def _structure(draw: st.DrawFn) -> Structure:
    tree = draw(_tree(exact=True, min_size=1))
    # compiled regions (version 4): some calls are roots; below a root, its key (outermost wins)
    roots = draw(st.sets(st.sampled_from([k for k, _, _ in tree])))
    parents = {k: p for k, p, _ in tree}

    def region(key: str | None) -> str | None:
        if key is None:
            return None
        above = region(parents[key])
        return above if above is not None else key if key in roots else None

    calls = tuple(
        draw(
            _builds(
                CallInfo,
                key=st.just(k),
                parent_key=st.just(p),
                depth=st.just(d),
                compiled_region=st.just(region(k)),
            )
        )
        for k, p, d in tree
    )
    call = st.sampled_from([k for k, _, _ in tree])
    node = call | st.builds(lambda k, s: f"{k}|in:{s}", call, _strs)
    edges = draw(st.lists(st.builds(DataEdge, call, node, node), max_size=4))
    return Structure(draw(_strs), draw(st.booleans()), calls, tuple(edges))


@pytest.mark.parametrize("version", [7, VERSION])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=_strs,
    num_samples=st.integers(0, 2**63 - 1),
    stats=_stats(),
    last=st.none() | _sample(),
    structures=st.lists(_structure(), max_size=2, unique_by=lambda s: s.signature),
)
def test_any_values_round_trip(
    version: int,
    name: str,
    num_samples: int,
    stats: dict[str, ModuleStats],
    last: Sample | None,
    structures: list[Structure],
) -> None:
    prof = Profile.from_data(ProfileData(name, num_samples, stats, last, tuple(structures)))
    with tempfile.TemporaryDirectory() as tmp:
        _assert_round_trip(prof, Path(tmp), summary=False, version=version)


# ---- version 1 (before medians and collections) ------------------------------------------
V1_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_gpt.v1.modprof.json"


def test_a_version_1_file_loads_without_invented_medians(tmp_path: Path) -> None:
    """The fixture was written by the version-1 writer (TinyGPT, 3 samples) before the bump."""
    raw = json.loads(V1_FIXTURE.read_text(encoding="ascii"))
    assert raw["version"] == 1
    prof = wandb_modprof.load(V1_FIXTURE)
    data = prof.snapshot()
    assert data.num_samples == raw["num_samples"] == 3
    assert list(data.stats) == list(raw["stats"])
    for key, stats in data.stats.items():
        assert stats.gc_samples is None  # not watched then: never a made-up 0
        assert set(stats.metrics) == set(raw["stats"][key]["metrics"])
        for metric, stat in stats.metrics.items():
            old = raw["stats"][key]["metrics"][metric]
            assert (stat.count, stat.mean, stat.min, stat.max) == (
                old["count"],
                float(old["mean"]),
                float(old["min"]),
                float(old["max"]),
            )
            assert stat.median is None and stat.typical == stat.mean  # coloured by the mean
    assert data.last is not None and all(i.gc_ms is None for i in data.last.invocations)
    assert all(i.fwd_wall_ms is None for i in data.last.invocations)  # not invented
    # ... and says so: the profile, the table's meta row, the summary
    assert data.statistic == "mean"
    table = prof.table()
    meta = {r["meta_key"]: r for r in table.records() if r["row_kind"] == "meta"}
    assert meta["statistic"]["meta_value"] == "mean"
    node = next(r for r in table.resolved() if r.get("node_key") == "blocks.0#0")
    assert node["fwd_ms"] == data.stats["blocks.0#0"].metrics["fwd_ms"].mean
    assert {"gc_samples", "gc_ms_max"} <= set(node["missing"].split(","))
    assert "means: this profile file (version 1) kept no medians" in prof.summary()
    # saved again: version 8, the unknowns kept as null, and it reads back the same
    again = prof.save(tmp_path / "again.modprof.json")
    doc = json.loads(again.read_text(encoding="ascii"))
    assert doc["version"] == 8 and doc["last_sample"]["memory"] is None
    assert doc["stats"]["gc_samples"] == {"repeat": None, "times": len(data.stats)}
    fwd = doc["stats"]["metrics"]["fwd_ms"]
    assert fwd["varied"] is True and fwd["median"] == {"repeat": None, "times": len(data.stats)}
    assert _same(wandb_modprof.load(again).snapshot().stats, data.stats)


def test_a_version_1_file_with_a_version_2_field_is_refused(tmp_path: Path) -> None:
    doc = json.loads(V1_FIXTURE.read_text(encoding="ascii"))
    doc["stats"][ROOT]["metrics"]["fwd_ms"]["median"] = 1.0
    message = re.escape('.metrics["fwd_ms"]: unknown field "median" (in a version 1 file)')
    with pytest.raises(ModProfError, match=message):
        _load_text(tmp_path, json.dumps(doc))


def test_a_version_2_median_outside_min_max_is_refused(saved_text: str, tmp_path: Path) -> None:
    doc = json.loads(saved_text)
    stat = doc["stats"][ROOT]["metrics"]["fwd_ms"]
    assert stat["min"] <= stat["median"] <= stat["max"]
    stat["median"] = stat["max"] * 2 + 1
    with pytest.raises(ModProfError, match=r'\.metrics\["fwd_ms"\]\.median: expected within'):
        _load_text(tmp_path, json.dumps(doc))


# ---- version 2 (before the memory curve) ---------------------------------------------------
V2_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_gpt.v2.modprof.json"


def test_a_version_2_file_loads_without_a_curve(tmp_path: Path) -> None:
    """The fixture was written by the version-2 writer (main before issue 18: TinyGPT)."""
    raw = json.loads(V2_FIXTURE.read_text(encoding="ascii"))
    assert raw["version"] == 2 and "memory" not in raw["last_sample"]
    prof = wandb_modprof.load(V2_FIXTURE)
    data = prof.snapshot()
    assert data.last is not None and data.last.memory is None  # not measured: never invented
    # everything else as written: the spans of the timeline were already there
    assert [i.key for i in data.last.invocations] == [
        i["key"] for i in raw["last_sample"]["invocations"]
    ]
    assert len(data.last.runs) == len(raw["last_sample"]["runs"]) > 0
    assert all(i.fwd_mem_peak_bytes is None for i in data.last.invocations)  # CPU, version 2
    again = prof.save(tmp_path / "again.modprof.json")
    doc = json.loads(again.read_text(encoding="ascii"))
    assert doc["version"] == 8 and doc["last_sample"]["memory"] is None
    assert _same(wandb_modprof.load(again).last_sample, prof.last_sample)


def test_a_version_2_file_with_a_curve_is_refused(tmp_path: Path) -> None:
    doc = json.loads(V2_FIXTURE.read_text(encoding="ascii"))
    doc["last_sample"]["memory"] = {"source": "saved", "t_ms": [], "live_bytes": []}
    message = re.escape('last_sample: unknown field "memory" (in a version 2 file)')
    with pytest.raises(ModProfError, match=message):
        _load_text(tmp_path, json.dumps(doc))


def test_a_version_3_file_keeps_the_curve_exactly(saved_text: str, tmp_path: Path) -> None:
    doc = json.loads(saved_text)
    curve = doc["last_sample"]["memory"]
    assert curve["source"] == "saved" and len(curve["t_ms"]) == len(curve["live_bytes"]) > 10
    back = _load_text(tmp_path, saved_text).last_sample
    assert back is not None and back.memory is not None
    assert list(back.memory.live_bytes) == curve["live_bytes"]
    assert list(back.memory.t_ms) == curve["t_ms"]


# ---- version 3 (before compiled regions) ---------------------------------------------------
V3_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_gpt_compiled.v3.modprof.json"


def test_a_version_3_file_loads_as_no_compiled_regions(tmp_path: Path) -> None:
    """The fixture was written by the version-3 writer (main before the compiled-region
    records: TinyGPT under `torch.compile(model, backend="aot_eager")`, 3 samples). Its graph
    lies wholly in a compiled region, but the file did not say so: never invented."""
    raw = json.loads(V3_FIXTURE.read_text(encoding="ascii"))
    assert raw["version"] == 3 and "compiled_region" not in raw["structures"][0]["calls"][0]
    prof = wandb_modprof.load(V3_FIXTURE)
    (structure,) = prof.structures()
    assert len(structure.calls) == len(raw["structures"][0]["calls"]) > 20
    assert all(c.compiled_region is None for c in structure.calls)
    assert set(prof.stats()) == {ROOT}  # (measured at the region's boundary only, as written)
    table = prof.table()
    assert not [r for r in table.records() if r["meta_key"] == "compiled_region"]
    again = prof.save(tmp_path / "again.modprof.json")
    doc = json.loads(again.read_text(encoding="ascii"))
    assert doc["version"] == 8
    regions = doc["structures"]["calls"][0]["compiled_region"]
    assert regions == {"repeat": None, "times": len(structure.calls)}
    assert wandb_modprof.load(again).structures() == prof.structures()


def test_a_version_4_file_loads_without_a_first_step_mark(tmp_path: Path) -> None:
    """Version 5 added the last sample's `cold_start` and the count of left-out first steps: a
    version-4 file reads them as not recorded (null) and none left out, and a version-4 file
    that has either field is refused."""
    prof = _trained(TinyGPT(), gpt_input())
    doc = _as_v5(json.loads(_save(prof, tmp_path / "v7.modprof.json", 7).read_text()))
    assert doc["version"] == 5 and "cold_left_out" in doc and "cold_start" in doc["last_sample"]
    doc["version"] = 4
    del doc["cold_left_out"], doc["last_sample"]["cold_start"]
    back = _load_text(tmp_path, json.dumps(doc))
    assert back.last_sample is not None and back.last_sample.cold_start is None
    assert back.snapshot().cold_left_out == 0 and back.stats() == prof.stats()
    for field in ("cold_left_out", "cold_start"):
        bad = json.loads(json.dumps(doc))
        (bad if field == "cold_left_out" else bad["last_sample"])[field] = 0
        with pytest.raises(
            ModProfError, match=f'unknown field "{field}" \\(in a version 4 file\\)'
        ):
            _load_text(tmp_path, json.dumps(bad))


def test_a_version_3_file_with_a_compiled_region_is_refused(tmp_path: Path) -> None:
    doc = json.loads(V3_FIXTURE.read_text(encoding="ascii"))
    doc["structures"][0]["calls"][0]["compiled_region"] = ROOT
    message = re.escape('calls[0]: unknown field "compiled_region" (in a version 3 file)')
    with pytest.raises(ModProfError, match=message):
        _load_text(tmp_path, json.dumps(doc))


# ---- versions 6 and 7 (work counts, the roofline, the backward's counts) ---------------------
_V6_CALL_FIELDS = (
    "bwd_flops", "bwd_self_flops", "fwd_bytes", "fwd_self_bytes", "fwd_ops", "fwd_self_ops",
    "work_known",
)  # fmt: skip


def _as_v5(doc: dict[str, Any]) -> dict[str, Any]:
    """A version-7 document as the version-5 writer wrote it (without what 6 and 7 added)."""
    doc = _as_v6(doc)
    doc["version"] = 5
    for structure in doc["structures"]:
        del structure["roofline"]
        for call in structure["calls"]:
            for name in _V6_CALL_FIELDS:
                del call[name]
    return doc


def test_a_version_5_file_loads_without_work_counts_or_roofline(tmp_path: Path) -> None:
    """Version 6 added the structure calls' work counts and each structure's roofline: a
    version-5 file reads them as not counted, and one that has any of them is refused."""
    prof = _trained(TinyGPT(), gpt_input())
    (structure,) = prof.structures()
    assert structure.roofline is not None and structure.roofline.peak_flops > 0
    assert all(c.work_known for c in structure.calls) and structure.calls[0].fwd_bytes > 0
    doc = json.loads(_save(prof, tmp_path / "v7.modprof.json", 7).read_text(encoding="ascii"))
    assert doc["version"] == 7 and doc["structures"][0]["roofline"]["source"] == "measured"
    old = _as_v5(json.loads(json.dumps(doc)))
    (back,) = _load_text(tmp_path, json.dumps(old)).structures()
    assert back.roofline is None and not any(c.work_known for c in back.calls)
    assert [c.fwd_flops for c in back.calls] == [c.fwd_flops for c in structure.calls]
    for field in ("roofline", "fwd_bytes"):
        bad = json.loads(json.dumps(old))
        target = bad["structures"][0] if field == "roofline" else bad["structures"][0]["calls"][0]
        target[field] = None
        message = f'unknown field "{field}" \\(in a version 5 file\\)'
        with pytest.raises(ModProfError, match=message):
            _load_text(tmp_path, json.dumps(bad))


_V7_CALL_FIELDS = ("bwd_bytes", "bwd_self_bytes", "bwd_ops", "bwd_self_ops", "bwd_work_known")


def _as_v6(doc: dict[str, Any]) -> dict[str, Any]:
    """A version-7 document as the version-6 writer wrote it (without the backward counts)."""
    doc["version"] = 6
    for structure in doc["structures"]:
        for call in structure["calls"]:
            for name in _V7_CALL_FIELDS:
                del call[name]
    return doc


def test_a_version_6_file_loads_without_backward_counts(tmp_path: Path) -> None:
    """Version 7 added the structure calls' counted backward: a version-6 file reads it as not
    counted (the forward's counts and the roofline kept), and one that has it is refused."""
    prof = _trained(TinyGPT(), gpt_input())
    (structure,) = prof.structures()
    assert all(c.bwd_work_known for c in structure.calls) and structure.calls[0].bwd_bytes > 0
    doc = json.loads(_save(prof, tmp_path / "v7.modprof.json", 7).read_text(encoding="ascii"))
    old = _as_v6(json.loads(json.dumps(doc)))
    (back,) = _load_text(tmp_path, json.dumps(old)).structures()
    assert not any(c.bwd_work_known or c.bwd_bytes or c.bwd_ops for c in back.calls)
    assert back.roofline == structure.roofline and all(c.work_known for c in back.calls)
    assert [c.fwd_bytes for c in back.calls] == [c.fwd_bytes for c in structure.calls]
    loaded = _load_text(tmp_path, json.dumps(old))
    text = format_mode_summary(mode_values(loaded, "eff_bwd"), 5)
    assert "no module has a value in mode eff_bwd" in text and "(file v7+;" in text
    assert mode_values(loaded, "eff").ranked()  # the forward's efficiency is still shown
    bad = json.loads(json.dumps(old))
    bad["structures"][0]["calls"][0]["bwd_ops"] = 0
    with pytest.raises(ModProfError, match='unknown field "bwd_ops" \\(in a version 6 file\\)'):
        _load_text(tmp_path, json.dumps(bad))


# ---- version 7 (an object per record) ----------------------------------------------------
V7_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_gpt.v7.modprof.json"


def test_the_version_7_fixture_loads_and_saves_again_as_version_8(tmp_path: Path) -> None:
    """The fixture was written by the version-7 writer (TinyGPT, 4 steps: 3 samples, the
    cold one left out) before version 8."""
    raw = json.loads(V7_FIXTURE.read_text(encoding="ascii"))
    assert raw["version"] == 7
    prof = wandb_modprof.load(V7_FIXTURE)
    data = prof.snapshot()
    assert list(data.stats) == list(raw["stats"]) and data.cold_left_out == 1
    for key, stats in data.stats.items():
        for metric, stat in stats.metrics.items():
            old = raw["stats"][key]["metrics"][metric]
            assert stat.count == old["count"] and stat.median == float(old["median"])
    assert data.last is not None and len(data.last.runs) == len(raw["last_sample"]["runs"])
    assert data.structures[0].roofline is not None
    again = prof.save(tmp_path / "again.modprof.json")
    assert json.loads(again.read_text())["version"] == 8
    back = wandb_modprof.load(again)
    assert back.stats() == prof.stats() and back.last_sample == prof.last_sample
    assert back.structures() == prof.structures() and back.summary() == prof.summary()
    assert back.table().records() == prof.table().records()
    assert back.save(tmp_path / "third.modprof.json").read_bytes() == again.read_bytes()


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("peak_flops", 0.0, "peak_flops: expected a finite number > 0, got 0.0"),
        ("peak_bytes_per_s", "inf", "peak_bytes_per_s: expected a finite number > 0, got inf"),
        ("op_overhead_ms", -1.0, "op_overhead_ms: expected a finite number >= 0, got -1.0"),
    ],
)
@pytest.mark.parametrize("version", [7, VERSION])
def test_a_roofline_out_of_range_is_refused(
    tmp_path: Path, field: str, value: Any, problem: str, version: int
) -> None:
    prof = _trained(TinyGPT(), gpt_input())
    doc = json.loads(_save(prof, tmp_path / "p.modprof.json", version).read_text())
    structures = doc["structures"]  # (version 8: a table, its rooflines a column)
    roofline = structures[0]["roofline"] if version == 7 else structures["roofline"][0]
    roofline[field] = value
    with pytest.raises(ModProfError, match=re.escape(f"structures[0].roofline.{problem}")):
        _load_text(tmp_path, json.dumps(doc))


def test_the_generated_record_encoders_write_each_kind_of_field_as_the_schema_says() -> None:
    from wandb_modprof.records.sample import RunningStat
    from wandb_modprof.sinks.file.profile_encode import encode

    stat = RunningStat(count=3, mean=2, std=math.inf, min=-math.inf, max=math.nan, last=1.5)
    doc = encode(stat, RunningStat)
    assert doc["count"] == 3 and type(doc["count"]) is int
    assert doc["mean"] == 2.0 and type(doc["mean"]) is float  # an int in a float field
    assert (doc["std"], doc["min"], doc["max"]) == ("inf", "-inf", "nan")
    assert list(doc) == [f.name for f in dataclasses.fields(RunningStat)]  # the fields' order
    assert encode(None, RunningStat | None) is None
    with pytest.raises(AssertionError, match=r"RunningStat\.count"):
        encode(dataclasses.replace(stat, count=None), RunningStat)
