"""What a panel says before anyone touches it, at the sizes W&B gives it (640x400: a custom
chart in a workspace section, W&B's default; 1100x640: opened full width; 1600x900: full
screen), for GPT-2, a torchvision-shaped ResNet-18 and a MoE of 2 x 128 experts, in real Vega
inside Chromium, read back through the Vega view API (scenegraph items and signals):

* the top modules of the current mode are named: the ranked list shows at least five entries,
  in the order of the table's values, inside the panel, at >= 9 px;
* every node of the view it opens on lies inside the graph area (the fit shrinks as far as it
  must; labels too small to read give way to the list), and so in a drilled grid of experts;
* the hover card stays inside the panel, above the timeline strip, on the side away from the
  node it describes;
* the breadcrumbs never run under the Fit button or the hint, however deep the view;
* the hint's "click +" is there only where a "+" is drawn.
"""

from __future__ import annotations

from typing import Any

import browser
import pytest
import torch
from models import ResNet18
from panel import gpt2_profile, moe_profile

import wandb_modprof
from wandb_modprof.records.modes import mode as mode_of
from wandb_modprof.sinks import spec as _spec

SIZES = ((640, 400), (1100, 640), (1600, 900))
MIN_TEXT_PX = 9
MIN_NAMED = 5
_BOX_OF = (
    "(sel) => { const r = document.querySelector(sel).getBoundingClientRect();"
    " return [r.left, r.top, r.right, r.bottom]; }"
)


def _resnet18() -> Any:
    torch.manual_seed(0)
    model = ResNet18()
    x = torch.randn(2, 3, 64, 64)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(x).square().mean().backward()
    return prof


MODELS = {"gpt2": gpt2_profile, "resnet18": _resnet18, "moe": moe_profile}


@pytest.fixture(scope="module")
def tables() -> dict[str, Any]:
    return {name: make().table() for name, make in MODELS.items()}


def _inside(item: browser.Item, box: tuple[float, float, float, float], slack: float = 1) -> bool:
    left, top, right, bottom = box
    return (
        item.x >= left - slack
        and item.y >= top - slack
        and item.x + item.width <= right + slack
        and item.y + item.height <= bottom + slack
    )


def _overlap(a: browser.Item, b: browser.Item) -> bool:
    w = min(a.x + a.width, b.x + b.width) - max(a.x, b.x)
    h = min(a.y + a.height, b.y + b.height) - max(a.y, b.y)
    return w > 1 and h > 1


def _graph_box(panel: browser.Panel) -> tuple[float, float, float, float]:
    """The graph area on the page: its group's box (it clips what lies outside)."""
    area = panel.item("graph_bg")
    return area.x, area.y, area.x + area.width, area.y + area.height


def _rank(mode: Any, row: dict[str, Any]) -> float | None:
    """What the list orders by: the mode's value, or its `rank_by` columns' sum."""
    if not mode.rank_by:
        return float(mode.value(row))
    missing = str(row.get("missing", "")).split(",")
    if any(c in missing or c not in row for c in mode.rank_by):
        return None
    return sum(float(row[c]) for c in mode.rank_by)


def _named(panel: browser.Panel, table: Any, where: str) -> None:
    """At least `MIN_NAMED` ranked entries, readable and inside, in the table's order."""
    box = tuple(panel.page.evaluate(_BOX_OF, "#panel"))
    entries = sorted(
        (i for i in panel.items("top_label") if i.visible and i.text), key=lambda i: i.y
    )
    assert len(entries) >= MIN_NAMED, (where, [i.text for i in entries])
    for item in entries:
        assert float(item.props.get("fontSize", 0)) >= MIN_TEXT_PX, (where, item.text)
        assert _inside(item, box), (where, item.text, box, (item.x, item.y))  # type: ignore[arg-type]
    mode = mode_of(panel.signal("mode"))
    values = sorted(
        (
            (value, row["node_key"])
            for row in table.resolved()
            if row.get("row_kind") == "node"
            and row.get("node_kind") == "module"
            and mode.value(row) is not None
            and (value := _rank(mode, row)) is not None
        ),
        reverse=True,
    )
    listed = [i.datum["node_key"] for i in entries]
    expected = [key for _, key in values[: len(listed)]]
    # ties in the value may swap places; the values themselves must be the top ones
    by_key = {key: value for value, key in values}
    assert sorted(by_key[k] for k in listed) == sorted(by_key[k] for k in expected), where


def _whole(panel: browser.Panel, where: str) -> None:
    """Every node box of the view inside the graph area."""
    graph = _graph_box(panel)
    nodes = panel.items("node_rect")
    assert nodes, where
    outside = [i.datum.get("label") for i in nodes if not _inside(i, graph, slack=2)]
    assert not outside, (where, outside[:8], len(outside), len(nodes))


def _card_inside(panel: browser.Panel, where: str) -> None:
    """The hottest node hovered: its card inside the panel, its lines inside the card, the
    card on the other half of the graph area than the node, drawn above the strip."""
    left, top, right, bottom = panel.page.evaluate(_BOX_OF, "#panel")
    nodes = [i for i in panel.items("node_rect") if i.datum.get("node_kind") == "module"]
    hot = max(nodes, key=lambda i: float(i.datum.get("v") or 0))
    panel.hover("node_rect", lambda i: i.datum.get("node_key") == hot.datum["node_key"])
    card = panel.item("card_bg")
    assert _inside(card, (left, top, right, bottom)), (where, card)
    lines = [i for i in panel.items("card_text") if i.text]
    assert len(lines) >= 10, where
    assert all(_inside(line, (card.x, card.y, card.x + card.width, card.y + card.height))
               for line in lines), where  # fmt: skip
    assert all(float(i.props.get("fontSize", 0)) >= MIN_TEXT_PX for i in lines), where
    gx0, _, gx1, _ = _graph_box(panel)
    middle = (gx0 + gx1) / 2
    node_x, card_x = hot.x + hot.width / 2, card.x + card.width / 2
    assert (node_x > middle) != (card_x > middle), (where, node_x, card_x, middle)
    panel.move_away()


def _bar_apart(panel: browser.Panel, where: str) -> None:
    """Breadcrumbs clear of the Fit button and the hint; "+" drawn iff the hint says so."""
    fit = panel.item("fit_button")
    crumbs = panel.items("crumb")
    assert crumbs, where
    assert all(c.x + c.width <= fit.x for c in crumbs), (where, [c.datum for c in crumbs])
    hints = [i for i in panel.items("hint") if i.text]
    for hint in hints:
        assert not any(_overlap(hint, c) for c in crumbs), where
        assert not _overlap(hint, fit), where
    labels = [i for i in panel.items("crumb_label") if i.text]
    assert all(c.x + c.width <= fit.x for c in labels), where
    pluses = [i for i in panel.items("node_open") if i.text == "+"]
    if hints:
        assert ("click +" in hints[0].text) == bool(pluses), (where, hints[0].text, len(pluses))
    assert all(float(i.props.get("fontSize", 0)) >= MIN_TEXT_PX for i in pluses), where


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("model", list(MODELS))
def test_the_panel_opens_readable_and_whole(
    chromium: browser.Browser,
    tables: dict[str, Any],
    model: str,
    size: tuple[int, int],
) -> None:
    width, height = size
    panel = chromium.open_panel(
        _spec.filled({}), tables[model].records(), width=width, height=height
    )
    try:
        where = f"{model} {width}x{height}"
        for key in ("fwd_bwd", "act", "eff"):
            panel.click("mode_entry", lambda i, k=key: i.datum.get("key") == k)
            _named(panel, tables[model], f"{where} {key}")
        panel.click("mode_entry", lambda i: i.datum.get("key") == "fwd_bwd")
        _whole(panel, where)
        _card_inside(panel, where)
        _bar_apart(panel, where)
        assert panel.errors() == [], where
    finally:
        panel.close()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_drilled_view_is_whole_and_its_crumbs_clear(
    chromium: browser.Browser, tables: dict[str, Any], size: tuple[int, int]
) -> None:
    """The MoE's first layer (a grid of 128 experts) and one expert two levels further down:
    every box inside, the crumbs clear of the buttons."""
    width, height = size
    panel = chromium.open_panel(
        _spec.filled({}), tables["moe"].records(), width=width, height=height
    )
    try:
        if panel.signal("view_now") != "layers.0#0":
            panel.click("node_rect", lambda i: i.datum.get("label") == "layers.0")
        assert len(panel.items("node_rect")) > 128
        _whole(panel, f"grid {size}")
        _bar_apart(panel, f"grid {size}")
        _card_inside(panel, f"grid {size}")
    finally:
        panel.close()


def test_deep_breadcrumbs_give_way_from_the_left(chromium: browser.Browser) -> None:
    """Eight nested modules with long names at 640 px: the root stays, the views after it give
    way (an ellipsis marks them), the current view is shown last, and nothing runs under the
    Fit button."""

    class Nest(torch.nn.Module):
        def __init__(self, depth: int) -> None:
            super().__init__()
            self.inner_module_with_a_long_name = Nest(depth - 1) if depth else torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner_module_with_a_long_name(x)

    model = Nest(8)
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
    panel = chromium.open_panel(_spec.filled({}), prof.table().records(), width=640, height=400)
    try:
        for _ in range(8):
            opened = [i for i in panel.items("node_rect") if i.datum.get("has_view") and i.visible]
            if not opened:
                break
            panel.click("node_rect", lambda i, k=opened[0].datum["node_key"]: i.datum.get(
                "node_key") == k)  # fmt: skip
        labels = sorted((i for i in panel.items("crumb_label") if i.text), key=lambda i: i.x)
        texts = [i.text for i in labels]
        assert len(texts) >= 2 and any("…" in t for t in texts), texts
        assert labels[-1].datum.get("last"), texts
        _bar_apart(panel, "deep")
        assert panel.errors() == []
    finally:
        panel.close()


def test_the_card_is_drawn_above_everything() -> None:
    """The hover card's layer is the spec's last mark: drawn over the strip and the top bar."""
    spec = _spec.filled({})
    assert spec["marks"][-1]["name"] == "card_layer"
    assert [m.get("name") for m in spec["marks"][-1]["marks"]] == ["card_bg", "card_text"]
