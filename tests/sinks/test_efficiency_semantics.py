"""What the efficiency modes (`eff`, `eff_bwd`) colour, cap and class, in the table, the panel
(rendered by vl-convert) and the CLI: the hottest node is the one with the most time lost to
the roofline; no share above 100 % unless flagged above the roofline, no negative time lost;
a module without work (no FLOPs, no bytes) is "no work", grey and outside the colour scale;
compare mode takes the ratio of the time lost, so a module that got faster is not red."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch
import vl_convert as vlc
from browser import stored
from hypothesis import given
from hypothesis import strategies as st
from models import ResNet
from panel import as_run, color_distance, marks, normalised, texts, vega_turbo, wandb_patched
from torch import nn

import wandb_modprof
from wandb_modprof.records.modes import mode
from wandb_modprof.records.roofline import BOUNDS, Roofline, efficiency
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.text.compare import compare_values, format_comparison
from wandb_modprof.sinks.text.summary import format_mode_summary
from wandb_modprof.sinks.text.values import mode_values
from wandb_modprof.view.columns import BOUND_CODES
from wandb_modprof.view.units import format_value

ROOT = "<root>#0"
IDLE = ("idle#0", "drop#0")  # an nn.Identity and an nn.Dropout(p=0) in eval mode: no work
NO_VALUE_FILL = "#e3e3e3"
DIVERGE_HOT, DIVERGE_COLD = "#b40426", "#3b4cc0"
LINE = Roofline("cpu", peak_flops=1e11, peak_bytes_per_s=1e10, op_overhead_ms=0.005, source="x")


class IdleResNet(ResNet):
    """`tests/models.py`'s ResNet with two modules that do nothing in its root view."""

    def __init__(self) -> None:
        super().__init__()
        self.idle = nn.Identity()
        self.drop = nn.Dropout(p=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(self.idle(x))))
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(self.drop(torch.flatten(self.avgpool(x), 1)))


def _profile(**peaks: float) -> wandb_modprof.Profile:
    torch.manual_seed(0)
    model = IdleResNet()
    model.drop.eval()
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()  # the model's start-up step, untimed
    with wandb_modprof.profile(model, settings=wandb_modprof.Settings(**peaks)) as prof:
        for _ in range(3):
            model(x).sum().backward()
    return prof


@pytest.fixture(scope="module")
def prof() -> wandb_modprof.Profile:
    return _profile()


@pytest.fixture(scope="module")
def rows(prof: wandb_modprof.Profile) -> list[dict[str, Any]]:
    return prof.table().resolved()


@pytest.fixture(scope="module")
def low_peak() -> wandb_modprof.Profile:
    """Given a memory peak far below the machine's (1 MB/s): every call with bytes is faster
    than its roofline (what cache-resident data does to a real one)."""
    return _profile(peak_bw=1e6)


def _nodes(rows: list[dict[str, Any]], view: str = ROOT) -> list[dict[str, Any]]:
    return [r for r in rows if r["row_kind"] == "node" and r["view_key"] == view]


def _missing(row: dict[str, Any], column: str) -> bool:
    return row["missing"] == "*" or column in str(row["missing"]).split(",")


def _render(rows: list[dict[str, Any]], **signals: Any) -> Any:
    spec = wandb_patched(_spec.filled({}), 960, 600)
    for signal in spec["signals"]:
        if signal["name"] in signals:
            signal["value"] = signals[signal["name"]]
    spec["data"][0]["values"] = stored(rows)
    return vlc.vega_to_scenegraph(spec)


def _fills(scene: Any, nodes: list[dict[str, Any]]) -> dict[str, str]:
    drawn = marks(scene, "node_rect")
    assert len(drawn) == len(nodes)
    return {n["node_key"]: i["fill"] for n, i in zip(nodes, drawn, strict=True)}


def _card(rows: list[dict[str, Any]], key: str, **signals: Any) -> list[str]:
    scene = _render(rows, hover_key=key, **signals)
    return [t for t in texts(scene, "card_text") if t]


# ---- the roofline ----------------------------------------------------------------------------
@given(
    flops=st.floats(0, 1e12),
    nbytes=st.floats(0, 1e10),
    ops=st.integers(0, 10_000),
    ms=st.floats(1e-6, 1e4),
)
def test_the_share_is_at_most_100_and_the_time_lost_never_negative(
    flops: float, nbytes: float, ops: int, ms: float
) -> None:
    found = efficiency(flops, nbytes, ops, ms, LINE)
    assert found is not None and found.bound in BOUNDS
    if flops == 0 and nbytes == 0:
        assert (found.bound, found.pct, found.lost_ms) == ("none", None, None)
        return
    assert found.pct is not None and found.lost_ms is not None
    assert 0 <= found.pct <= 100 and 0 <= found.lost_ms <= ms
    roof_ms = max(1e3 * flops / LINE.peak_flops, 1e3 * nbytes / LINE.peak_bytes_per_s)
    if roof_ms > ms * (1 + 1e-6):  # faster than the roofline: flagged, capped
        assert found.above and (found.pct, found.lost_ms) == (100.0, 0.0)
    elif roof_ms < ms * (1 - 1e-6):
        assert not found.above
        assert found.pct == pytest.approx(100 * roof_ms / ms)
        assert found.lost_ms == pytest.approx(ms - roof_ms)


def test_a_call_above_its_roofline_says_on_which_side() -> None:
    memory = efficiency(flops=0, nbytes=4e8, ops=1, ms=20.0, roofline=LINE)  # 40 ms at peak
    compute = efficiency(flops=4e9, nbytes=1e3, ops=1, ms=20.0, roofline=LINE)  # 40 ms
    assert memory is not None and memory.bound == "above_memory"
    assert compute is not None and compute.bound == "above_compute"
    # the call that sets a raised peak reaches it, up to rounding: at 100 %, not above
    at_peak = efficiency(flops=3e9, nbytes=0, ops=1, ms=1e3 * 3e9 / LINE.peak_flops, roofline=LINE)
    assert at_peak is not None and at_peak.bound == "compute"
    assert at_peak.pct == pytest.approx(100.0) and at_peak.lost_ms == pytest.approx(0.0)


def test_a_no_op_module_is_classed_no_work(rows: list[dict[str, Any]]) -> None:
    by_key = {r["node_key"]: r for r in _nodes(rows)}
    eff = mode("eff")
    for key in IDLE:
        row = by_key[key]
        assert row["fwd_flops"] == 0 and row["fwd_bytes"] == 0 and row["fwd_ms"] > 0
        assert row["fwd_bound"] == BOUND_CODES["none"], row  # not compute-bound at 0 %
        assert _missing(row, "fwd_roofline_pct") and _missing(row, "fwd_lost_ms")
        assert eff.value(row) is None and eff.colour_value(row) is None


def test_no_negative_time_lost_and_no_share_above_100_unflagged(
    prof: wandb_modprof.Profile, low_peak: wandb_modprof.Profile
) -> None:
    """In every node row of the table (modules, `self` nodes, every view) the time lost is
    the time less the time at the roofline, at least 0, and the share at most 100; a row whose
    time is below its roofline is flagged (its class "above_...")."""
    above_codes = {BOUND_CODES["above_compute"], BOUND_CODES["above_memory"]}
    flagged = 0
    for profile in (prof, low_peak):
        line = mode_values(profile, "eff").roofline
        assert line is not None
        checked = 0
        for row in profile.table().resolved():
            if row["row_kind"] != "node":
                continue
            for way in ("fwd", "bwd"):
                if _missing(row, f"{way}_bound"):
                    continue
                code = int(row[f"{way}_bound"])
                if code == BOUND_CODES["none"]:
                    assert row[f"{way}_flops"] == 0 and row[f"{way}_bytes"] == 0, row
                    continue
                pct, lost, ms = (row[f"{way}_{c}"] for c in ("roofline_pct", "lost_ms", "ms"))
                roof_ms = 1e3 * max(
                    row[f"{way}_flops"] / line.peak_flops,
                    row[f"{way}_bytes"] / line.peak_bytes_per_s,
                )
                assert 0 <= pct <= 100 and lost >= 0, row
                if code in above_codes:
                    assert roof_ms > ms and (pct, lost) == (100.0, 0.0), row
                    flagged += 1
                else:
                    assert roof_ms <= ms * (1 + 1e-9), row
                    assert lost == pytest.approx(ms - roof_ms, rel=1e-9, abs=1e-12)
                checked += 1
        assert checked > 50
    assert flagged > 20  # the low peak's calls with bytes: the flag is exercised


# ---- the panel ---------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["eff", "eff_bwd"])
def test_the_hottest_node_has_the_most_time_lost(rows: list[dict[str, Any]], key: str) -> None:
    """Turbo by the time lost (`Mode.colour_value`): at its end the node that loses the most
    time, not the most efficient one; grey for the no-op modules; the colour bar says so."""
    m = mode(key)
    nodes = _nodes(rows)
    scene = _render(rows, mode=key)
    fills = _fills(scene, nodes)
    lost = {
        n["node_key"]: v
        for n in nodes
        if n["node_kind"] not in ("input", "output") and (v := m.colour_value(n)) is not None
    }
    assert len(lost) >= 6
    assert all(lost[k] == n[m.rank_by[0]] for n in nodes if (k := n["node_key"]) in lost)
    hottest = max(lost, key=lambda k: lost[k])
    assert color_distance(fills[hottest], vega_turbo([1.0])[0]) <= 1, (hottest, fills)
    ts = normalised(list(lost.values()), "linear")
    for (k, v), want in zip(lost.items(), vega_turbo(ts), strict=True):
        assert color_distance(fills[k], want) <= 1, (k, v, fills[k], want)
    # the most efficient node is not the hottest (it was, coloured by the share)
    valued = {n["node_key"]: m.value(n) for n in nodes if m.value(n) is not None}
    best = max(valued, key=lambda k: valued[k] or 0.0)
    if lost[best] < max(lost.values()):
        assert fills[best] != fills[hottest]
    if key == "eff":
        for idle in IDLE:
            assert fills[idle] == NO_VALUE_FILL, idle
    way = "fwd" if key == "eff" else "bwd"
    assert texts(scene, "colorbar_title") == [f"Time lost vs roofline ({way})"]
    # the extents are the time lost of the valued nodes only (the no-op modules are out)
    assert texts(scene, "colorbar_lo") == [format_value("ms", min(lost.values()))]
    assert texts(scene, "colorbar_hi") == [format_value("ms", max(lost.values()))]
    # the ranked list leads with the module that loses the most time in the whole model
    modules = [r for r in rows if r["row_kind"] == "node" and r["node_kind"] == "module"]
    first = min(
        (r for r in modules if m.rank_value(r) is not None),
        key=lambda r: (-(m.rank_value(r) or 0.0), r["node_key"]),
    )
    assert first["node_key"] == hottest or first["view_key"] != ROOT  # (the list spans views)
    listed = sorted(texts(scene, "top_label"), key=lambda t: int(t.split(".")[0]))
    assert listed[0].startswith("1. ") and first["module_name"].split(".")[-1] in listed[0]


def test_the_card_says_no_work_and_the_class(rows: list[dict[str, Any]]) -> None:
    lines = _card(rows, "drop#0", mode="eff")
    assert "Fwd: no work: no FLOPs, no bytes moved" in lines, lines
    assert not any(line.startswith("Efficiency (fwd):") for line in lines), lines
    busy = max(
        (n for n in _nodes(rows) if not _missing(n, "fwd_lost_ms")), key=lambda n: n["fwd_lost_ms"]
    )
    lines = _card(rows, busy["node_key"], mode="eff")
    text = {1: "compute", 2: "memory", 3: "overhead"}[int(busy["fwd_bound"])]
    assert f"Fwd: {text}-bound, {format_value('ms', busy['fwd_lost_ms'])} lost" in lines, lines


def test_a_call_above_the_roofline_is_capped_and_says_why(
    low_peak: wandb_modprof.Profile,
) -> None:
    rows = low_peak.table().resolved()
    nodes = _nodes(rows)
    relu = next(n for n in nodes if n["node_key"] == "relu#0")
    assert relu["fwd_bound"] == BOUND_CODES["above_memory"]
    assert (relu["fwd_roofline_pct"], relu["fwd_lost_ms"]) == (100.0, 0.0)
    lines = _card(rows, "relu#0", mode="eff")
    assert "Efficiency (fwd): 100%" in lines, lines
    assert "Fwd: above the roofline, capped at 100%" in lines, lines
    assert "reason: cached data beat the memory peak" in lines, lines
    # the compute side (a call shorter than the raising threshold, or a peak given too low)
    edited = [dict(r) for r in rows]
    for r in edited:
        if r["row_kind"] == "node" and r["node_key"] == "relu#0":
            r["fwd_bound"] = BOUND_CODES["above_compute"]
    lines = _card(edited, "relu#0", mode="eff")
    assert "reason: peak FLOP/s below the real one" in lines, lines


# ---- compare mode ------------------------------------------------------------------------
def _scaled(rows: list[dict[str, Any]], key: str, way: str, factor: float) -> None:
    """Run the call `key` `factor` times as long above its roofline, in place (its time, its
    time lost and its share, as the table would write them)."""
    for r in rows:
        if r["row_kind"] == "node" and r["node_key"] == key:
            ms, lost = r[f"{way}_ms"], r[f"{way}_lost_ms"]
            roof = ms - lost
            r[f"{way}_lost_ms"] = lost * factor
            r[f"{way}_ms"] = roof + lost * factor
            r[f"{way}_roofline_pct"] = 100 * roof / r[f"{way}_ms"]


def test_compare_mode_is_the_ratio_of_time_lost(rows: list[dict[str, Any]]) -> None:
    """Run B: `layer2` loses 4x less time above its roofline (more efficient), `layer1` 4x
    more. Coloured by the ratio of the share, `layer2` was the reddest node; by the ratio
    of time lost it is at the blue end and `layer1` at the red end. The no-op modules have no
    ratio (grey) and do not set the scale."""
    base = [dict(r) for r in rows]
    faster = [dict(r) for r in rows]
    _scaled(faster, "layer2#0", "fwd", 0.25)
    _scaled(faster, "layer1#0", "fwd", 4.0)
    runs = as_run(base, "run-a", "base", 0) + as_run(faster, "run-b", "faster", 1)
    scene = _render(runs, compare=True, run_pick="run-b", mode="eff")
    nodes = _nodes(rows)
    fills = _fills(scene, nodes)
    assert color_distance(fills["layer2#0"], DIVERGE_COLD) <= 1, fills
    assert color_distance(fills["layer1#0"], DIVERGE_HOT) <= 1, fills
    for idle in IDLE:
        assert fills[idle] == NO_VALUE_FILL, idle
    assert texts(scene, "colorbar_hi") == [
        format_value("ratio", 4.0)
    ]  # the largest |log ratio| in view: layer2's
    assert texts(scene, "colorbar_title") == ["Ratio to baseline, time lost (fwd)"]
    lines = _card(runs, "layer2#0", compare=True, run_pick="run-b", mode="eff")
    assert f"vs baseline: {format_value('ratio', 0.25)} time lost (fwd)" in lines, lines


def test_the_cli_compare_takes_the_ratio_of_time_lost(prof: wandb_modprof.Profile) -> None:
    va = mode_values(prof, "eff")
    faster = [
        dataclasses.replace(
            v,
            rank=v.rank / 4 if v.rank is not None else None,
            value=min(100.0, 4 * v.value) if v.value is not None else None,
        )
        if v.key == "layer2#0"
        else v
        for v in va.modules
    ]
    vb = dataclasses.replace(va, modules=tuple(faster))
    c = compare_values(va, vb, "A", "B")
    (layer2,) = [m for m in c.matched if m.key == "layer2#0"]
    assert layer2.ratio == pytest.approx(0.25)  # less time lost: below 1, not above
    assert c.matched[0].key == "layer2#0"
    assert not {m.key for m in c.matched if m.ratio is not None} & set(IDLE)
    text = format_comparison(c, 3)
    assert "ratio = B / A of time lost (fwd)" in text.splitlines()[0]


# ---- the CLI summary agrees with the panel ------------------------------------------------
def _summary_rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("#  module"))
    out = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        out.append(re.split(r"\s{2,}", line.strip()))
    return out


def test_the_summary_agrees_with_the_panel(
    prof: wandb_modprof.Profile, rows: list[dict[str, Any]]
) -> None:
    values = mode_values(prof, "eff")
    assert all(v.rank is None or v.rank >= 0 for v in values.modules)
    assert all(v.value is None or v.value <= 100 for v in values.modules)
    modules = [r for r in rows if r["row_kind"] == "node" and r["node_kind"] == "module"]
    idle = [
        r for r in modules if r["fwd_bound"] == BOUND_CODES["none"] and not _missing(r, "fwd_bound")
    ]
    assert {r["node_key"] for r in idle} >= set(IDLE)
    ranked = values.ranked()
    assert not {v.key for v in ranked} & set(IDLE)
    # the same first module as the panel's ranked list and hottest colour (`Mode.colour_value`)
    m = mode("eff")
    hottest = max(
        (r for r in modules if m.colour_value(r) is not None),
        key=lambda r: m.colour_value(r) or 0.0,
    )
    assert ranked[0].key == hottest["node_key"]
    assert values.colour(ranked[0]) == pytest.approx(m.colour_value(hottest))
    text = format_mode_summary(values, 5)
    calls = "call" if len(idle) == 1 else "calls"
    assert f"({len(idle)} module {calls} did no work: no FLOPs, no bytes moved" in text, text
    first = _summary_rows(text)[0]
    assert first[1] == hottest["node_key"]
    assert format_value("ms", hottest["fwd_lost_ms"]) in first


def test_the_summary_flags_calls_above_the_roofline(low_peak: wandb_modprof.Profile) -> None:
    values = mode_values(low_peak, "eff")
    above = [v for v in values.modules if v.bound == "above_memory"]
    assert above and all((v.value, v.rank) == (100.0, 0.0) for v in above)
    shown = len(values.ranked())
    text = format_mode_summary(values, shown)
    assert "(above the roofline: faster than the peaks allow, so the share is capped" in text
    assert "cache-resident data" in text
    bounds = {row[-1] for row in _summary_rows(text)}
    assert "above the roofline (memory)" in bounds, bounds


def test_an_older_reader_of_the_codes_keeps_its_meaning() -> None:
    """New classes were added after the first three: a table's codes 1-3 mean what they did."""
    assert BOUNDS[:3] == ("compute", "memory", "overhead")
    assert [BOUND_CODES[b] for b in BOUNDS[:3]] == [1, 2, 3]
