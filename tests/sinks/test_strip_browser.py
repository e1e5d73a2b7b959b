"""The detail strip (`tools/spec/strip.py`, issue 18) in real Vega 5 inside real Chromium, fed
the way W&B feeds it (tests/browser.py): spans of the hovered or clicked node in both graph and
strip, the memory curve against the recorded sample, the named peak, and the panel sizes W&B
uses.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import browser
import pytest
import torch
from models import ResNet, resnet_input
from panel import gpt2_profile

import wandb_modprof
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.view.units import format_value

OpenPanel = Callable[..., browser.Panel]


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


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return _spec.filled({})


@pytest.fixture(scope="module")
def resnet() -> Any:
    torch.manual_seed(0)
    model = ResNet()
    x = resnet_input(2, 32)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(x).sum().backward()
    return prof


@pytest.fixture(scope="module")
def gpt2() -> Any:
    return gpt2_profile()


def _js(panel: browser.Panel, expr: str) -> Any:
    return panel.evaluate(f"() => {expr}")


def _shot(panel: browser.Panel, what: str) -> None:
    """Screenshots for a person to look at, only where MODPROF_SCREENSHOTS names a folder."""
    folder = os.environ.get("MODPROF_SCREENSHOTS", "")
    if folder:
        panel.screenshot(Path(folder) / f"strip-{what}.png")


def _axis(items: Sequence[browser.Item]) -> Callable[[float], float]:
    """The page x of a time, from the earliest- and latest-starting of `items` (rects whose x
    is their start)."""
    first = min(items, key=lambda i: i.datum["t0_ms"])
    last = max(items, key=lambda i: i.datum["t0_ms"])
    slope = (last.x - first.x) / (last.datum["t0_ms"] - first.datum["t0_ms"])
    return lambda t: first.x + slope * (t - first.datum["t0_ms"])


def _root_spans(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    meta = {r["meta_key"]: r for r in rows if r["row_kind"] == "meta"}
    root = meta["root_view"]["meta_value"]
    return [
        r
        for r in rows
        if r["row_kind"] == "span" and r["view_key"] == root and r["node_key"] == key
    ]


def test_hovering_and_clicking_a_node_marks_its_spans_in_the_strip(
    open_panel: OpenPanel, spec: dict[str, Any], resnet: Any
) -> None:
    rows = resnet.table().resolved()
    panel = open_panel(spec, rows, width=1200, height=700)
    assert panel.errors() == [] and panel.warnings() == []
    spans = panel.items("span_rect")
    expected = [r for r in rows if r["row_kind"] == "span" and r["view_key"] == "<root>#0"]
    assert len(spans) == len(expected) > 0
    # on one linear time axis: each span starts where its recorded start maps to
    to_px = _axis(spans)
    for item in spans:
        assert item.x == pytest.approx(to_px(item.datum["t0_ms"]), abs=1.0), item.datum
    # hover layer2 in the graph: its spans (forward, backward) are outlined in the strip
    panel.hover("node_rect", lambda i: i.datum["node_key"] == "layer2#0")
    assert panel.signal("card_key") == "layer2#0"
    outlined = [i for i in panel.items("span_rect") if i.stroke == "#000000"]
    assert {i.datum["node_key"] for i in outlined} == {"layer2#0"}
    assert len(outlined) == len(_root_spans(rows, "layer2#0")) >= 2
    assert {i.datum["span_phase"] for i in outlined} == {"fwd", "bwd"}
    panel.move_away()
    # hover a span in the strip: the node's card, and the node outlined in the graph
    panel.hover("span_rect", lambda i: i.datum["node_key"] == "layer3#0")
    assert panel.signal("card_key") == "layer3#0"
    card = [i.text for i in panel.items("card_text")]
    assert card and card[0].startswith("layer3")
    box = panel.item("node_rect", lambda i: i.datum["node_key"] == "layer3#0")
    assert box.stroke == "#000000"
    # click a span: the node stays focused when the mouse leaves
    panel.click("span_rect", lambda i: i.datum["node_key"] == "layer1#0")
    panel.move_away()
    assert panel.signal("focus_key") == "layer1#0" and panel.signal("card_key") == "layer1#0"
    assert panel.errors() == []


def test_memory_mode_draws_the_recorded_curve_the_shaded_spans_and_the_named_peak(
    open_panel: OpenPanel, spec: dict[str, Any], gpt2: Any
) -> None:
    rows = gpt2.table().resolved()
    sample = gpt2.last_sample
    panel = open_panel(spec, rows, width=1200, height=700)
    # GPT-2 opens on `transformer` where it holds >= 90 % of the time (`view.meta.open_view`;
    # on a loaded machine it may not): back up to the model
    assert panel.signal("view_now") in ("transformer#0", "<root>#0")
    if panel.signal("view_now") == "transformer#0":
        panel.click("crumb", lambda i: i.datum["key"] == "<root>#0")
    assert panel.signal("view_now") == "<root>#0"
    assert _js(panel, "__mp.view.data('mem_drawn').length") == 0  # time mode: no curve
    panel.click("mode_entry", lambda i: i.datum["key"] == "act")
    assert panel.signal("mode_group") == "Memory"
    assert panel.items("span_rect") == []  # the time lanes give way to the curve
    # the curve drawn is the recorded one, point for point (small enough to keep whole)
    drawn = _js(panel, "__mp.view.data('mem_drawn').map((d) => [d.t0_ms, d.live_bytes])")
    curve = sample.memory
    recorded = [[t, float(b)] for t, b in zip(curve.t_ms, curve.live_bytes, strict=True)]
    assert drawn == recorded
    assert len(panel.items("mem_curve")) == len(recorded)
    top = max(sample.memory.live_bytes)
    at = sample.memory.t_ms[sample.memory.live_bytes.index(top)]
    # ... and named, with the call running then
    meta = {r["meta_key"]: r for r in rows if r["row_kind"] == "meta"}
    key, phase = meta["mem_peak"]["meta_value"], meta["mem_peak_ms"]["meta_value"]
    name = "GPT2LMHeadModel" if key == "<root>#0" else key.removesuffix("#0")
    head = _js(panel, "__mp.view.data('strip_head').map((d) => d.text)")
    assert len(head) == 1
    assert f"peak {format_value('bytes', top)} during {name} {phase}" in head[0], head
    # hover a block: its forward and backward spans are shaded over the curve
    panel.hover("node_rect", lambda i: i.datum["node_key"] == "transformer#0")
    shaded = panel.items("strip_shade")
    assert len(shaded) == len(_root_spans(rows, "transformer#0")) >= 2
    assert {i.datum["span_phase"] for i in shaded} == {"fwd", "bwd"}
    # the peak is marked where the recorded maximum is, on the shades' time axis
    mark = panel.item("mem_peak")
    assert mark.datum["meta_number"] == top
    assert mark.cx == pytest.approx(_axis(shaded)(at), abs=1.5)
    assert panel.errors() == [] and panel.warnings() == []


def test_a_table_without_a_timeline_gives_the_graph_the_whole_height(
    open_panel: OpenPanel, spec: dict[str, Any], resnet: Any
) -> None:
    """A table logged before issue 18 has no span or mem rows: no strip, no room taken."""
    rows = resnet.table().resolved()
    old = [r for r in rows if r["row_kind"] not in ("span", "mem")]
    with_strip = open_panel(spec, rows, width=900, height=600)
    without = open_panel(spec, old, width=900, height=600)
    assert without.signal("strip_h") == 0 and with_strip.signal("strip_h") > 0
    assert without.signal("gh") > with_strip.signal("gh")
    assert without.items("span_rect") == [] and without.errors() == []


@pytest.mark.parametrize("size", [(960, 600), (520, 320), (1600, 900)])
def test_the_strip_fits_the_panel_sizes_wandb_uses(
    open_panel: OpenPanel, spec: dict[str, Any], gpt2: Any, size: tuple[int, int]
) -> None:
    width, height = size
    rows = gpt2.table().resolved()
    panel = open_panel(spec, rows, width=width, height=height)
    for mode in ("fwd_bwd", "peak"):
        # (the harness's set_signal returns the view, which playwright cannot serialise)
        panel.evaluate("(view, v) => { view.signal('mode', v); return 0; }", mode)
        panel.settle()
        assert panel.signal("mode_group") == ("Memory" if mode == "peak" else "Time")
        assert panel.errors() == [] and panel.warnings() == []
        bottom = panel.signal("strip_y") + panel.signal("strip_h")
        assert bottom <= height  # under the graph, above the panel's foot
        assert panel.signal("strip_y") >= 30 + panel.signal("gh")  # never over the graph
        _shot(panel, f"gpt2-{mode}-{width}x{height}")
