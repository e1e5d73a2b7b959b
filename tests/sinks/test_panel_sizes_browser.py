"""The panel at the sizes W&B gives it (640x400: a panel in a workspace section; 1100x640: a
panel opened full width), in every analysis mode, in real Vega 5 inside real Chromium: no text
smaller than `MIN_TEXT_PX` on screen (a node too small for its label shows it on hover), no
text outside the panel (the sidebar shortens its ranked list to what fits), and no two texts
over each other (a ranked entry's value never runs into its name). The HTML report's chart
the same in a 700 px window."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import browser
import pytest
import torch
from models import gpt2_from_config
from panel import moe_profile

import wandb_modprof
from wandb_modprof.records.modes import MODES
from wandb_modprof.sinks import spec as _spec

MIN_TEXT_PX = 9
SIZES = ((640, 400), (1100, 640))


def _text_marks(node: Any) -> Iterator[str]:
    """The names of every text mark of the spec."""
    if isinstance(node, dict):
        if node.get("type") == "text" and isinstance(node.get("name"), str):
            yield node["name"]
        for value in node.values():
            yield from _text_marks(value)
    elif isinstance(node, list):
        for value in node:
            yield from _text_marks(value)


@pytest.fixture(scope="module")
def profile() -> Any:
    torch.manual_seed(0)
    model = gpt2_from_config(layers=4)
    ids = torch.randint(0, 512, (2, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with wandb_modprof.profile(model, optimizer=optimizer) as prof:
        for _ in range(3):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return prof


@pytest.fixture(scope="module")
def rows(profile: Any) -> list[dict[str, Any]]:
    return profile.table().records()


def _texts(panel: browser.Panel, marks: list[str]) -> list[browser.Item]:
    return [
        item
        for mark in marks
        for item in panel.items(mark)
        if item.visible and isinstance(item.text, str) and item.text.strip()
    ]


def _overlap(a: browser.Item, b: browser.Item) -> float:
    w = min(a.x + a.width, b.x + b.width) - max(a.x, b.x)
    h = min(a.y + a.height, b.y + b.height) - max(a.y, b.y)
    return w * h if w > 1 and h > 1 else 0.0


def _check(panel: browser.Panel, marks: list[str], selector: str, where: str) -> None:
    """No text under `MIN_TEXT_PX`, none outside the element `selector` (the panel, or the
    report's chart), no two over each other, no error."""
    left, top, right, bottom = panel.page.evaluate(_BOX_OF, selector)
    texts = _texts(panel, marks)
    assert len(texts) > 20, where
    small = [(t.mark, t.text, t.props.get("fontSize")) for t in texts
             if float(t.props.get("fontSize", 0)) < MIN_TEXT_PX]  # fmt: skip
    assert not small, (where, small[:5])
    outside = [
        (t.mark, t.text)
        for t in texts
        if t.x < left - 1
        or t.y < top - 1
        or t.x + t.width > right + 1
        or t.y + t.height > bottom + 1
    ]
    assert not outside, (where, outside[:5])
    over = [
        (a.mark, a.text, b.mark, b.text)
        for i, a in enumerate(texts)
        for b in texts[i + 1 :]
        if _overlap(a, b) > 0
    ]
    assert not over, (where, over[:5])
    assert panel.errors() == [], where


def _every_mode(panel: browser.Panel, marks: list[str], selector: str, name: str) -> None:
    """`_check` in every analysis mode, in the view the panel opened on and in a block's."""
    for views in ((), ("transformer", "h.0")):
        # drill down as a user does (the panel may have opened inside `transformer` already:
        # it opens inside a module that holds >= 90 % of the time)
        for label in views:
            named = [i for i in panel.items("node_rect") if i.datum.get("label") == label]
            if label == "transformer" and not any(i.visible for i in named):
                continue
            panel.click("node_rect", lambda item, label=label: item.datum.get("label") == label)
        for mode in MODES:
            panel.click("mode_entry", lambda i, k=mode.key: i.datum.get("key") == k)
            _check(panel, marks, selector, f"{name}, {mode.key}, view {views or 'first'}")
            folder = os.environ.get("MODPROF_SCREENSHOTS", "")
            if folder and not views:
                panel.screenshot(Path(folder) / f"size-{name}-{mode.key}.png")


_BOX_OF = (
    "(sel) => { const r = document.querySelector(sel).getBoundingClientRect();"
    " return [r.left, r.top, r.right, r.bottom]; }"
)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_panel_is_readable_and_whole_in_every_mode(
    chromium: browser.Browser, rows: list[dict[str, Any]], size: tuple[int, int]
) -> None:
    spec = _spec.filled({})
    width, height = size
    panel = chromium.open_panel(spec, rows, width=width, height=height)
    try:
        _every_mode(panel, sorted(set(_text_marks(spec))), "#panel", f"{width}x{height}")
    finally:
        panel.close()


def test_the_report_is_readable_and_whole_in_a_narrow_window(
    chromium: browser.Browser, profile: Any, tmp_path: Path
) -> None:
    path = profile.to_html(tmp_path / "report.html", title="GPT-2")
    report = chromium.open_report(path, width=700, height=500)
    try:
        # the chart (the report's header above it is HTML, not Vega text)
        chart = "canvas, svg"
        assert report.page.evaluate(_BOX_OF, chart)[2] <= 700 + 1  # no sideways scrolling
        _every_mode(report, sorted(set(_text_marks(_spec.filled({})))), chart, "report-700x500")
    finally:
        report.close()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_grid_of_experts_is_readable_and_whole(
    chromium: browser.Browser, size: tuple[int, int]
) -> None:
    """A layer's 128 experts drawn as a grid (`view/blocks.py`): small boxes, each with a `+`."""
    rows = moe_profile().table().records()
    spec = _spec.filled({})
    width, height = size
    panel = chromium.open_panel(spec, rows, width=width, height=height)
    try:
        if panel.signal("view_now") != "layers.0#0":
            panel.click("node_rect", lambda item: item.datum.get("label") == "layers.0")
        assert len(panel.items("node_rect")) > 128
        for mode in ("fwd_bwd", "param"):
            panel.click("mode_entry", lambda i, k=mode: i.datum.get("key") == k)
            _check(panel, sorted(set(_text_marks(spec))), "#panel", f"grid {size}, {mode}")
    finally:
        panel.close()
