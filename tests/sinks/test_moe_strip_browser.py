"""An MoE model in the panel (real Vega 5 in real Chromium, tests/browser.py): the timeline of a
layer of 128 experts folds them into one lane that can be read, each expert's spans still drawn
and named on hover; the ranked list names each entry apart (the full name on hover) under a
heading per column."""

from __future__ import annotations

from typing import Any

import browser
import pytest
from panel import moe_profile, ranked_names

from wandb_modprof.sinks import spec as _spec

MIN_TEXT_PX = 9
SIZES = ((1100, 640), (640, 400))
FOLDED = "experts \u00d7128"  # the lane of a layer's 128 experts


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return moe_profile().table().resolved()


def _open(chromium: browser.Browser, rows: list[dict[str, Any]], size: tuple[int, int]) -> Any:
    width, height = size
    return chromium.open_panel(_spec.filled({}), rows, width=width, height=height)


def _overlap(a: browser.Item, b: browser.Item) -> bool:
    w = min(a.x + a.width, b.x + b.width) - max(a.x, b.x)
    h = min(a.y + a.height, b.y + b.height) - max(a.y, b.y)
    return w > 1 and h > 1


def _lane_labels(panel: browser.Panel) -> list[browser.Item]:
    return [i for i in panel.items("lane_label") if i.visible and str(i.text or "").strip()]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_layer_of_128_experts_gets_one_readable_lane_for_them(
    chromium: browser.Browser, rows: list[dict[str, Any]], size: tuple[int, int]
) -> None:
    panel = _open(chromium, rows, size)
    try:
        if panel.signal("view_now") != "layers.0#0":
            panel.click("node_rect", lambda i: i.datum.get("label") == "layers.0")
        assert panel.signal("view_now") == "layers.0#0"
        spans = panel.items("span_rect")
        expected = [r for r in rows if r["row_kind"] == "span" and r["view_key"] == "layers.0#0"]
        experts = {r["node_key"] for r in expected if ".experts." in r["node_key"]}
        assert len(experts) == 128
        assert len(spans) == len(expected)  # every call's spans still drawn
        # ... the experts' all in one lane, named with their count
        # (centres: a hovered node's spans are outlined, their bounds a little taller)
        rows_y = {round(s.cy) for s in spans if s.datum["node_key"] in experts}
        assert len(rows_y) == 1
        labels = _lane_labels(panel)
        assert sorted(str(i.text) for i in labels) == [FOLDED, "router"]
        assert all(float(i.props["fontSize"]) >= MIN_TEXT_PX for i in labels)
        assert not [(a.text, b.text) for k, a in enumerate(labels) for b in labels[k + 1 :]
                    if _overlap(a, b)]  # fmt: skip
        # each label beside its lane
        (folded,) = [i for i in labels if i.text == FOLDED]
        assert abs(folded.cy - next(iter(rows_y))) <= 1.5
        # hovering an expert's span names a call whose span is under the pointer, and one of
        # the widest names itself (most are a pixel or two wide and neighbours overlap, so a
        # span's centre may be its neighbour's, drawn over it)
        drawn = [s for s in spans if s.datum["node_key"] in experts]
        key = ""
        for span in sorted(drawn, key=lambda s: -s.width)[:12]:
            panel.hover_at(span.cx, span.cy)
            got = panel.signal("card_key")
            under = {o.datum["node_key"] for o in drawn if o.x - 1 <= span.cx <= o.x + o.width + 1}
            assert got in under, (got, sorted(under))
            if got == span.datum["node_key"]:
                key = got
                break
        assert key, "no expert span of the widest 12 named itself when hovered"
        card = [str(i.text) for i in panel.items("card_text")]
        assert card and card[0].startswith(key.removesuffix("#0") + " (")
        panel.move_away()
        # the model's view: two layers, lanes that fit, not folded
        panel.click("crumb", lambda i: i.datum["key"] == "<root>#0")
        assert sorted(str(i.text) for i in _lane_labels(panel)) == ["layers.0", "layers.1"]
        assert panel.errors() == [] and panel.warnings() == []
    finally:
        panel.close()


def test_the_ranked_list_names_each_entry_apart_under_headed_columns(
    chromium: browser.Browser, rows: list[dict[str, Any]]
) -> None:
    panel = _open(chromium, rows, (1100, 640))
    try:
        top = sorted(panel.data("top"), key=lambda d: d["rank"])
        assert len(top) >= 8
        shown = [d["short_who"] for d in top]
        assert shown == ranked_names([(d["who"], d["node_key"]) for d in top])
        assert len(set(shown)) == len(shown)
        labels = sorted(panel.items("top_label"), key=lambda i: i.y)
        assert [i.text for i in labels] == [f"{d['rank']}. {d['short_who']}" for d in top]
        # the full name: the entry's tooltip on hover, the card once clicked
        entry = top[2]
        panel.hover("top_entry", lambda i: i.datum["rank"] == entry["rank"])
        title = panel.page.evaluate("() => document.querySelector('#panel').getAttribute('title')")
        assert title == entry["who"]
        panel.click("top_entry", lambda i: i.datum["rank"] == entry["rank"])
        card = [str(i.text) for i in panel.items("card_text")]
        assert card and card[0].startswith(entry["who"] + " (")
        # every column headed: name, value (by the mode, or what it ranks by), share or value
        for mode, value_head, third in (("fwd_bwd", "FWD + BWD", "SHARE"),
                                        ("eff", "TIME LOST (FWD)", "EFF.")):  # fmt: skip
            panel.click("mode_entry", lambda i, k=mode: i.datum.get("key") == k)
            heads = {
                m: [i for i in panel.items(m) if i.visible and i.text]
                for m in ("top_heading", "top_value_heading", "top_share_heading")
            }
            assert [i.text for i in heads["top_heading"]] == ["TOP MODULES"], mode
            assert [i.text for i in heads["top_value_heading"]] == [value_head], mode
            assert [i.text for i in heads["top_share_heading"]] == [third], mode
            (name_h,), (value_h,), (third_h,) = heads.values()
            values = panel.items("top_value")
            shares = [i for i in panel.items("top_share") if i.text]
            # over their columns: the value heading ends where the values do, the third over
            # the shares; on one line, none over another
            assert value_h.x + value_h.width == pytest.approx(
                max(i.x + i.width for i in values), abs=2
            )
            assert shares and min(i.x for i in shares) < third_h.x + third_h.width
            assert not _overlap(name_h, value_h) and not _overlap(value_h, third_h)
            assert name_h.x + name_h.width < value_h.x and value_h.x + value_h.width < third_h.x
        assert panel.errors() == [] and panel.warnings() == []
    finally:
        panel.close()
