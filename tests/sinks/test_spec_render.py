"""The panel's Vega spec rendered without a browser (vl-convert runs Vega in Deno): node colours,
scales, W&B's patches, several runs, messages. Interaction is tested in a real browser in
test_panel_browser.py."""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path
from typing import Any

import pytest
import torch
import vl_convert as vlc
from browser import stored
from panel import (
    as_run,
    color_distance,
    gpt_table,
    marks,
    normalised,
    ranked_names,
    records,
    resnet_table,
    texts,
    turbo,
    vega_turbo,
    wandb_patched,
)
from torch import nn

import wandb_modprof
from wandb_modprof.records.modes import DEFAULT_MODE, DEFAULT_SCALE, MODES, mode
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.wandb.packed import logged
from wandb_modprof.view.meta import COLD_LEFT_OUT
from wandb_modprof.view.table import COLUMNS, ProfileTable

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 12  # Vega samples Turbo into a palette; the polynomial differs by a few units


@pytest.fixture(scope="module")
def resnet() -> ProfileTable:
    return resnet_table()


def render(rows: list[dict[str, Any]], width: int = 960, height: int = 600, **fields: str) -> Any:
    spec = wandb_patched(_spec.filled(fields), width, height)
    for data in spec["data"]:
        if data["name"] == "wandb":
            data["values"] = stored(rows)
    return vlc.vega_to_scenegraph(spec)


def root_nodes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    root = next(r["meta_value"] for r in rows if r["meta_key"] == "root_view")
    return [r for r in rows if r["row_kind"] == "node" and r["view_key"] == root]


# ---- the file --------------------------------------------------------------------------------
def test_committed_spec_is_the_generator_output() -> None:
    build = runpy.run_path(str(ROOT / "tools" / "build_spec.py"))
    assert _spec.spec_text() == build["render"](), "run `make spec` after editing the generator"


def test_spec_obeys_wandb_rules() -> None:
    text = _spec.spec_text()
    spec = json.loads(text)

    def walk(value: Any) -> None:
        assert value is not None, "W&B rewrites null to {}"
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(spec)
    assert spec["$schema"].endswith("/vega/v5.json")
    assert spec["data"][0] == {"name": "wandb"}
    assert all("url" not in d and "values" not in d for d in spec["data"])  # frozen: no inline data
    assert "${string:mode:" in text and "${string:scale:" in text
    assert not {"id", "name", "color"} & set(COLUMNS)  # W&B's own columns


# ---- colours ---------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["linear", "log"])
@pytest.mark.parametrize("key", ["fwd_bwd", "bwd", "act", "flops"])
def test_node_fill_is_turbo_of_normalised_value(resnet: ProfileTable, scale: str, key: str) -> None:
    rows = records(resnet)
    scene = render(rows, mode=key, scale=scale)
    nodes = root_nodes(rows)
    drawn = marks(scene, "node_rect")
    assert texts(scene, "node_label") == [n["label"] for n in nodes]  # same order as the rows
    m = mode(key)
    valued = [
        (i, m.value(n)) for i, n in enumerate(nodes) if n["node_kind"] not in ("input", "output")
    ]
    present = [(i, v) for i, v in valued if v is not None]
    assert len(present) >= 5
    ts = normalised([v for _, v in present], scale)
    exact = vega_turbo(ts)
    for (i, v), t, want in zip(present, ts, exact, strict=True):
        fill = drawn[i]["fill"]
        assert color_distance(fill, want) <= 1, (nodes[i]["label"], v, t, fill, want)
        assert color_distance(fill, turbo(t)) <= TOLERANCE, (nodes[i]["label"], v, t, fill)
    top = max(present, key=lambda p: p[1])[0]
    assert color_distance(drawn[top]["fill"], turbo(1.0)) <= TOLERANCE  # red = most expensive
    for i, n in enumerate(nodes):
        if n["node_kind"] in ("input", "output"):
            assert drawn[i]["fill"] == "#ffffff"


def test_log_and_linear_differ_and_colour_bar_labels_follow(resnet: ProfileTable) -> None:
    rows = records(resnet)
    lin = render(rows, mode="fwd", scale="linear")
    log = render(rows, mode="fwd", scale="log")
    assert [i["fill"] for i in marks(lin, "node_rect")] != [
        i["fill"] for i in marks(log, "node_rect")
    ]
    values = [v for n in root_nodes(rows) if (v := mode("fwd").value(n)) is not None]
    hi = max(values)
    assert texts(lin, "colorbar_hi") == [_ms(hi)]
    assert texts(lin, "colorbar_mid") == [_ms((min(values) + hi) / 2)]
    positive = [v for v in values if v > 0]
    assert texts(log, "colorbar_mid") == [_ms(math.sqrt(min(positive) * hi))]
    assert "(log)" in texts(log, "colorbar_title")[0]


def _ms(v: float) -> str:
    """The spec's millisecond format ('.3~r' significant digits, µs below 1 ms)."""
    if abs(v) >= 1000:
        return f"{_sig(v / 1000)} s"
    if abs(v) >= 1:
        return f"{_sig(v)} ms"
    return f"{_sig(v * 1000)} µs"


def _sig(v: float) -> str:
    text = f"{float(f'{v:.3g}'):f}".rstrip("0").rstrip(".")
    return text


def test_text_is_readable_on_every_fill(resnet: ProfileTable) -> None:
    scene = render(records(resnet), mode="fwd_bwd")
    for rect, label in zip(marks(scene, "node_rect"), marks(scene, "node_label"), strict=True):
        ink = label["fill"]
        assert ink in ("#111111", "#ffffff")
        assert _contrast(rect["fill"], ink) >= 4.5 or _contrast(rect["fill"], ink) >= _contrast(
            rect["fill"], "#ffffff" if ink == "#111111" else "#111111"
        )


def _contrast(a: str, b: str) -> float:
    def lum(c: str) -> float:
        from panel import parse_color

        def ch(v: int) -> float:
            s = v / 255
            return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

        r, g, bl = parse_color(c)
        return 0.2126 * ch(r) + 0.7152 * ch(g) + 0.0722 * ch(bl)

    la, lb = lum(a), lum(b)
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def test_every_mode_renders_and_unmeasured_modes_say_so(resnet: ProfileTable) -> None:
    rows = records(resnet)
    for m in MODES:
        scene = render(rows, mode=m.key)
        measured = any(m.value(n) is not None for n in rows if n["row_kind"] == "node")
        messages = texts(scene, "message")
        if measured:
            assert messages == [], (m.key, messages)
        else:
            assert messages == [f"{m.label} was not measured in this run"]
    # CPU run: optimizer state (no optimizer) is greyed out in the legend; peaks are measured
    # on CPU too (from the saved-tensor memory curve)
    scene = render(rows)
    labels = dict(zip(texts(scene, "mode_label"), marks(scene, "mode_label"), strict=True))
    assert labels["Optimizer state"]["fill"] == "#aaaaaa"
    assert labels["Peak memory"]["fill"] != "#aaaaaa"
    assert labels["Backward"]["fill"] != "#aaaaaa"
    assert labels["Fwd + bwd"]["fontWeight"] == "bold"  # the default mode is marked


# ---- W&B's patches and runs ------------------------------------------------------------------
@pytest.mark.parametrize("size", [(960, 600), (520, 320), (1600, 900)])
def test_renders_at_panel_sizes(resnet: ProfileTable, size: tuple[int, int]) -> None:
    width, height = size
    scene = render(records(resnet), width=width, height=height)
    assert scene["width"] <= width + 1 and scene["height"] <= height + 1
    assert len(marks(scene, "node_rect")) == len(root_nodes(records(resnet)))


def test_two_runs_never_overlap_and_are_listed(resnet: ProfileTable) -> None:
    other = gpt_table()
    rows = as_run(records(resnet), "run-a", "resnet-run", 0) + as_run(
        records(other), "run-b", "gpt-run", 1
    )
    scene = render(rows)
    assert texts(scene, "run_label") == ["resnet-run", "gpt-run"]
    # only one run's graph is drawn: the first run's root view, nothing of the other
    assert texts(scene, "node_label") == [n["label"] for n in root_nodes(records(resnet))]
    assert texts(scene, "title") == ["ResNet"]
    assert texts(scene, "compare_label") == ["Colour by ratio to a baseline run"]


def test_one_run_rows_with_wandb_columns_show_no_run_list(resnet: ProfileTable) -> None:
    rows = as_run(records(resnet), "run-a", "resnet-run", 0)
    scene = render(rows)
    assert marks(scene, "run_entry") == []
    assert len(marks(scene, "node_rect")) == len(root_nodes(records(resnet)))


# ---- messages --------------------------------------------------------------------------------
def test_no_rows_shows_loading_message() -> None:
    scene = render([])
    assert texts(scene, "message")[0].startswith("Loading the profile")
    assert marks(scene, "node_rect") == []


def _with_version(rows: list[dict[str, Any]], version: float) -> list[dict[str, Any]]:
    out = [dict(r) for r in rows]
    for r in out:
        if r["meta_key"] == "table_format":
            r["meta_number"] = version
    return out


def test_a_table_of_another_format_version_is_refused_with_a_message(resnet: ProfileTable) -> None:
    rows = records(resnet)
    assert next(r["meta_number"] for r in rows if r["meta_key"] == "table_format") == 4.0
    newer = render(_with_version(rows, 5.0))
    assert texts(newer, "message") == [
        "This table was written by a newer wandb_modprof (table format v5); this panel reads v4"
    ]
    # format-2 (before grid frames and compiled-region rows) and format-3 tables (numbers in
    # their own W&B columns) are refused the same way
    for version in (2, 3):
        old = render(_with_version(rows, float(version)))
        assert texts(old, "message") == [
            f"This table was written by an older wandb_modprof (table format v{version}); this "
            "panel reads v4: log the profile again with this version"
        ]
    # a format-1 table (every row held its view's key and path; no view rows) as logged
    # before: refused with a message, not drawn wrong
    v1 = [
        {k: v for k, v in r.items() if k not in ("view_id", "view_parent", "view_last")}
        for r in _with_version(rows, 1.0)
        if r["row_kind"] != "view"
    ]
    spec = wandb_patched(_spec.filled({}), 960, 600)
    spec["data"][0]["values"] = v1
    older = vlc.vega_to_scenegraph(spec)
    assert texts(older, "message") == [
        "This table was written by an older wandb_modprof (table format v1); this panel reads "
        "v4: log the profile again with this version"
    ]
    assert marks(older, "node_rect") == []


def test_a_version_3_panel_says_a_packed_w_and_b_table_is_newer(resnet: ProfileTable) -> None:
    """A panel registered before the packing (preset wandb-modprof-v3, its spec kept as a
    fixture, written by git b65cbf0) fed the rows W&B now gets says the table is newer and draws
    nothing, instead of drawing a graph with no numbers (`meta_number` stays its own column for
    exactly this, with `row_kind` and `meta_key`)."""
    old_text = (Path(__file__).parents[1] / "fixtures" / "modprof_v3.vg.json").read_text()
    columns, cells = logged(resnet.columns, resnet.rows)
    spec = wandb_patched(_spec.filled({}, old_text), 960, 600)
    spec["data"][0]["values"] = [dict(zip(columns, row, strict=True)) for row in cells]
    scene = vlc.vega_to_scenegraph(spec)
    assert [t for t in texts(scene, "message") if t] == [
        "This table was written by a newer wandb_modprof (table format v4); this panel reads v3"
    ]
    assert marks(scene, "node_rect") == []


def test_foreign_rows_are_named() -> None:
    scene = render([{"a": 1, "b": "x"}])
    assert texts(scene, "message") == [
        "These rows are not a wandb_modprof table (no table_format row)"
    ]


def test_reduced_table_says_so() -> None:
    table = gpt_table()
    small = resnet_table(max_rows=100)
    assert small.reduced
    scene = render(records(small))
    assert any(t.startswith("Reduced to fit the table: ") for t in texts(scene, "message"))
    assert marks(scene, "node_rect")  # still draws what is left
    assert not any(t.startswith("Reduced") for t in texts(render(records(table)), "message"))


def test_totals_panel_shows_model_totals(resnet: ProfileTable) -> None:
    rows = records(resnet)
    meta = {r["meta_key"]: r["meta_number"] for r in rows if r["row_kind"] == "meta"}
    lines = texts(render(rows), "total_text")
    assert (
        lines[0] == f"Forward {_ms(meta['total_fwd_ms'])}  ·  Backward {_ms(meta['total_bwd_ms'])}"
    )
    assert lines[1].startswith("Activations ") and lines[1].endswith("MiB")
    assert lines[-2] == f"{int(meta['num_samples'])} samples  ·  {int(meta['invocations'])} calls"
    # the fixture's model is fresh: its first step was sampled, then left out (the last line)
    cold = [
        r["meta_value"] for r in rows if r["row_kind"] == "meta" and r["meta_key"] == "cold_start"
    ]
    assert lines[-1] == COLD_LEFT_OUT and cold == [COLD_LEFT_OUT]


def test_ranked_list_is_sorted_by_the_mode(resnet: ProfileTable) -> None:
    rows = records(resnet)
    m = mode("bwd")
    scene = render(rows, mode="bwd")
    listed = sorted(texts(scene, "top_label"), key=lambda t: int(t.split(".")[0]))
    ranked = sorted(
        (
            (m.value(r), r["node_key"], r["module_name"])
            for r in rows
            if r["row_kind"] == "node" and r["node_kind"] == "module" and m.value(r) is not None
        ),
        key=lambda x: (-x[0], x[1]),
    )
    assert listed
    names = ranked_names([(name, key) for _, key, name in ranked[: len(listed)]])
    assert listed == [f"{i + 1}. {name}" for i, name in enumerate(names)]


def test_ranked_list_leaves_out_a_merged_group() -> None:
    """A view too big for the table merges its cheapest modules into one group node, whose
    sum over them would rank it first, above every module (parameter bytes: deterministic)."""
    model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(150)))
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
    rows = records(prof.table(max_rows=120))
    (group,) = [r for r in rows if r["node_kind"] == "group"]
    m = mode("param")
    modules = [r for r in rows if r["node_kind"] == "module"]
    assert m.value(group) > max(m.value(r) for r in modules)  # it would have ranked first
    listed = texts(render(rows, mode="param"), "top_label")
    listed.sort(key=lambda t: int(t.split(".")[0]))
    assert listed and not any("more modules" in t for t in listed)
    assert listed[0].startswith("1. ") and listed[0][3:] in {r["module_name"] for r in modules}


def _with_signal(rows: list[dict[str, Any]], **values: Any) -> Any:
    """Render with some signals starting where clicks would have put them (the clicks
    themselves are tested in the browser)."""
    spec = wandb_patched(_spec.filled({}), 960, 600)
    for signal in spec["signals"]:
        if signal["name"] in values:
            signal["value"] = values[signal["name"]]
    spec["data"][0]["values"] = stored(rows)
    return vlc.vega_to_scenegraph(spec)


def test_compare_mode_colours_by_ratio_to_baseline(resnet: ProfileTable) -> None:
    base = records(resnet)
    slow = [dict(r) for r in base]
    for r in slow:
        if r["node_key"] == "layer2#0":
            r["fwd_ms"] *= 3
            r["bwd_ms"] *= 3
    rows = as_run(base, "run-a", "base", 0) + as_run(slow, "run-b", "slow", 1)
    scene = _with_signal(rows, compare=True, run_pick="run-b")
    nodes = root_nodes(base)
    fills = [i["fill"] for i in marks(scene, "node_rect")]
    by_key = dict(zip((n["node_key"] for n in nodes), fills, strict=True))
    # the only node that changed is the reddest end of the diverging scale; equal ones are pale
    assert color_distance(by_key["layer2#0"], "#b40426") <= 1
    assert color_distance(by_key["layer1#0"], "#f2f2f2") <= 1
    assert texts(scene, "colorbar_hi") == ["3×"]  # the span is the largest ratio in view
    assert texts(scene, "colorbar_title")[0].startswith("Ratio to baseline")
    # without compare the same rows are Turbo-coloured by value
    plain = _with_signal(rows, run_pick="run-b")
    assert [i["fill"] for i in marks(plain, "node_rect")] != fills


def test_drilled_view_shows_its_nodes_and_breadcrumbs(resnet: ProfileTable) -> None:
    rows = records(resnet)
    scene = _with_signal(rows, view_pick="layer2.0#0")
    inner = [r for r in rows if r["row_kind"] == "node" and r["view_key"] == "layer2.0#0"]
    assert texts(scene, "node_label") == [r["label"] for r in inner]
    assert texts(scene, "crumb_label") == ["ResNet", "› layer2", "› 0"]
    # an unknown view (e.g. from another run) falls back to the root view
    fallback = _with_signal(rows, view_pick="nope#0")
    assert texts(fallback, "node_label") == [r["label"] for r in root_nodes(rows)]


def test_with_rows_fills_the_wandb_dataset_of_a_copy() -> None:
    spec = _spec.filled({"mode": "bwd"})
    out = _spec.with_rows(spec, ("a", "b"), [(1, "x"), (2, "y")])
    assert out["data"][0] == {"name": "wandb", "values": [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]}
    assert spec["data"][0] == {"name": "wandb"}  # the original is untouched
    assert next(s for s in out["signals"] if s["name"] == "mode")["value"] == "bwd"
    with pytest.raises(ValueError, match="no dataset named 'wandb'"):
        _spec.with_rows({"data": [{"name": "other"}]}, ("a",), [(1,)])
    with pytest.raises(ValueError):  # a row of the wrong length is not silently cut
        _spec.with_rows(spec, ("a", "b"), [(1,)])


def test_imbalance_mode_makes_the_straggler_red(resnet: ProfileTable) -> None:
    """Distributed runs add `rank_*` columns; a module slow on one rank is the red node in the
    imbalance mode, and single-process tables (no such cells) grey the mode out."""
    rows = [dict(r) for r in records(resnet)]
    assert "was not measured" in texts(render(rows, mode="imbalance"), "message")[0]
    for r in rows:
        if r["row_kind"] != "node" or r["node_kind"] in ("input", "output"):
            continue
        slow = r["node_key"] == "layer3#0"
        r.update(rank_count=2, rank_slowest=1 if slow else 0, rank_imbalance=1.8 if slow else 1.02)
        kept = [c for c in str(r["missing"]).split(",") if c and not c.startswith("rank_")]
        r["missing"] = ",".join(kept)
    scene = render(rows, mode="imbalance")
    nodes = root_nodes(rows)
    fills = dict(
        zip(
            (n["node_key"] for n in nodes),
            (i["fill"] for i in marks(scene, "node_rect")),
            strict=True,
        )
    )
    assert color_distance(fills["layer3#0"], vega_turbo([1.0])[0]) <= 1
    assert texts(scene, "colorbar_hi") == ["1.8×"]
    assert "1. layer3" in texts(scene, "top_label")
    assert texts(scene, "message") == []


def test_an_empty_string_setting_falls_back_to_its_default() -> None:
    """W&B fills `${string:NAME:default}` with `stringSettings[name] || default || ''`."""
    signals = {s["name"]: s for s in _spec.filled({"mode": "", "scale": ""})["signals"]}
    assert signals["mode"]["value"] == DEFAULT_MODE
    assert signals["scale_type"]["value"] == DEFAULT_SCALE
    chosen = {s["name"]: s for s in _spec.filled({"mode": "bwd"})["signals"]}
    assert chosen["mode"]["value"] == "bwd"
