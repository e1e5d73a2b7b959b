"""The "Checkpoint value" mode in the panel (real Vega 5 in Chromium, fed as W&B feeds it):
picked by a click, nodes coloured by bytes freed per ms of recompute, the modules of the plan
marked in the graph and in the ranked list, the plan's lines beside the legend (or in the
banner where a low panel has no room for them), and the card saying where a module stands."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import browser
import pytest
import torch
from models import ResNet, resnet_input

import wandb_modprof
from wandb_modprof.records.checkpoint import STATE_TEXT
from wandb_modprof.records.modes import mode
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.view.checkpoint_cells import STATE_CODES

PLANNED = STATE_CODES["planned"]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = ResNet()
    x = resnet_input(2, 32)
    model(x).sum().backward()
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(x).sum().backward()
    return prof.table(checkpoint_budget="25%").resolved()


@pytest.fixture
def panel_of(chromium: browser.Browser) -> Iterator[Any]:
    opened: list[browser.Panel] = []

    def _open(rows: list[dict[str, Any]], width: int = 1100, height: int = 640) -> browser.Panel:
        panel = chromium.open_panel(_spec.filled({}), rows, width=width, height=height)
        opened.append(panel)
        panel.click("mode_entry", lambda i: i.datum["key"] == "ckpt")
        assert panel.signal("mode") == "ckpt"
        return panel

    yield _open
    for panel in opened:
        panel.close()


def _view_nodes(rows: list[dict[str, Any]], view: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["row_kind"] == "node" and r["view_key"] == view]


def _drawn(item: browser.Item) -> bool:
    """A symbol drawn at a size above 0 (the mark's size is 0 off its mode / state)."""
    return float(item.props.get("size") or 0) > 0


def _plan_lines(rows: list[dict[str, Any]]) -> list[str]:
    (meta,) = [r for r in rows if r["row_kind"] == "meta" and r["meta_key"] == "ckpt_plan"]
    return str(meta["meta_value"]).split("\n")


def test_colours_marks_and_plan_lines(panel_of: Any, rows: list[dict[str, Any]]) -> None:
    panel = panel_of(rows)
    view = panel.signal("view_now")
    nodes = _view_nodes(rows, view)
    values = {n["node_key"]: v for n in nodes if (v := mode("ckpt").value(n)) is not None}
    assert values and max(values.values()) > 0
    fills = {i.datum["node_key"]: i.fill for i in panel.items("node_rect")}
    best = max(values, key=lambda k: values[k])
    end = browser.parse_color(panel.scale("turbo", 1))
    assert browser.parse_color(fills[best]) == end
    # the marks: one on each planned module of the view, none elsewhere
    planned = {
        n["node_key"] for n in nodes if n["node_kind"] == "module" and n["ckpt_state"] == PLANNED
    }
    assert planned, "the 25 % plan checkpoints modules of the top view"
    marked = {i.datum["node_key"] for i in panel.items("node_planned") if _drawn(i)}
    assert marked == planned
    # the plan's lines in place of the totals, under their heading
    shown = [str(i.text) for i in panel.items("total_text") if i.text]
    assert shown == _plan_lines(rows)
    (heading,) = panel.items("totals_heading")
    assert str(heading.text).startswith("CHECKPOINT PLAN")
    # the ranked list marks the planned entries the way the graph does
    for item in panel.items("top_label"):
        key = item.datum["node_key"]
        if key in planned:
            assert "○ " in str(item.text), item.text
    # another mode: no marks, the totals again
    panel.click("mode_entry", lambda i: i.datum["key"] == "act")
    assert not [i for i in panel.items("node_planned") if _drawn(i)]
    assert not any("Plan at" in str(i.text) for i in panel.items("total_text"))
    assert panel.errors() == []


def test_the_card_says_where_a_module_stands(panel_of: Any, rows: list[dict[str, Any]]) -> None:
    panel = panel_of(rows)
    nodes = _view_nodes(rows, panel.signal("view_now"))
    for state in ("planned", "candidate"):
        node = next(
            n for n in nodes if n["node_kind"] == "module" and n["ckpt_state"] == STATE_CODES[state]
        )
        panel.hover("node_rect", lambda i, k=node["node_key"]: i.datum["node_key"] == k)
        lines = [str(i.text) for i in panel.items("card_text")]
        assert f"Plan: {STATE_TEXT[state]}" in lines, lines
        assert any(line.startswith("Frees ~") and "recompute" in line for line in lines), lines
    assert panel.errors() == []


def test_a_low_panel_says_the_plan_in_the_banner(panel_of: Any, rows: list[dict[str, Any]]) -> None:
    panel = panel_of(rows, 640, 400)
    assert panel.signal("totals_on") is False
    (message,) = panel.items("message")
    assert str(message.text).startswith(" · ".join(_plan_lines(rows)[:1]))
    (box,) = panel.items("banner_bg")  # the banner's line lies inside its box
    assert box.y - 1 <= message.y and message.y + message.height <= box.y + box.height + 1
    assert len([i for i in panel.items("top_label") if i.text]) >= 5
    assert panel.errors() == []
