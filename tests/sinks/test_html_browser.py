"""The HTML report (`wandb_modprof.sinks.report.html`) in real Chromium, opened from file://
with every network request aborted: it draws, every interaction works, and hostile names stay text.

Chromium and the harness are tests/browser.py's (`Browser.open_report`); the report carries
its own Vega (6, bundled by vl-convert), so the vendored Vega 5 is not used here.
"""

from __future__ import annotations

from pathlib import Path

import browser
import pytest
import torch
from helpers import profiled
from models import ResNet, resnet_input
from torch import nn

import wandb_modprof
from wandb_modprof.records import modes as _modes
from wandb_modprof.sinks.report.html import write_report

ROOT = "<root>#0"
XSS = "</script><img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def resnet_prof() -> wandb_modprof.Profile:
    torch.manual_seed(0)
    return profiled(ResNet(), resnet_input())


@pytest.fixture(scope="module")
def resnet_report(
    resnet_prof: wandb_modprof.Profile, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return resnet_prof.to_html(tmp_path_factory.mktemp("report") / "resnet.html")


def _open(chromium: browser.Browser, path: Path, **kw: int) -> browser.Report:
    report = chromium.open_report(path, **kw)
    assert report.requests == [path.resolve().as_uri()], report.requests  # nothing else
    return report


def fills(report: browser.Panel) -> dict[str, str]:
    return {i.datum["node_key"]: i.fill for i in report.items("node_rect")}


def test_report_draws_from_file_with_the_network_cut(
    chromium: browser.Browser, resnet_report: Path, resnet_prof: wandb_modprof.Profile
) -> None:
    report = _open(chromium, resnet_report)
    try:
        assert report.errors() == []
        assert report.warnings() == []
        assert report.signal("mode") == _modes.DEFAULT_MODE
        assert report.signal("view_now") == ROOT
        table = resnet_prof.table().resolved()
        want = sorted(
            r["node_key"] for r in table if r["row_kind"] == "node" and r["view_key"] == ROOT
        )
        assert sorted(fills(report)) == want
        assert all(i.visible for i in report.items("node_rect"))
        # the page around the chart
        assert report.page.title() == "ResNet profile"
        header = report.page.locator("header").inner_text()
        assert "wandb_modprof" in header and "How to read it" in header
        assert report.page.evaluate("document.querySelectorAll('script[src], link').length") == 0
        assert report.dialogs == []
    finally:
        report.close()


@pytest.mark.parametrize("mode", ["act", "bwd"])
def test_clicking_a_mode_recolours_and_drill_down_works(
    chromium: browser.Browser, resnet_report: Path, mode: str
) -> None:
    report = _open(chromium, resnet_report)
    try:
        before = fills(report)
        report.click("mode_entry", lambda i: i.datum["key"] == mode)
        assert report.signal("mode") == mode
        assert fills(report) != before

        report.click("node_rect", lambda i: i.datum["node_key"] == "layer2#0")
        assert report.signal("view_now") == "layer2#0"
        assert "layer2.0#0" in fills(report)
        report.hover("node_rect", lambda i: i.datum["node_key"] == "layer2.0#0")
        assert report.signal("hover_key") == "layer2.0#0"
        assert report.items("card_text")
        report.click("crumb", lambda i: i.datum["key"] == ROOT)
        assert report.signal("view_now") == ROOT
        assert report.errors() == []
    finally:
        report.close()


def test_the_chart_follows_the_window_size(chromium: browser.Browser, resnet_report: Path) -> None:
    report = _open(chromium, resnet_report, width=1400, height=900)
    try:
        wide = report.signal("width")
        report.page.set_viewport_size({"width": 900, "height": 700})
        report.page.wait_for_function(f"() => __modprof_view.signal('width') < {wide}")
        report.settle()
        assert report.signal("width") < wide
        svg = report.page.locator("#panel > svg").bounding_box()
        assert svg is not None and svg["width"] <= 900
        assert report.errors() == []
    finally:
        report.close()


class _Hostile(nn.Linear):
    pass


_Hostile.__name__ = _Hostile.__qualname__ = XSS


def test_hostile_names_render_as_text_and_run_nothing(
    chromium: browser.Browser, tmp_path: Path
) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    model.add_module(XSS, _Hostile(8, 8))
    path = write_report(
        tmp_path / "xss.html", [(XSS, profiled(model, torch.randn(4, 8)))], title=XSS
    )
    report = _open(chromium, path)
    try:
        assert report.errors() == []
        assert report.dialogs == []
        dom = report.page.evaluate(
            "() => [document.querySelectorAll('img').length, document.querySelector('h1')"
            ".textContent, document.title, !!window.__modprof_view]"
        )
        assert dom == [0, XSS, XSS, True]
        node = report.item("node_rect", lambda i: i.datum["module_name"] == XSS)
        assert node.datum["module_type"] == XSS
        # the label as Vega drew it (the spec may shorten long names: a prefix of it)
        labels = [str(i.text) for i in report.items("node_label")]
        assert any(XSS.startswith(t.rstrip("…")) and len(t) > 8 for t in labels), labels
        report.hover("node_rect", lambda i: i.datum["module_name"] == XSS)
        card = " ".join(str(i.text) for i in report.items("card_text"))
        assert "</script>" in card, card
        assert report.page.evaluate("document.querySelectorAll('img').length") == 0
        assert report.dialogs == []
    finally:
        report.close()


def test_compare_report_opens_in_compare_mode(
    chromium: browser.Browser, resnet_prof: wandb_modprof.Profile, tmp_path: Path
) -> None:
    torch.manual_seed(1)
    other = profiled(ResNet(), resnet_input(batch=16))
    path = write_report(
        tmp_path / "compare.html", [("batch 8", resnet_prof), ("batch 16", other)], compare=True
    )
    report = _open(chromium, path)
    try:
        assert report.errors() == []
        assert report.signal("compare") is True
        assert report.signal("cmp") is True
        assert (report.signal("run_now"), report.signal("baseline")) == ("1", "0")
        names = sorted(str(i.text) for i in report.items("run_label"))
        assert names == ["batch 16", "batch 8"]
        compared = fills(report)
        report.click("compare_entry")
        assert report.signal("compare") is False
        assert fills(report) != compared
        assert report.errors() == []
    finally:
        report.close()
