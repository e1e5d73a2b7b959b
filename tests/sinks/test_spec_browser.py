"""The panel in real Vega 5 inside real Chromium, fed the way W&B feeds it (tests/browser.py).

The first tests prove the harness on a toy spec; the rest drive the shipped spec with the rows
of real profiles: clicks, hovers and drags with the real mouse, checked against the scenegraph.
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import browser
import pytest
import torch
from helpers import train_step
from models import Dominated, ResNet, TinyGPT, gpt_input, resnet_input
from torch import nn

import wandb_modprof
from wandb_modprof.records import modes as _modes
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.view.table import ProfileTable

OpenPanel = Callable[..., browser.Panel]
# W&B draws through vega-embed, whose default renderer is canvas; SVG is what the DOM can show
RENDERERS = pytest.mark.parametrize("renderer", ["svg", "canvas"])


@pytest.fixture
def open_panel(chromium: browser.Browser) -> Iterator[OpenPanel]:
    opened: list[browser.Panel] = []

    def _open(
        spec: Mapping[str, Any], rows: Sequence[Mapping[str, Any]] | None = (), **kw: Any
    ) -> browser.Panel:
        panel = chromium.open_panel(spec, rows, **kw)
        opened.append(panel)
        return panel

    yield _open
    for panel in opened:
        panel.close()


# ---- the harness itself, on a toy spec --------------------------------------------------------
TOY_ROWS = [{"key": "a", "label": "Alpha", "i": 0}, {"key": "b", "label": "Beta", "i": 1}]
TOY: dict[str, Any] = {
    "$schema": "https://vega.github.io/schema/vega/v5.json",
    "padding": 7,
    "signals": [
        # a legend as radio buttons: W&B hides bound inputs, so clicks on marks set the mode
        {"name": "choice", "value": "a", "on": [{"events": "@opt:click", "update": "datum.key"}]},
        {
            "name": "hovered",
            "value": "",
            "on": [
                {"events": "@opt:pointerover", "update": "datum.key"},
                {"events": "@opt:pointerout", "update": "''"},
            ],
        },
        {"name": "anchor", "value": 0, "on": [{"events": "@bg:pointerdown", "update": "x()"}]},
        {"name": "pan0", "value": 0, "on": [{"events": "@bg:pointerdown", "update": "pan_x"}]},
        {
            "name": "pan_x",
            "value": 0,
            "on": [
                {
                    "events": "[@bg:pointerdown, window:pointerup] > window:pointermove",
                    "update": "pan0 + x() - anchor",
                }
            ],
        },
        {
            "name": "zoom",
            "value": 1,
            "on": [{"events": "@bg:wheel!", "update": "zoom * pow(1.01, -event.deltaY / 10)"}],
        },
        {"name": "nul", "value": None},  # W&B turns every null into {}
    ],
    "data": [{"name": "wandb"}],
    "marks": [
        {
            "type": "rect",
            "name": "bg",
            "encode": {
                "enter": {"fill": {"value": "#f4f4f4"}},
                "update": {
                    "x": {"value": 0},
                    "y": {"value": 0},
                    "width": {"signal": "width"},
                    "height": {"signal": "height"},
                },
            },
        },
        {
            "type": "rect",
            "name": "box",
            "encode": {
                "enter": {
                    "x": {"value": 300},
                    "y": {"value": 100},
                    "width": {"value": 50},
                    "height": {"value": 30},
                    "fill": {"value": "#0088ff"},
                }
            },
        },
        {
            "type": "group",
            "name": "legend",
            "encode": {"enter": {"x": {"value": 20}, "y": {"value": 10}}},
            "marks": [
                {
                    "type": "text",
                    "name": "opt",
                    "from": {"data": "wandb"},
                    "encode": {
                        "enter": {"fontSize": {"value": 16}, "baseline": {"value": "top"}},
                        "update": {
                            "x": {"signal": "datum.i * 120 + pan_x"},
                            "y": {"value": 20},
                            "text": {"field": "label"},
                            "fill": {"signal": "choice === datum.key ? '#d62728' : '#777777'"},
                            "fontWeight": {"signal": "choice === datum.key ? 'bold' : 'normal'"},
                        },
                        "hover": {"fill": {"value": "#1f77b4"}},
                    },
                }
            ],
        },
    ],
}


@RENDERERS
def test_harness_radio_legend(open_panel: OpenPanel, renderer: str) -> None:
    panel = open_panel(TOY, TOY_ROWS, width=400, height=200, renderer=renderer)
    assert panel.errors() == []
    opts = {i.datum["key"]: i for i in panel.items("opt")}
    assert [opts["a"].text, opts["b"].text] == ["Alpha", "Beta"]
    assert (opts["a"].font_weight, opts["b"].font_weight) == ("bold", "normal")
    assert opts["a"].fill == "#d62728"
    if renderer == "canvas":
        # W&B's Vega (5.25) picks no text item on a canvas: a click on the word lands on
        # nothing, so the panel's clickable things are rects (`test_no_text_mark_is_clickable`)
        target = panel.item("opt", lambda i: i.datum["key"] == "b")
        assert panel.click_at(target.cx, target.cy).mark == ""
        assert panel.signal("choice") == "a"
        return
    picked = panel.click("opt", lambda i: i.datum["key"] == "b")
    assert picked == browser.Picked("opt", {"key": "b", "label": "Beta", "i": 1})
    assert panel.signal("choice") == "b"
    opts = {i.datum["key"]: i for i in panel.items("opt")}
    assert (opts["a"].font_weight, opts["b"].font_weight) == ("normal", "bold")
    # the click re-ran the update set, which replaced the hover set's fill (Vega 5 behaviour:
    # a hover set only applies on pointerover, so specs must not rely on it across updates)
    assert opts["b"].fill == "#d62728"
    assert panel.errors() == []


def test_no_text_mark_is_clickable() -> None:
    """Every text mark of the shipped spec is non-interactive: on a canvas W&B's Vega would not
    pick it, and over a rect it would take the rect's clicks in SVG."""

    def texts(node: Any) -> list[dict[str, Any]]:
        if isinstance(node, dict):
            found = [node] if node.get("type") == "text" else []
            return found + [t for v in node.values() for t in texts(v)]
        if isinstance(node, list):
            return [t for v in node for t in texts(v)]
        return []

    marks = texts(_spec.filled({})["marks"])
    assert len(marks) > 20
    assert [m.get("name") for m in marks if m.get("interactive") is not False] == []


def test_harness_hover_drag_wheel(open_panel: OpenPanel) -> None:
    panel = open_panel(TOY, TOY_ROWS, width=400, height=200)
    assert panel.hover("opt", lambda i: i.datum["key"] == "a").mark == "opt"
    assert panel.signal("hovered") == "a"
    assert panel.item("opt", lambda i: i.datum["key"] == "a").fill == "#1f77b4"
    panel.move_away()
    assert panel.signal("hovered") == ""
    assert panel.warnings() == []

    before = panel.item("opt", lambda i: i.datum["key"] == "a")
    bg = panel.item("bg")
    start = (bg.x + 30, bg.y + bg.height - 30)
    assert panel.pick(*start).mark == "bg"
    panel.drag(start, (start[0] + 100, start[1] + 5))
    assert panel.signal("pan_x") == pytest.approx(100, abs=1)
    after = panel.item("opt", lambda i: i.datum["key"] == "a")
    assert after.x - before.x == pytest.approx(100, abs=1)
    panel.drag(start, (start[0] + 50, start[1]))  # a second drag continues from there
    assert panel.signal("pan_x") == pytest.approx(150, abs=1)

    panel.wheel(*start, delta_y=-100)
    assert panel.signal("zoom") > 1
    assert panel.errors() == []


@pytest.mark.parametrize("renderer", ["svg", "canvas"])
def test_harness_bounds_are_page_pixels(open_panel: OpenPanel, renderer: str) -> None:
    panel = open_panel(TOY, TOY_ROWS, width=400, height=200, renderer=renderer)
    box = panel.item("box")
    surface = panel.page.locator("#panel > svg, #panel > canvas").bounding_box()
    assert surface is not None
    # padding 7 + mark x 300, on a surface placed MARGIN_PX into the page
    assert (box.x, box.y) == pytest.approx((surface["x"] + 307, surface["y"] + 107), abs=0.5)
    assert (box.width, box.height) == pytest.approx((50, 30), abs=0.5)
    if renderer == "svg":  # cross-check with the element Vega's SVG renderer drew
        dom = panel.page.locator("#panel g.box path").bounding_box()
        assert dom is not None
        assert (box.x, box.y, box.width, box.height) == pytest.approx(
            (dom["x"], dom["y"], dom["width"], dom["height"]), abs=0.5
        )
    # nested group offsets are summed: the legend group sits at (20, 10)
    opt = panel.item("opt", lambda i: i.datum["key"] == "b")
    assert opt.x == pytest.approx(surface["x"] + 7 + 20 + 120, abs=1)
    assert panel.errors() == []


def test_harness_applies_wandb_patches(open_panel: OpenPanel) -> None:
    panel = open_panel(TOY, TOY_ROWS, width=420, height=222)
    assert panel.signal("nul") == {}
    # autosize fit, contains padding: the panel's size less the padding of 7
    assert (panel.signal("width"), panel.signal("height")) == (420 - 14, 222 - 14)
    spec = panel.page.evaluate('() => __mp.patch(\'{"a": [null, {"scale": {}}]}\', 1, 2)')
    assert spec == {
        "a": [{}, {"scale": None}],
        "autosize": {"type": "fit", "contains": "padding"},
        "width": 1,
        "height": 2,
    }
    assert panel.page.evaluate('() => Object.isFrozen(__mp.patch(\'{"a": {"b": []}}\', 1, 2).a.b)')


def test_harness_rows_arrive_after_first_render(open_panel: OpenPanel) -> None:
    panel = open_panel(TOY, None, width=400, height=200)
    assert panel.items("opt") == []
    panel.set_rows(TOY_ROWS)
    assert len(panel.items("opt")) == 2
    panel.set_rows(TOY_ROWS[:1])  # a new table replaces the old rows
    assert [i.datum["key"] for i in panel.items("opt")] == ["a"]
    assert panel.errors() == []


def test_harness_frozen_spec_rejects_inline_values(open_panel: OpenPanel) -> None:
    spec = copy.deepcopy(TOY)
    spec["data"] = [{"name": "wandb", "values": TOY_ROWS}]  # what W&B breaks (wandb#6766)
    panel = open_panel(spec, None, width=400, height=200)
    assert any("not extensible" in e for e in panel.errors()), panel.errors()


def test_harness_blocks_the_network(open_panel: OpenPanel) -> None:
    spec = copy.deepcopy(TOY)
    spec["data"] = [{"name": "wandb"}, {"name": "remote", "url": "https://example.com/x.json"}]
    panel = open_panel(spec, TOY_ROWS, width=400, height=200)
    errors = panel.errors()
    assert "request blocked: https://example.com/x.json" in errors, errors


# ---- the panel: the shipped spec with the rows of real profiles -------------------------------
ROOT = "<root>#0"
ENDS = ("input", "output")  # drawn white, never coloured
RUN_COLORS = ("rgb(83, 135, 221)", "rgb(229, 116, 57)")


def _profile(model: nn.Module, x: torch.Tensor) -> wandb_modprof.Profile:
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            train_step(model, x)
    return prof


def _rows(table: ProfileTable) -> list[dict[str, Any]]:
    # full keys to compare with; the panel gets the rows as stored (`browser.stored`)
    return table.resolved()


@pytest.fixture(scope="module")
def resnet_prof() -> wandb_modprof.Profile:
    torch.manual_seed(0)
    return _profile(ResNet(), resnet_input())


@pytest.fixture(scope="module")
def resnet_rows(resnet_prof: wandb_modprof.Profile) -> list[dict[str, Any]]:
    return _rows(resnet_prof.table())


@pytest.fixture(scope="module")
def gpt_rows() -> list[dict[str, Any]]:
    torch.manual_seed(0)
    return _rows(_profile(TinyGPT(), gpt_input()).table())


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return _spec.filled({})


Shot = Callable[[browser.Panel, str], None]


@pytest.fixture
def shot(request: pytest.FixtureRequest) -> Shot:
    """Screenshots for a person to look at, only where MODPROF_SCREENSHOTS names a folder."""
    folder = os.environ.get("MODPROF_SCREENSHOTS", "")

    def _shot(panel: browser.Panel, what: str) -> None:
        if folder:
            panel.screenshot(Path(folder) / f"{request.node.name}-{what}.png")

    return _shot


def as_run(rows: Sequence[Mapping[str, Any]], index: int, name: str) -> list[dict[str, Any]]:
    """The rows as W&B hands them over when several runs are shown: with the run's columns."""
    extra = {
        "id": f"run{index}",
        "name": name,
        "color": RUN_COLORS[index % 2],
        "_defaultColorIndex": index,
    }
    return [{**row, **extra} for row in rows]


def view_nodes(rows: Sequence[Mapping[str, Any]], view: str) -> dict[str, Mapping[str, Any]]:
    return {r["node_key"]: r for r in rows if r["row_kind"] == "node" and r["view_key"] == view}


def expected_t(nodes: Mapping[str, Mapping[str, Any]], mode: str, scale: str) -> dict[str, float]:
    """Where each coloured node sits on the Turbo bar: 0 at the view's min, 1 at its max."""
    m = _modes.mode(mode)
    values = {
        k: v
        for k, r in nodes.items()
        if r["node_kind"] not in ENDS and (v := m.value(dict(r))) is not None
    }
    if scale == "log":
        positive = [v for v in values.values() if v > 0]
        lo, hi = min(positive), max(positive)
        return {
            k: 0.0
            if v <= 0
            else (math.log(max(v, lo)) - math.log(lo)) / (math.log(hi) - math.log(lo))
            for k, v in values.items()
        }
    lo, hi = min(values.values()), max(values.values())
    return {k: (v - lo) / (hi - lo) for k, v in values.items()}


def fills(panel: browser.Panel) -> dict[str, str]:
    return {i.datum["node_key"]: i.fill for i in panel.items("node_rect")}


def assert_turbo(
    panel: browser.Panel, rows: Sequence[Mapping[str, Any]], mode: str, scale: str
) -> None:
    """Every node's fill is Turbo at its place between the view's min and max (white for the
    inputs and outputs, grey where the mode was not measured); the maximum is Turbo's end."""
    nodes = view_nodes(rows, panel.signal("view_now"))
    ts = expected_t(nodes, mode, scale)
    drawn = fills(panel)
    assert set(drawn) == set(nodes)
    for key, fill in drawn.items():
        if nodes[key]["node_kind"] in ENDS:
            expected = "#ffffff"
        elif key not in ts:
            expected = "#e3e3e3"  # not measured in this mode
        else:
            expected = panel.scale("turbo", ts[key])
        got, want = browser.parse_color(fill), browser.parse_color(expected)
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 2, (key, fill, expected)
    top = max(ts, key=lambda k: ts[k])
    assert browser.parse_color(drawn[top]) == browser.parse_color(panel.scale("turbo", 1))


def node_item(panel: browser.Panel, key: str) -> browser.Item:
    return panel.item("node_rect", lambda i: i.datum["node_key"] == key)


def test_panel_waits_for_rows_then_draws_the_root_view(
    open_panel: OpenPanel, spec: dict[str, Any], resnet_rows: list[dict[str, Any]], shot: Shot
) -> None:
    panel = open_panel(spec, None)
    assert panel.errors() == []
    assert panel.items("node_rect") == []
    loading = [i.text for i in panel.items("message")]
    assert len(loading) == 1 and "Loading" in loading[0], loading
    shot(panel, "loading")

    panel.set_rows(resnet_rows)
    assert panel.errors() == []
    assert panel.signal("view_now") == ROOT
    assert panel.signal("run_now") == ""
    assert panel.signal("mode") == _modes.DEFAULT_MODE
    drawn = [i.datum["node_key"] for i in panel.items("node_rect")]
    assert sorted(drawn) == sorted(view_nodes(resnet_rows, ROOT))
    assert len(panel.items("edge_path")) == sum(
        r["row_kind"] == "edge" and r["view_key"] == ROOT for r in resnet_rows
    )
    assert [i.text for i in panel.items("message")] == []
    assert panel.items("run_entry") == []  # one run: no run list
    assert_turbo(panel, resnet_rows, _modes.DEFAULT_MODE, "linear")
    shot(panel, "rows")


def test_totals_show_the_model_totals(
    open_panel: OpenPanel, spec: dict[str, Any], resnet_rows: list[dict[str, Any]]
) -> None:
    panel = open_panel(spec, resnet_rows)
    lines = [str(i.text) for i in panel.items("total_text") if i.text]
    meta = {r["meta_key"]: r["meta_number"] for r in resnet_rows if r["row_kind"] == "meta"}
    first = re.match(r"Forward ([\d.]+) (ms|s|µs)", lines[0])
    assert first is not None, lines
    assert to_ms(float(first[1]), first[2]) == pytest.approx(meta["total_fwd_ms"], rel=0.006)
    assert panel.errors() == []


@pytest.mark.parametrize("mode", ["act", "bwd", "param"])
@RENDERERS
def test_clicking_a_mode_recolours_the_nodes(
    open_panel: OpenPanel,
    spec: dict[str, Any],
    resnet_rows: list[dict[str, Any]],
    mode: str,
    shot: Shot,
    renderer: str,
) -> None:
    panel = open_panel(spec, resnet_rows, renderer=renderer)
    before = fills(panel)
    panel.click("mode_entry", lambda i: i.datum["key"] == mode)
    assert panel.signal("mode") == mode
    assert fills(panel) != before
    assert_turbo(panel, resnet_rows, mode, "linear")
    assert panel.errors() == []
    shot(panel, mode)


def test_a_mode_that_was_not_measured_cannot_be_picked(
    open_panel: OpenPanel, spec: dict[str, Any], resnet_rows: list[dict[str, Any]]
) -> None:
    # profiled without an optimizer: every node lists optimizer state as missing
    assert all(
        r["missing"] == "*" or "optim_bytes" in r["missing"]
        for r in resnet_rows
        if r["row_kind"] == "node"
    )
    panel = open_panel(spec, resnet_rows)
    panel.click("mode_entry", lambda i: i.datum["key"] == "optim")
    assert panel.signal("mode") == _modes.DEFAULT_MODE
    assert panel.errors() == []


def test_log_scale_recolours_the_nodes(
    open_panel: OpenPanel, spec: dict[str, Any], resnet_rows: list[dict[str, Any]], shot: Shot
) -> None:
    panel = open_panel(spec, resnet_rows)
    linear = fills(panel)
    panel.click("scale_entry", lambda i: i.datum["key"] == "log")
    assert panel.signal("scale_type") == "log"
    assert fills(panel) != linear
    assert_turbo(panel, resnet_rows, _modes.DEFAULT_MODE, "log")
    panel.click("scale_entry", lambda i: i.datum["key"] == "linear")
    assert fills(panel) == linear
    assert panel.errors() == []
    shot(panel, "log")


@RENDERERS
def test_clicking_a_module_drills_in_and_the_breadcrumb_goes_back(
    open_panel: OpenPanel,
    spec: dict[str, Any],
    resnet_rows: list[dict[str, Any]],
    shot: Shot,
    renderer: str,
) -> None:
    panel = open_panel(spec, resnet_rows, renderer=renderer)
    assert view_nodes(resnet_rows, ROOT)["layer2#0"]["has_view"] is True
    panel.click("node_rect", lambda i: i.datum["node_key"] == "layer2#0")
    assert panel.signal("view_now") == "layer2#0"
    drawn = sorted(i.datum["node_key"] for i in panel.items("node_rect"))
    assert drawn == sorted(view_nodes(resnet_rows, "layer2#0"))
    assert_turbo(panel, resnet_rows, _modes.DEFAULT_MODE, "linear")
    crumbs = sorted(panel.items("crumb"), key=lambda i: i.x)
    assert [c.datum["key"] for c in crumbs] == [ROOT, "layer2#0"]
    shot(panel, "layer2")

    # a node without a view of its own does nothing
    leaf = next(k for k, r in view_nodes(resnet_rows, "layer2#0").items() if not r["has_view"])
    panel.click("node_rect", lambda i: i.datum["node_key"] == leaf)
    assert panel.signal("view_now") == "layer2#0"

    panel.click("crumb", lambda i: i.datum["key"] == ROOT)
    assert panel.signal("view_now") == ROOT
    drawn = sorted(i.datum["node_key"] for i in panel.items("node_rect"))
    assert drawn == sorted(view_nodes(resnet_rows, ROOT))
    assert panel.errors() == []


def test_a_dominated_model_opens_inside_the_dominant_module(
    open_panel: OpenPanel, spec: dict[str, Any], shot: Shot
) -> None:
    """`body` holds >= 90 % of the time, and `body.inner` >= 90 % of body's: the panel opens on
    `body.inner` (the table's `open_view` row), the breadcrumb leads back, and the user's
    click wins over the opening view."""
    torch.manual_seed(0)
    model, x = Dominated(), torch.randn(512, 768)
    train_step(model, x)  # start-up, untimed
    rows = _rows(_profile(model, x).table())
    opened = [r["meta_value"] for r in rows if r["meta_key"] == "open_view"]
    assert opened == ["body.inner#0"]
    panel = open_panel(spec, rows)
    assert panel.errors() == []
    assert panel.signal("view_now") == "body.inner#0"
    crumbs = sorted(panel.items("crumb"), key=lambda i: i.x)
    assert [c.datum["key"] for c in crumbs] == [ROOT, "body#0", "body.inner#0"]
    assert_turbo(panel, rows, _modes.DEFAULT_MODE, "linear")
    shot(panel, "opened")
    panel.click("crumb", lambda i: i.datum["key"] == ROOT)
    assert panel.signal("view_now") == ROOT
    assert sorted(i.datum["node_key"] for i in panel.items("node_rect")) == sorted(
        view_nodes(rows, ROOT)
    )


def to_ms(value: float, unit: str) -> float:
    return value * {"s": 1000.0, "ms": 1.0, "µs": 0.001}[unit]


@RENDERERS
def test_hovering_a_node_shows_its_card(
    open_panel: OpenPanel,
    spec: dict[str, Any],
    resnet_rows: list[dict[str, Any]],
    shot: Shot,
    renderer: str,
) -> None:
    panel = open_panel(spec, resnet_rows, renderer=renderer)
    assert panel.items("card_text") == []
    row = view_nodes(resnet_rows, ROOT)["layer1#0"]
    panel.hover("node_rect", lambda i: i.datum["node_key"] == "layer1#0")
    assert panel.signal("hover_key") == "layer1#0"
    lines = [str(i.text) for i in sorted(panel.items("card_text"), key=lambda i: i.y)]
    assert "layer1" in lines[0], lines
    meta = {r["meta_key"]: r["meta_number"] for r in resnet_rows if r["row_kind"] == "meta"}
    fwd = next((line for line in lines if line.startswith("Forward: ")), None)
    assert fwd is not None, lines
    m = re.fullmatch(r"Forward: ([\d.]+) (ms|s|µs) \(([\d.]+)%\)", fwd)
    assert m is not None, fwd
    assert to_ms(float(m[1]), m[2]) == pytest.approx(row["fwd_ms"], rel=0.006)
    assert float(m[3]) == pytest.approx(100 * row["fwd_ms"] / meta["total_fwd_ms"], abs=0.06)
    assert any(line.startswith("Activations: ") and "iB" in line for line in lines), lines
    shot(panel, "card")
    panel.move_away()
    assert panel.signal("hover_key") == ""
    assert panel.items("card_text") == []
    assert panel.errors() == []


def test_top_list_jumps_to_the_node(
    open_panel: OpenPanel, spec: dict[str, Any], resnet_rows: list[dict[str, Any]]
) -> None:
    panel = open_panel(spec, resnet_rows)
    entries = sorted(panel.items("top_entry"), key=lambda i: i.datum["rank"])
    assert entries
    assert [i.y for i in entries] == sorted(i.y for i in entries)  # drawn in rank order
    m = _modes.mode(_modes.DEFAULT_MODE)
    ranked = sorted(
        (r for r in resnet_rows if r["row_kind"] == "node" and r["node_kind"] == "module"),
        key=lambda r: -(m.value(r) or 0),
    )
    assert entries[0].datum["node_key"] == ranked[0]["node_key"]
    deep = next(i for i in entries if i.datum["view_key"] != ROOT)
    panel.click("top_entry", lambda i: i.datum["node_key"] == deep.datum["node_key"])
    assert panel.signal("view_now") == deep.datum["view_key"]
    assert node_item(panel, deep.datum["node_key"]).visible
    assert panel.items("card_text"), "the jumped-to node's card is shown"
    assert panel.errors() == []


def two_runs(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    return [*as_run(a, 0, "run-a"), *as_run(b, 1, "run-b")]


@RENDERERS
def test_two_runs_show_one_at_a_time(
    open_panel: OpenPanel,
    spec: dict[str, Any],
    resnet_rows: list[dict[str, Any]],
    gpt_rows: list[dict[str, Any]],
    shot: Shot,
    renderer: str,
) -> None:
    panel = open_panel(spec, two_runs(resnet_rows, gpt_rows), renderer=renderer)
    assert panel.errors() == []
    entries = panel.items("run_entry")
    assert sorted(e.datum["run"] for e in entries) == ["run0", "run1"]
    assert panel.signal("run_now") == "run0"
    drawn = [i.datum for i in panel.items("node_rect")]
    assert sorted(d["node_key"] for d in drawn) == sorted(view_nodes(resnet_rows, ROOT))
    assert {d["id"] for d in drawn} == {"run0"}
    shot(panel, "run0")

    panel.click("run_entry", lambda i: i.datum["run"] == "run1")
    assert panel.signal("run_now") == "run1"
    drawn = [i.datum for i in panel.items("node_rect")]
    assert sorted(d["node_key"] for d in drawn) == sorted(view_nodes(gpt_rows, ROOT))
    assert {d["id"] for d in drawn} == {"run1"}
    assert_turbo(panel, gpt_rows, _modes.DEFAULT_MODE, "linear")
    assert panel.errors() == []
    shot(panel, "run1")


def run_without_table(index: int, name: str) -> dict[str, Any]:
    """What W&B hands the spec for a visible run that never logged this table: one row holding
    only the run's own fields (WANDB.md, checked against the app's panel code)."""
    return {
        "id": f"run{index}",
        "name": name,
        "color": RUN_COLORS[index % 2],
        "_defaultColorIndex": index,
    }


def test_a_first_run_without_the_table_is_left_out(
    open_panel: OpenPanel, spec: dict[str, Any], resnet_rows: list[dict[str, Any]]
) -> None:
    rows = [run_without_table(0, "no-table"), *as_run(resnet_rows, 1, "with-table")]
    panel = open_panel(spec, rows)
    assert panel.errors() == []
    assert [r["run"] for r in panel.data("runs")] == ["run1"]
    assert panel.signal("n_runs") == 1
    assert panel.signal("run_now") == "run1"
    drawn = [i.datum for i in panel.items("node_rect")]
    assert sorted(d["node_key"] for d in drawn) == sorted(view_nodes(resnet_rows, ROOT))
    assert not any(
        "not a wandb_modprof table" in t for t in [str(i.text) for i in panel.items("message")]
    )
    # Comparing needs two runs with the table: the table-less run offers no comparison.
    assert panel.items("compare_entry") == []
    assert panel.items("run_entry") == []


def test_only_runs_without_the_table_still_say_so(
    open_panel: OpenPanel, spec: dict[str, Any]
) -> None:
    panel = open_panel(spec, [run_without_table(0, "a"), run_without_table(1, "b")])
    assert panel.errors() == []
    assert panel.data("runs") == []
    assert panel.items("node_rect") == []
    assert any(
        "not a wandb_modprof table" in t for t in [str(i.text) for i in panel.items("message")]
    )


@RENDERERS
def test_compare_colours_the_slower_node_red(
    open_panel: OpenPanel,
    spec: dict[str, Any],
    resnet_rows: list[dict[str, Any]],
    shot: Shot,
    renderer: str,
) -> None:
    slow = "layer2#0"
    b = copy.deepcopy(resnet_rows)
    for r in b:
        if r["row_kind"] == "node" and r["view_key"] == ROOT and r["node_key"] == slow:
            r["fwd_ms"] *= 3
            r["bwd_ms"] *= 3
    panel = open_panel(spec, two_runs(resnet_rows, b), renderer=renderer)
    panel.click("run_entry", lambda i: i.datum["run"] == "run1")
    value_fills = fills(panel)
    panel.click("compare_entry")
    assert panel.signal("compare") is True
    assert panel.signal("baseline") == "run0"
    assert sorted(e.datum["run"] for e in panel.items("baseline_entry")) == ["run0", "run1"]
    compared = fills(panel)
    assert compared != value_fills
    red = browser.parse_color(panel.scale("diverge", 1))
    assert browser.parse_color(compared[slow]) == red

    def redness(color: str) -> int:
        r, g, bl = browser.parse_color(color)
        return r - (g + bl) // 2

    assert max(compared, key=lambda k: redness(compared[k])) == slow
    unchanged = [
        k for k, r in view_nodes(b, ROOT).items() if k != slow and r["node_kind"] == "module"
    ]
    neutral = browser.parse_color(panel.scale("diverge", 0))
    assert all(browser.parse_color(compared[k]) == neutral for k in unchanged)
    shot(panel, "compare")
    panel.click("compare_entry")
    assert fills(panel) == value_fills
    assert panel.errors() == []


def background_point(panel: browser.Panel) -> tuple[float, float]:
    """A point of the graph's background that no node, label or card covers."""
    bg = panel.item("graph_bg")
    for fy in (0.9, 0.75, 0.5, 0.25, 0.1):
        for fx in (0.1, 0.9, 0.3, 0.7, 0.5):
            x, y = bg.x + fx * bg.width, bg.y + fy * bg.height
            if panel.pick(x, y).mark == "graph_bg":
                return (x, y)
    raise AssertionError("no free background in the graph")


@RENDERERS
def test_dragging_the_background_pans_and_the_wheel_zooms(
    open_panel: OpenPanel,
    spec: dict[str, Any],
    resnet_rows: list[dict[str, Any]],
    shot: Shot,
    renderer: str,
) -> None:
    # 960 wide: the size the spec's own `width` signal insists on (test_panel_takes_the_size...)
    panel = open_panel(spec, resnet_rows, width=960, renderer=renderer)
    before = {i.datum["node_key"]: i for i in panel.items("node_rect")}
    start = background_point(panel)
    panel.drag(start, (start[0] - 60, start[1] - 40))
    after = {i.datum["node_key"]: i for i in panel.items("node_rect")}
    for key, item in before.items():
        assert (after[key].x - item.x, after[key].y - item.y) == pytest.approx((-60, -40), abs=1)
    shot(panel, "panned")

    anchor = background_point(panel)
    width = after["conv1#0"].width
    panel.wheel(*anchor, delta_y=-300)  # zoom in
    assert panel.items("node_rect", lambda i: i.datum["node_key"] == "conv1#0")[0].width > width
    panel.click("fit_button")
    reset = {i.datum["node_key"]: i for i in panel.items("node_rect")}
    assert reset["conv1#0"].width == pytest.approx(before["conv1#0"].width, abs=0.5)
    assert panel.errors() == []


def test_a_reduced_table_says_so(
    open_panel: OpenPanel, spec: dict[str, Any], resnet_prof: wandb_modprof.Profile, shot: Shot
) -> None:
    table = resnet_prof.table(max_rows=100)
    assert table.reduced
    rows = _rows(table)
    panel = open_panel(spec, rows)
    texts = [str(i.text) for i in panel.items("message")]
    assert any(t.startswith("Reduced to fit the table: ") and table.reduced in t for t in texts)
    assert sorted(i.datum["node_key"] for i in panel.items("node_rect")) == sorted(
        view_nodes(rows, ROOT)
    )
    assert panel.errors() == []
    shot(panel, "reduced")


def test_tinygpt_panel(
    open_panel: OpenPanel, spec: dict[str, Any], gpt_rows: list[dict[str, Any]], shot: Shot
) -> None:
    panel = open_panel(spec, gpt_rows, width=1200, height=700)
    assert panel.errors() == []
    assert sorted(i.datum["node_key"] for i in panel.items("node_rect")) == sorted(
        view_nodes(gpt_rows, ROOT)
    )
    assert_turbo(panel, gpt_rows, _modes.DEFAULT_MODE, "linear")
    shot(panel, "root")
    openable = next(i.datum["node_key"] for i in panel.items("node_rect") if i.datum["has_view"])
    panel.click("node_rect", lambda i: i.datum["node_key"] == openable)
    assert panel.signal("view_now") == openable
    assert panel.errors() == []
    shot(panel, "drilled")


@pytest.mark.parametrize(("width", "height"), [(900, 600), (640, 480), (1400, 800)])
def test_panel_takes_the_size_wandb_gives_it(
    open_panel: OpenPanel,
    spec: dict[str, Any],
    resnet_rows: list[dict[str, Any]],
    width: int,
    height: int,
) -> None:
    panel = open_panel(spec, resnet_rows, width=width, height=height)
    surface = panel.page.locator("#panel > svg").bounding_box()
    assert surface is not None
    assert (surface["width"], surface["height"]) == (width, height)
    pad = panel.evaluate("(view) => view.padding()")
    assert panel.signal("width") == pytest.approx(width - pad["left"] - pad["right"], abs=1)
    assert panel.signal("height") == pytest.approx(height - pad["top"] - pad["bottom"], abs=1)
    for mark in ("fit_button", "graph_bg", "mode_entry"):
        for item in panel.items(mark):
            assert item.x >= surface["x"] and item.x + item.width <= surface["x"] + width, mark
            assert item.y >= surface["y"] and item.y + item.height <= surface["y"] + height, mark
    assert panel.errors() == []


def test_panel_logs_no_warnings(
    open_panel: OpenPanel,
    spec: dict[str, Any],
    resnet_rows: list[dict[str, Any]],
) -> None:
    """W&B hides warnings (log level Error), but each one here has been a real problem."""
    panel = open_panel(spec, None)
    assert panel.warnings() == [], "before the rows arrive"
    panel.set_rows(resnet_rows)
    assert panel.warnings() == [], "after the rows arrive"


def test_spec_writes_no_null(spec: dict[str, Any]) -> None:
    """W&B turns every JSON null into {}: the spec must not rely on one anywhere."""

    def nulls(v: Any, path: str) -> Iterator[str]:
        if v is None:
            yield path
        elif isinstance(v, dict):
            for k, x in v.items():
                yield from nulls(x, f"{path}.{k}")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                yield from nulls(x, f"{path}[{i}]")

    assert list(nulls(spec, "spec")) == []


# ---- the colour statistic (issue 15 item 3) and the card's spread (issue 22 item 7) ---------
@pytest.fixture(scope="module")
def paused_rows() -> tuple[list[dict[str, Any]], wandb_modprof.Profile]:
    from helpers import gc_paused_profile

    prof, _ = gc_paused_profile()
    return _rows(prof.table()), prof


@RENDERERS
def test_a_paused_sample_does_not_colour_its_module_and_the_card_says_so(
    open_panel: OpenPanel,
    spec: dict[str, Any],
    paused_rows: tuple[list[dict[str, Any]], wandb_modprof.Profile],
    shot: Shot,
    renderer: str,
) -> None:
    rows, prof = paused_rows
    paused = "middle#0"
    stat = prof.stats()[paused].metrics["fwd_ms"]
    assert stat.mean > 2 * stat.median  # the pause is in the mean, not in the median
    panel = open_panel(spec, rows, renderer=renderer)
    # Self time: the collection ran in the paused module's own code (before its child), so
    # coloured by the mean it would be the view's maximum, at Turbo's end; by the median it
    # shows its own small work (a wrapper around one Linear).
    panel.click("mode_entry", lambda i: i.datum["key"] == "self")
    assert_turbo(panel, rows, "self", "linear")  # by the table's columns: the medians
    nodes = view_nodes(rows, ROOT)
    by_mean = {
        k: r["fwd_self_ms_mean"] + r["bwd_self_ms_mean"]
        for k, r in nodes.items()
        if r["node_kind"] == "module"
    }
    assert max(by_mean, key=lambda k: by_mean[k]) == paused  # what the mean would have shown
    turbo_end = browser.parse_color(panel.scale("turbo", 1))
    assert browser.parse_color(fills(panel)[paused]) != turbo_end
    headings = [str(i.text) for i in panel.items("totals_heading")]
    assert headings == ["PER STEP (median over samples)"], headings

    panel.hover("node_rect", lambda i: i.datum["node_key"] == paused)
    items = sorted(panel.items("card_text"), key=lambda i: i.y)
    lines = [str(i.text) for i in items]
    n = prof.num_samples
    ms = r"[\d.]+ (µs|ms|s)"
    assert any(re.fullmatch(f"Forward range: {ms} – {ms}", line) for line in lines), lines
    assert any(re.fullmatch(rf"mean {ms}, {n} samples", line) for line in lines), lines
    assert any(re.fullmatch(rf"GC in 1 of {n} samples \({ms}\)", line) for line in lines), lines
    # no note is cut at the card's edge (the spread note was: "... over 3 sa...")
    limit = _card_text_limit(spec)
    for item in items[1:]:
        assert item.width < limit - 4, (item.text, item.width, limit)
    shot(panel, "paused-card")
    assert panel.errors() == []


def _card_text_limit(spec: Mapping[str, Any]) -> float:
    """The card text mark's `limit` (px) in the generated spec."""

    def walk(marks: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        for mark in marks:
            yield mark
            yield from walk(mark.get("marks", []))

    card = next(m for m in walk(spec["marks"]) if m.get("name") == "card_text")
    encode = card["encode"]
    return float({**encode.get("enter", {}), **encode.get("update", {})}["limit"]["value"])


def test_a_version_1_profile_is_coloured_by_the_mean_and_says_so(
    open_panel: OpenPanel, spec: dict[str, Any]
) -> None:
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "tiny_gpt.v1.modprof.json"
    rows = _rows(wandb_modprof.load(fixture).table())
    panel = open_panel(spec, rows)
    headings = [str(i.text) for i in panel.items("totals_heading")]
    assert headings == ["PER STEP (mean: no medians kept)"], headings
    assert_turbo(panel, rows, _modes.DEFAULT_MODE, "linear")
    assert panel.errors() == []


# ---- calls that appeared after the graph was drawn (issue 15 item 4) -------------------------
def test_calls_no_graph_saw_are_flagged_in_the_banner_and_the_card(
    open_panel: OpenPanel, spec: dict[str, Any], shot: Shot
) -> None:
    from helpers import disabled_run
    from models import MoEModel, route_of, routed_input

    torch.manual_seed(0)
    model = MoEModel()
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
    for step in range(1, 5):  # expert 2 runs on step 2 only: a sample no graph was drawn from
        model(routed_input(route_of(step), step)).pow(2).mean().backward()
    rows = _rows(handle.unwatch().table())
    panel = open_panel(spec, rows)
    banner = [str(i.text) for i in panel.items("message")]
    assert any("appeared after the graph was drawn" in text for text in banner), banner
    if panel.signal("view_now") != "moe#0":  # (it opens inside `moe` when that holds >= 90 %)
        panel.click("node_rect", lambda i: i.datum["node_key"] == "moe#0")
    assert panel.signal("view_now") == "moe#0"

    def card(key: str) -> list[str]:
        panel.hover("node_rect", lambda i: i.datum["node_key"] == key)
        return [str(i.text) for i in sorted(panel.items("card_text"), key=lambda i: i.y)]

    note = "No edges: appeared after the graph was drawn"
    assert note in card("moe.experts.2#0")
    shot(panel, "unseen-card")
    assert note not in card("moe.experts.3#0")  # derived from step 4: drawn with its edges
    assert panel.errors() == []


def test_the_wandb_table_draws_what_the_full_table_draws(
    open_panel: OpenPanel, spec: dict[str, Any], resnet_prof: wandb_modprof.Profile
) -> None:
    """The W&B table carries only the columns the spec reads (`spec.read_columns`): fed those
    rows, the panel draws and says exactly what it does from the full table, in every mode,
    in the root view and a drilled-in one, and in the hover card."""
    from wandb_modprof.sinks.wandb.wandb_log import wandb_table

    table = resnet_prof.table()
    cells = wandb_table(table)
    assert len(cells.columns) < len(table.columns)
    logged = [dict(zip(cells.columns, row, strict=True)) for row in cells.data]
    full = _rows(table)
    panels = [open_panel(spec, rows) for rows in (full, logged)]

    def seen(panel: browser.Panel) -> tuple[Any, ...]:
        hover = "layer1#0" if panel.signal("view_now") == ROOT else None
        card: list[str] = []
        if hover is not None:
            panel.hover("node_rect", lambda i: i.datum["node_key"] == hover)
            card = [str(i.text) for i in sorted(panel.items("card_text"), key=lambda i: i.y)]
            panel.move_away()
        totals = [str(i.text) for i in panel.items("total_text")]
        return fills(panel), card, totals, len(panel.items("edge_path"))

    for mode in [m.key for m in _modes.MODES if m.key != "optim"]:
        for panel in panels:
            panel.click("mode_entry", lambda i, mode=mode: i.datum["key"] == mode)
        assert seen(panels[0]) == seen(panels[1]), mode
    for panel in panels:
        panel.click("node_rect", lambda i: i.datum["node_key"] == "layer1#0")
        assert panel.signal("view_now") != ROOT
    assert seen(panels[0]) == seen(panels[1])
    assert panels[0].errors() == panels[1].errors() == []


def test_hostile_names_reach_the_panel_through_the_packed_cell(
    open_panel: OpenPanel, spec: dict[str, Any]
) -> None:
    """Names holding the packing's own separator and escape (and commas, quotes, a newline,
    emoji): fed the W&B rows, where they travel escaped inside the packed cell, the panel
    draws the labels, sublabels, hover cards and colours it draws from the full rows."""
    from wandb_modprof.sinks.wandb.packed import ESC, SEP
    from wandb_modprof.sinks.wandb.wandb_log import wandb_table

    names = ("a" + SEP + "b", "c" + ESC + "d", ESC + "1" + ESC + "0" + ESC + SEP, 'q,"x"\n|')
    model = nn.Sequential()
    for name in names:
        model.add_module(name, nn.Linear(4, 4))
    table = _profile(model, torch.randn(2, 4, requires_grad=True)).table()
    cells = wandb_table(table)
    assert any(SEP in str(row[-1]) for row in cells.data)
    logged = [dict(zip(cells.columns, row, strict=True)) for row in cells.data]
    panels = [open_panel(spec, rows) for rows in (_rows(table), logged)]

    def seen(panel: browser.Panel) -> tuple[Any, ...]:
        cards = []
        for name in names:
            panel.hover("node_rect", lambda i, name=name: i.datum["node_key"] == f"{name}#0")
            cards.append([str(i.text) for i in sorted(panel.items("card_text"), key=lambda i: i.y)])
            panel.move_away()
        labels = sorted(str(i.text) for i in panel.items("node_label"))
        sublabels = sorted(str(i.text) for i in panel.items("node_sublabel"))
        return fills(panel), labels, sublabels, cards

    full, from_wandb = seen(panels[0]), seen(panels[1])
    assert full == from_wandb
    assert set(names) <= set(from_wandb[1]) | {n for card in from_wandb[3] for n in card}
    assert panels[0].errors() == panels[1].errors() == []


def test_a_group_card_names_its_first_members(open_panel: OpenPanel, spec: dict[str, Any]) -> None:
    """A layer whose cheapest experts were merged to fit the table: the group's hover card
    says how many and names the first ones (all are in `group_members`, which is why that
    column reaches W&B: `spec.read_columns`)."""
    from models import MoEStack, moe_input

    from wandb_modprof.sinks.wandb.packed import packed_columns
    from wandb_modprof.sinks.wandb.wandb_log import wandb_table

    torch.manual_seed(0)
    model = MoEStack(layers=1, experts=48)
    x = moe_input(model)
    prof = _profile(model, x)
    # 100 rows: at 150 the 48 experts fit whole, a grid with bundled edges (`view/blocks.py`)
    table = prof.table(max_rows=100)
    cells = wandb_table(table)
    assert "group_members" in packed_columns()[1]  # reaches W&B, packed
    rows = _rows(table)
    groups = [r for r in rows if r["row_kind"] == "node" and r["node_kind"] == "group"]
    assert groups, "the table fits without merging: lower max_rows"
    group = groups[0]
    logged = [dict(zip(cells.columns, row, strict=True)) for row in cells.data]
    panel = open_panel(spec, logged)
    opened = [r["meta_value"] for r in rows if r["meta_key"] == "open_view"]
    if opened != [group["view_key"]]:  # the panel opens on the layer when it dominates
        panel.click("node_rect", lambda i: i.datum["node_key"] == group["view_key"])  # drill in
    assert panel.signal("view_now") == group["view_key"]
    panel.hover("node_rect", lambda i: i.datum["node_kind"] == "group")
    lines = [str(i.text) for i in sorted(panel.items("card_text"), key=lambda i: i.y)]
    assert f"{group['group_count']} modules merged to fit the table" in lines, lines
    first = group["group_members"].split("\n")[:3]
    named_lines = [line for line in lines if line.startswith("e.g. ")]
    assert len(named_lines) == 1, "\n".join(lines)
    (named,) = named_lines
    assert named.rstrip("…") in "e.g. " + ", ".join(first), (named, first)
    assert first[0] in named


# ---- torch.compile'd models: the compiled-region notes (issue 16 item 3) ---------------------
def _compiled_rows(style: str) -> list[dict[str, Any]]:
    """TinyGPT trained under `watch`, compiled (aot_eager) as a whole or block by block."""
    import torch._dynamo
    from helpers import disabled_run

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = TinyGPT(vocab=64, dim=32, heads=2, layers=2, ctx=16)
    x = torch.randint(0, 64, (2, 16))
    if style == "whole":
        model: nn.Module = torch.compile(eager, backend="aot_eager")
    else:
        for block in eager.blocks:
            block.compile(backend="aot_eager")
        model = eager
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
    for _ in range(4):
        model(x).float().pow(2).mean().backward()
        model.zero_grad(set_to_none=True)
    return _rows(handle.unwatch().table())


def _card_lines(panel: browser.Panel, key: str) -> list[str]:
    panel.hover("node_rect", lambda i: i.datum["node_key"] == key)
    return [str(i.text) for i in sorted(panel.items("card_text"), key=lambda i: i.y)]


INSIDE_NOTE = ["fused by torch.compile, its own time", "and memory are not measured"]


def _inside(lines: list[str], region: str) -> bool:
    """The card holds the three lines of the note, in order, on consecutive lines."""
    note = [f"Inside compiled region {region}:", *INSIDE_NOTE]
    return any(lines[i : i + 3] == note for i in range(len(lines)))


def test_nodes_inside_a_compiled_block_say_so_in_the_card(
    open_panel: OpenPanel, spec: dict[str, Any], shot: Shot
) -> None:
    rows = _compiled_rows("blocks")
    panel = open_panel(spec, rows)
    # one `compiled_region` row per compiled block, in forward order: its root call's key and
    # how many calls ran fused inside it (other meta rows may name a block too: `open_view`)
    regions = [
        (str(r["meta_value"]), int(r["meta_number"]))
        for r in rows
        if r["row_kind"] == "meta" and r["meta_key"] == "compiled_region"
    ]
    assert [key for key, _ in regions] == ["blocks.0#0", "blocks.1#0"], regions
    count = dict(regions)["blocks.0#0"]
    # the panel opens on the root, or inside a block that held >= 90 % of the time (a stall on
    # a loaded machine can make one dominate: `view.meta.open_view`): back up to the root
    opened = [r["meta_value"] for r in rows if r["meta_key"] == "open_view"]
    assert panel.signal("view_now") == (opened[0] if opened else ROOT), opened
    if opened:
        panel.click("crumb", lambda i: i.datum["key"] == ROOT)
    assert panel.signal("view_now") == ROOT
    # the block: measured as one call, and how many calls ran fused inside it
    lines = _card_lines(panel, "blocks.0#0")
    assert "Compiled region (torch.compile)," in lines, lines
    assert f"measured as one call: its {count} calls inside" in lines, lines
    assert any(line.startswith("Forward: ") for line in lines), lines  # measured
    fused = sum(n for _, n in regions)
    totals = [str(i.text) for i in panel.items("total_text")]
    assert f"{fused} calls fused in 2 compiled regions" in totals, totals
    lines = _card_lines(panel, "wte#0")  # outside every region: no note
    assert not any("ompiled" in line for line in lines), lines
    # inside the block: every module node says it ran fused, and has no time of its own
    panel.click("node_rect", lambda i: i.datum["node_key"] == "blocks.0#0")
    assert panel.signal("view_now") == "blocks.0#0"
    lines = _card_lines(panel, "blocks.0.attn#0")
    assert _inside(lines, "blocks.0"), lines
    assert not any(line.startswith("Forward: ") for line in lines), lines
    (head,) = [str(i.text) for i in panel.items("strip_head")]
    assert "inside compiled region blocks.0, no call of this view ran on its own" in head, head
    shot(panel, "compiled-inner-card")
    limit = _card_text_limit(spec)  # no note cut at the card's edge
    for item in sorted(panel.items("card_text"), key=lambda i: i.y)[1:]:
        assert item.width < limit - 4, (item.text, item.width, limit)
    # the block's own view: its `self` node holds the block's whole time, and says why
    lines = _card_lines(panel, "blocks.0#0|self")
    assert "Compiled region blocks.0: the calls" in lines, lines
    assert any(line.startswith("Forward: ") for line in lines), lines
    # one level deeper, the view's own ops are inside the region too
    panel.click("node_rect", lambda i: i.datum["node_key"] == "blocks.0.attn#0")
    assert panel.signal("view_now") == "blocks.0.attn#0"
    lines = _card_lines(panel, "blocks.0.attn#0|self")
    assert _inside(lines, "blocks.0"), lines
    assert panel.errors() == []


def test_a_whole_compiled_model_names_its_class_in_the_card(
    open_panel: OpenPanel, spec: dict[str, Any], shot: Shot
) -> None:
    rows = _compiled_rows("whole")
    panel = open_panel(spec, rows)
    assert panel.signal("region_key") == ROOT
    lines = _card_lines(panel, "blocks.1#0")
    assert _inside(lines, "TinyGPT"), lines
    shot(panel, "whole-compiled-card")
    lines = _card_lines(panel, f"{ROOT}|self")
    assert "Compiled region TinyGPT: the calls" in lines, lines
    assert panel.errors() == []
