"""The efficiency modes in the panel (real Vega 5 in Chromium, fed as W&B feeds it): picked by
a click, the nodes are coloured by the time lost to the roofline, and the hover card's new
lines (no work, above the roofline and why, compare mode without a ratio) fit the card."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import browser
import pytest
import torch
from models import ResNet
from panel import as_run
from torch import nn

import wandb_modprof
from wandb_modprof.records.modes import mode
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.view.columns import BOUND_CODES

ROOT = "<root>#0"


class _IdleResNet(ResNet):
    """`tests/models.py`'s ResNet with a no-op module (an `nn.Identity`) in its root view."""

    def __init__(self) -> None:
        super().__init__()
        self.idle = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.idle(x))


def _rows(**peaks: float) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = _IdleResNet()
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    with wandb_modprof.profile(model, settings=wandb_modprof.Settings(**peaks)) as prof:
        for _ in range(3):
            model(x).sum().backward()
    return prof.table().resolved()


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return _rows()


@pytest.fixture(scope="module")
def above_rows() -> list[dict[str, Any]]:
    """A memory peak given far below the machine's: its calls with bytes are above it."""
    return _rows(peak_bw=1e6)


@pytest.fixture
def open_panel(chromium: browser.Browser) -> Iterator[Any]:
    opened: list[browser.Panel] = []

    def _open(rows: Sequence[Mapping[str, Any]]) -> browser.Panel:
        panel = chromium.open_panel(_spec.filled({}), rows)
        opened.append(panel)
        return panel

    yield _open
    for panel in opened:
        panel.close()


def _card_limit() -> float:
    """The card text mark's `limit` (px) in the generated spec."""

    def walk(marks: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        for mark in marks:
            yield mark
            yield from walk(mark.get("marks", []))

    card = next(m for m in walk(_spec.filled({})["marks"]) if m.get("name") == "card_text")
    encode = card["encode"]
    return float({**encode.get("enter", {}), **encode.get("update", {})}["limit"]["value"])


def _card(panel: browser.Panel, key: str) -> list[browser.Item]:
    panel.hover("node_rect", lambda i: i.datum["node_key"] == key)
    return sorted(panel.items("card_text"), key=lambda i: i.y)


def _fits(items: list[browser.Item], wanted: set[str]) -> None:
    """Every line in `wanted` is on the card, none cut at its edge."""
    limit = _card_limit()
    found = {str(i.text): i for i in items}
    assert wanted <= set(found), (wanted, list(found))
    for text in wanted:
        assert 0 < found[text].width < limit - 4, (text, found[text].width, limit)


def test_clicking_efficiency_colours_by_time_lost_and_the_card_says_no_work(
    open_panel: Any, rows: list[dict[str, Any]]
) -> None:
    panel = open_panel(rows)
    panel.click("mode_entry", lambda i: i.datum["key"] == "eff")
    assert panel.signal("mode") == "eff"
    m = mode("eff")
    nodes = [r for r in rows if r["row_kind"] == "node" and r["view_key"] == ROOT]
    lost = {n["node_key"]: v for n in nodes if (v := m.colour_value(n)) is not None}
    hottest = max(lost, key=lambda k: lost[k])
    fills = {i.datum["node_key"]: i.fill for i in panel.items("node_rect")}
    end = browser.parse_color(panel.scale("turbo", 1))
    assert browser.parse_color(fills[hottest]) == end
    at_end = [k for k, f in fills.items() if browser.parse_color(f) == end]
    # the end colour is the most time lost; another call shares it only where its value is
    # within a colour step of the hottest's (two stages losing nearly the same time)
    assert hottest in at_end and len(at_end) < len(fills)
    assert all(lost[k] >= 0.97 * lost[hottest] for k in at_end), {k: lost[k] for k in at_end}
    (title,) = panel.items("colorbar_title")
    assert title.text == "Time lost vs roofline (fwd)"
    _fits(_card(panel, "idle#0"), {"Fwd: no work: no FLOPs, no bytes moved"})
    assert panel.errors() == []


def test_the_above_the_roofline_lines_fit_the_card(
    open_panel: Any, above_rows: list[dict[str, Any]]
) -> None:
    edited = [dict(r) for r in above_rows]
    for r in edited:  # the compute side's reason too (a call below the raising threshold)
        if r["row_kind"] == "node" and r["node_key"] == "fc#0":
            r["fwd_bound"] = BOUND_CODES["above_compute"]
    panel = open_panel(edited)
    panel.click("mode_entry", lambda i: i.datum["key"] == "eff")
    above = "Fwd: above the roofline, capped at 100%"
    _fits(_card(panel, "relu#0"), {above, "reason: cached data beat the memory peak"})
    _fits(_card(panel, "fc#0"), {above, "reason: peak FLOP/s below the real one"})
    assert panel.errors() == []


def test_compare_mode_says_where_there_is_no_ratio(
    open_panel: Any, above_rows: list[dict[str, Any]]
) -> None:
    """Two runs whose calls are all above the roofline: no time lost, so no ratio anywhere;
    the card says so instead of calling the module new."""
    runs = as_run(above_rows, "run-a", "a", 0) + as_run(above_rows, "run-b", "b", 1)
    panel = open_panel(runs)
    panel.click("mode_entry", lambda i: i.datum["key"] == "eff")
    panel.click("compare_entry")
    assert panel.signal("cmp") is True
    (title,) = panel.items("colorbar_title")
    assert title.text == "Ratio to baseline, time lost (fwd)"
    _fits(_card(panel, "relu#0"), {"vs baseline: no ratio (0 or not measured)"})
    assert panel.errors() == []
