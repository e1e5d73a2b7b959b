"""A mixture-of-experts layer's view in the panel (real Vega 5 in Chromium, fed as W&B feeds
it): its 128 experts drawn as a grid in one frame (`view/blocks.py`) fit the graph area at a
readable size, and hovering an expert shows its card."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import browser
import pytest
import torch
from models import MoEStack, moe_input

import wandb_modprof
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.view.layout import FONT_PX

VIEW = "layers.0#0"
WIDTH, HEIGHT = 1200, 700


@pytest.fixture(scope="module")
def moe_rows() -> list[dict[str, Any]]:
    """`tests/models.py`'s MoEStack: two layers of 128 expert MLPs, every expert of the first
    layer hit, two profiled steps."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # 957 tiny calls: on 2 shared cores each op would wait for the pool
    model = MoEStack()
    x = moe_input(model)
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(x).pow(2).mean().backward()
    torch.set_num_threads(before)
    return prof.table().resolved()


@pytest.fixture
def panel(chromium: browser.Browser, moe_rows: list[dict[str, Any]]) -> Iterator[browser.Panel]:
    opened = chromium.open_panel(_spec.filled({}), moe_rows, width=WIDTH, height=HEIGHT)
    yield opened
    opened.close()


def _card(panel: browser.Panel) -> list[str]:
    return [str(i.text) for i in sorted(panel.items("card_text"), key=lambda i: i.y)]


def test_a_moe_layer_view_fits_and_an_expert_shows_its_card(
    panel: browser.Panel, moe_rows: list[dict[str, Any]]
) -> None:
    panel.click("node_rect", lambda i: i.datum["node_key"] == VIEW)  # open the layer
    assert panel.signal("view_now") == VIEW
    (frame,) = [i for i in panel.items("node_rect") if i.datum["node_kind"] == "block"]
    experts = [i for i in panel.items("node_rect") if ".experts." in i.datum["node_key"]]
    assert len(experts) == 128
    # The whole view fits the graph area, at a zoom where the labels are drawn.
    area = panel.item("graph_bg")
    for item in [frame, *experts, *panel.items("node_rect")]:
        assert area.x <= item.x and item.x + item.width <= area.x + area.width + 0.5, item.datum
        assert area.y <= item.y and item.y + item.height <= area.y + area.height + 0.5, item.datum
    k = panel.signal("k")
    assert panel.signal("show_text") and k * FONT_PX >= 6, k
    labels = {str(i.text) for i in panel.items("node_label") if i.text}
    assert {f"experts.{n}" for n in range(128)} <= labels
    assert any(t.startswith("128 MLP modules · hottest first") for t in labels), labels
    # The frame is behind its experts: the point at an expert's centre picks the expert.
    hottest_key = str(frame.datum["group_members"]).split("\n")[0]
    hottest = next(i for i in experts if i.datum["node_ref"] == hottest_key)
    assert panel.pick(hottest.cx, hottest.cy).datum["node_key"] == hottest.datum["node_key"]
    # The hottest expert is first: top left of the grid.
    assert (hottest.y, hottest.x) == min((i.y, i.x) for i in experts)
    # Edges: a handful (bundled at the frame), none drawn to an expert.
    edges = [r for r in moe_rows if r["row_kind"] == "edge" and r["view_key"] == VIEW]
    assert len(panel.items("edge_path")) == len(edges) <= 8

    panel.hover("node_rect", lambda i: i.datum["node_key"] == hottest.datum["node_key"])
    assert panel.signal("hover_key") == hottest.datum["node_key"]
    lines = _card(panel)
    name = re.sub(r"#0$", "", hottest.datum["node_key"])
    assert lines[0] == f"{name} (MLP)", lines
    row = next(r for r in moe_rows if r["node_key"] == hottest.datum["node_key"])
    assert any(line.startswith("Fwd + bwd: ") for line in lines), lines
    assert not any("No edges" in line for line in lines), lines
    assert row["row_kind"] == "node" and row["fwd_ms"] > 0
    # Hovering the frame's head (above the grid) names the block.
    panel.hover_at(frame.x + frame.width / 2, frame.y + 4)
    assert _card(panel)[0] == "128 MLP modules", _card(panel)
    assert panel.errors() == [] and panel.warnings() == []
    folder = os.environ.get("MODPROF_SCREENSHOTS", "")
    if folder:
        panel.hover("node_rect", lambda i: i.datum["node_key"] == hottest.datum["node_key"])
        panel.screenshot(Path(folder) / "moe-grid.png")


def test_a_framed_expert_is_not_flagged_as_drawn_without_edges(
    chromium: browser.Browser, moe_rows: list[dict[str, Any]]
) -> None:
    """The card's "No edges" note marks module nodes without edges in tables where some calls
    appeared after the graph was drawn (meta `unseen_calls`); a framed expert's edges are its
    frame's, so it has none of its own and no note. The rows get the meta row
    `view/meta.unseen_meta` writes for such a table; then one expert is taken off the frame's
    list of members: that one gets the note (the frame's list is what keeps it off)."""
    base = next(r for r in moe_rows if r["row_kind"] == "meta")
    unseen = {**base, "meta_key": "unseen_calls", "meta_number": 1.0, "missing": "",
              "meta_value": "1 call appeared after the graph was drawn"}  # fmt: skip
    frame_row = next(r for r in moe_rows if r["node_kind"] == "block" and r["view_key"] == VIEW)
    members = str(frame_row["group_members"]).split("\n")
    kept, off = members[5], members[6]
    listed = [*moe_rows, unseen]
    unlisted = [
        {**r, "group_members": "\n".join(m for m in members if m != off)} if r is frame_row else r
        for r in listed
    ]
    note = "No edges: appeared after the graph was drawn"

    def card_of(ref: str) -> list[str]:
        panel.hover("node_rect", lambda i: i.datum["node_ref"] == ref)
        return _card(panel)

    panel = chromium.open_panel(_spec.filled({}), listed, width=WIDTH, height=HEIGHT)
    try:
        panel.click("node_rect", lambda i: i.datum["node_key"] == VIEW)
        assert len(panel.data("vframed")) == 128
        for ref in (kept, off):
            lines = card_of(ref)
            assert lines and note not in lines, (ref, lines)
        panel.set_rows(unlisted)
        if panel.signal("view_now") != VIEW:
            panel.click("node_rect", lambda i: i.datum["node_key"] == VIEW)
        assert len(panel.data("vframed")) == 127
        assert note in card_of(off), card_of(off)
        assert note not in card_of(kept), card_of(kept)
        assert panel.errors() == []
    finally:
        panel.close()
