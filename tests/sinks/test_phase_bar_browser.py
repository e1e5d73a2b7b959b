"""The phase bar (`tools/spec/phases.py`) in real Vega 5 inside real Chromium, fed the way W&B
feeds it (tests/browser.py): planted phases drawn as segments as wide as their share of the
step, each labelled with its name and milliseconds (inside, or after a swatch), an unmeasured
phase named with its reason and not drawn; readable at the sizes W&B gives a panel; nothing of
it (and the same layout as without the bar's rows) for a table without phases; the W&B copy of
the table and the HTML report show it too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import browser
import pytest
import torch
from models import ResNet, resnet_input

import wandb_modprof
from wandb_modprof.records.phases import PHASE_LABELS
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.wandb.wandb_log import wandb_table
from wandb_modprof.view.units import format_value

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SIZES = ((640, 400), (1100, 640))
BAND_TEXTS = ("phase_head", "phase_label", "phase_tight_label", "phase_note")
# planted: between 10 ms, forward 40, loss 2, backward 38; the optimizer not measured
PLANTED = {"between": 10.0, "forward": 40.0, "loss": 2.0, "backward": 38.0}
WHY = "no optimizer step ran between the backward and the next forward"


@pytest.fixture(scope="module")
def prof() -> wandb_modprof.Profile:
    torch.manual_seed(0)
    model = ResNet()
    x = resnet_input(2, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with wandb_modprof.profile(model, optimizer=optimizer) as prof:
        for _ in range(4):
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return prof


@pytest.fixture(scope="module")
def rows(prof: wandb_modprof.Profile) -> list[dict[str, Any]]:
    return prof.table().records()


@pytest.fixture
def panels(chromium: browser.Browser) -> Iterator[list[browser.Panel]]:
    opened: list[browser.Panel] = []
    yield opened
    for panel in opened:
        panel.close()


def _without_phases(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not str(r["meta_key"]).startswith("phase_")]


def _planted(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    kept = _without_phases(rows)
    template = next(r for r in kept if r["row_kind"] == "meta")
    phases = [
        {**template, "meta_key": f"phase_{p}", "meta_value": "", "meta_number": ms, "missing": ""}
        for p, ms in PLANTED.items()
    ]
    phases.append(
        {
            **template,
            "meta_key": "phase_optimizer",
            "meta_value": WHY,
            "meta_number": 0.0,
            "missing": "meta_number",
        }
    )
    return kept + phases


def _open(
    chromium: browser.Browser,
    panels: list[browser.Panel],
    rows: Sequence[dict[str, Any]],
    size: tuple[int, int] = (1100, 640),
) -> browser.Panel:
    panel = chromium.open_panel(_spec.filled({}), rows, width=size[0], height=size[1])
    panels.append(panel)
    return panel


def _texts(panel: browser.Panel) -> list[browser.Item]:
    return [
        i
        for mark in BAND_TEXTS
        for i in panel.items(mark)
        if i.visible and isinstance(i.text, str) and i.text.strip()
    ]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_planted_phases_are_segments_as_wide_as_their_share_and_named_with_their_ms(
    chromium: browser.Browser,
    panels: list[browser.Panel],
    rows: list[dict[str, Any]],
    size: tuple[int, int],
) -> None:
    panel = _open(chromium, panels, _planted(rows), size)
    segments = sorted(panel.items("phase_seg"), key=lambda i: i.x)
    assert [s.datum["label"] for s in segments] == [PHASE_LABELS[p] for p in PLANTED]
    widths = [s.width for s in segments]
    step = sum(PLANTED.values())
    for width, ms in zip(widths, PLANTED.values(), strict=True):
        # (each segment's bounds hold its 1 px white stroke: +-1 px)
        assert width == pytest.approx(ms / step * sum(widths), abs=2.5)
    assert len({s.fill for s in segments}) == len(segments)  # a colour each
    # one bar: each segment starts where the one before it ends
    for a, b in itertools.pairwise(segments):
        assert b.x == pytest.approx(a.x + a.width - 1, abs=1.5)
    said = [str(i.text) for i in _texts(panel)]
    for phase, ms in PLANTED.items():
        assert f"{PHASE_LABELS[phase]} {format_value('ms', ms)}" in said, (phase, said)
    assert f"Step {format_value('ms', step)} (median of each phase)" in said
    # the optimizer: not drawn, named with its reason (wrapped at a word where narrow)
    notes = " ".join(str(i.text) for i in sorted(panel.items("phase_note"), key=lambda i: i.y))
    assert notes == f"optimizer not measured: {WHY}"
    # each label that did not fit its segment follows a swatch of the segment's colour
    tight = panel.items("phase_tight_label")
    swatches = {s.datum["label"]: s.fill for s in panel.items("phase_swatch")}
    assert sorted(swatches) == sorted(t.datum["label"] for t in tight)
    assert "loss" in swatches  # 2 of 90 ms: never wide enough for its label
    assert swatches == {s.datum["label"]: s.fill for s in segments if s.datum["label"] in swatches}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_bar_is_readable_and_inside_its_band_at_wandb_sizes(
    chromium: browser.Browser,
    panels: list[browser.Panel],
    rows: list[dict[str, Any]],
    size: tuple[int, int],
) -> None:
    """A real profile's phases: no text under 9 px, none over another or out of the band,
    the band between the graph and the strip."""
    panel = _open(chromium, panels, rows, size)
    band = panel.item("phases")
    texts = _texts(panel)
    assert len(texts) >= 3
    assert min(float(t.props.get("fontSize", 0)) for t in texts) >= 9
    for t in texts:
        assert band.x - 1 <= t.x and t.x + t.width <= band.x + band.width + 1, t.text
        assert band.y - 1 <= t.y and t.y + t.height <= band.y + band.height + 1, t.text
    for i, a in enumerate(texts):
        for b in texts[i + 1 :]:
            w = min(a.x + a.width, b.x + b.width) - max(a.x, b.x)
            h = min(a.y + a.height, b.y + b.height) - max(a.y, b.y)
            assert w <= 1 or h <= 1, (a.text, b.text)
    graph = panel.item("graph_bg")
    strip = panel.item("strip")
    assert graph.y + graph.height <= band.y <= band.y + band.height <= strip.y
    assert panel.errors() == []


def test_without_phase_rows_nothing_is_drawn_and_the_layout_is_as_before(
    chromium: browser.Browser, panels: list[browser.Panel], rows: list[dict[str, Any]]
) -> None:
    panel = _open(chromium, panels, _without_phases(rows), (640, 400))
    assert panel.signal("phase_h") == 0
    for mark in ("phase_seg", "phase_swatch", *BAND_TEXTS):
        assert panel.items(mark) == [], mark
    # the graph and the strip share the height as they did before the bar existed
    gh, strip_h, banner_h, height = (
        panel.signal(s) for s in ("gh", "strip_h", "banner_h", "height")
    )
    assert gh == max(60, height - 30 - banner_h - (strip_h + 6 if strip_h else 0))
    assert panel.signal("strip_y") == 30 + gh + 6
    with_bar = _open(chromium, panels, rows, (640, 400))
    # with the bar: its room comes from the strip's, down to the strip's least, then the graph's
    band, gh2, strip_h2 = (with_bar.signal(s) for s in ("phase_h", "gh", "strip_h"))
    assert band > 0 and gh2 + strip_h2 == gh + strip_h - band - 6
    assert strip_h2 == max(64, strip_h - band - 6)
    assert panel.errors() == []


def test_an_old_profile_file_without_phases_still_draws(
    chromium: browser.Browser, panels: list[browser.Panel]
) -> None:
    rows = wandb_modprof.load(FIXTURES / "tiny_gpt.v7.modprof.json").table().records()
    assert not [r for r in rows if str(r["meta_key"]).startswith("phase_")]
    panel = _open(chromium, panels, rows)
    assert panel.items("node_rect")
    assert panel.signal("phase_h") == 0 and panel.items("phase_seg") == []
    assert panel.errors() == []


def test_the_wandb_copy_of_the_table_draws_the_same_bar(
    chromium: browser.Browser, panels: list[browser.Panel], prof: wandb_modprof.Profile
) -> None:
    table = prof.table()
    cells = wandb_table(table)
    logged = [dict(zip(cells.columns, row, strict=True)) for row in cells.data]
    full, copy = (_open(chromium, panels, r) for r in (table.records(), logged))

    def bar(panel: browser.Panel) -> list[tuple[Any, ...]]:
        segments = [(round(s.x), round(s.width), s.fill) for s in panel.items("phase_seg")]
        return [*segments, *sorted((t.mark, str(t.text)) for t in _texts(panel))]

    assert bar(full) and bar(full) == bar(copy)


def test_the_html_report_shows_the_bar(
    chromium: browser.Browser, prof: wandb_modprof.Profile, tmp_path: Path
) -> None:
    phases = prof.step_phases()
    path = prof.to_html(tmp_path / "report.html")
    report = chromium.open_report(path, width=1100, height=800)
    try:
        segments = report.items("phase_seg")
        assert phases  # (measured phases drawn; an unmeasured one has no segment)
        assert {s.datum["label"] for s in segments} == {PHASE_LABELS[p] for p in phases}
        head = [str(i.text) for i in report.items("phase_head")]
        assert len(head) == 1 and head[0].startswith("Step ")
        assert report.errors() == []
    finally:
        report.close()
