"""Screenshots of the W&B panel for the README: the shipped Vega spec with real profiles'
rows, in headless Chromium with Vega 5 (what W&B runs) and W&B's patches, driven by clicks.

    .venv/bin/python tools/render_panel.py --out docs/images

writes `panel_gpt2_<mode>.png` (GPT-2 from a random-weight config; clicks `transformer` to
open the view with the blocks) and `panel_resnet_<mode>.png` (`tests/models.py`'s ResNet;
clicks `layer2`, then its residual block `0`) for three analysis modes, each picked by
clicking its legend entry, with the hover card of the most expensive node shown. Each model
trains a few steps with AdamW under `wandb_modprof.profile`, so optimizer state is measured
too. Also `report_gpt2.png`: the self-contained HTML report (`prof.to_html`) of the same
GPT-2 profile, opened from file:// with the network blocked, drilled into `transformer`, and
`panel_moe_grid.png`: `tests/models.py`'s MoEStack (two layers of 128 expert MLPs), the first
layer's view, its experts drawn as a grid hottest first (`view/blocks.py`), log colour scale.

`hero_panel.png`, the README's and the docs home page's opening picture, is made to be read at
the size it is shown (full width of a ~700 px text column): the same GPT-2 profile in a panel
of only 620 x 590 CSS px, the graph zoomed to 1 (node labels 12 px, `HERO_ZOOM`) and panned
so that blocks h.0 to ln_f stand left of the hover card, captured at 2 device pixels per
CSS pixel (sharp on HiDPI screens; the markup gives its width, not the file's).

`panel_size_<model>_<w>x<h>.png` (`gpt2`, `resnet18`: `tests/models.py`'s torchvision-shaped
ResNet-18, `moe`) show what a panel says before anyone touches it at the sizes W&B gives it:
640x400 (a custom chart in a workspace section, W&B's default), 1100x640 (opened full width)
and 1600x900 (full screen), in the default mode, as it opens.

`panel_resnet18_ckpt.png`: the ResNet-18 at 1100x640 in the "Checkpoint value" mode, with the
card of the first module of the plan at 50 % (docs/checkpointing.md).

`--only NAME` renders one model's pictures (`hero`: the hero picture only; `sizes`: the size
pictures only; `checkpoint`: the checkpoint picture only). Needs `make vendor` and Debian's
chromium (as the browser tests do).
"""

from __future__ import annotations

import argparse
import base64
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

import wandb_modprof
from wandb_modprof.sinks import spec as _spec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
MODES = (
    ("fwd_bwd", "linear"),
    ("bwd", "log"),
    ("act", "linear"),
    ("peak", "linear"),
    ("eff", "linear"),
    ("eff_bwd", "linear"),
)
WIDTH, HEIGHT = 1100, 640
# The hero picture: shown at ~690 px (the docs' text column) to ~830 px (a README on GitHub), so
# a 620 px wide panel shows its smallest (10 px) text at 11-13 px. Zoom 1 draws node labels at
# 12 px, type lines at 10; the h.* column's top-left corner goes to (HERO_LEFT, HERO_TOP).
HERO_WIDTH, HERO_HEIGHT = 620, 590
HERO_ZOOM = 1.0
HERO_LEFT, HERO_TOP = 254, 44
HERO_PIXEL_RATIO = 2


def _train(model: torch.nn.Module, batch: Any, loss_fn: Any, steps: int = 4) -> Any:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with wandb_modprof.profile(model, optimizer=optimizer) as prof:
        for _ in range(steps):
            loss_fn(model, batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return prof


def gpt2_profile() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from models import gpt2_from_config

    torch.manual_seed(0)
    model = gpt2_from_config(vocab=2048, ctx=128, dim=256, layers=4)
    tokens = torch.randint(0, 2048, (4, 128))
    return _train(model, tokens, lambda m, t: m(input_ids=t, labels=t).loss)


def resnet_profile() -> Any:
    from models import ResNet

    torch.manual_seed(0)
    model = ResNet()
    return _train(model, torch.randn(8, 3, 32, 32), lambda m, x: m(x).square().mean())


def moe_profile() -> Any:
    from models import MoEStack, moe_input

    torch.manual_seed(0)
    model = MoEStack()
    return _train(model, moe_input(model), lambda m, x: m(x).square().mean(), steps=3)


def screenshot(
    browser: Any, prof: Any, mode: str, scale: str, path: Path, opens: list[str]
) -> None:
    rows = prof.table().records()
    panel = browser.open_panel(_spec.filled({}), rows, width=WIDTH, height=HEIGHT)
    for label in opens:  # drill down the way a user does
        panel.click("node_rect", lambda item, label=label: item.datum.get("label") == label)
    panel.click("mode_entry", lambda item: item.datum.get("key") == mode)
    panel.click("scale_entry", lambda item: item.datum.get("key") == scale)
    nodes = [i for i in panel.items("node_rect") if i.datum.get("node_kind") == "module"]
    hottest = max(nodes, key=lambda i: float(i.datum.get("v") or 0))
    panel.hover("node_rect", lambda item: item.datum.get("node_key") == hottest.datum["node_key"])
    if panel.errors():
        raise SystemExit(f"the panel reported errors: {panel.errors()}")
    panel.screenshot(path)
    panel.close()


SIZES = ((640, 400), (1100, 640), (1600, 900))


def resnet18_profile() -> Any:
    from models import ResNet18

    torch.manual_seed(0)
    model = ResNet18()
    return _train(model, torch.randn(8, 3, 64, 64), lambda m, x: m(x).square().mean())


def size_screenshots(browser: Any, out: Path) -> None:
    """The panel as it opens, untouched, at each of `SIZES`, for three models."""
    for name, make in (
        ("gpt2", gpt2_profile),
        ("resnet18", resnet18_profile),
        ("moe", moe_profile),
    ):
        rows = make().table().records()
        for width, height in SIZES:
            panel = browser.open_panel(_spec.filled({}), rows, width=width, height=height)
            if panel.errors():
                raise SystemExit(f"the panel reported errors: {panel.errors()}")
            path = out / f"panel_size_{name}_{width}x{height}.png"
            panel.screenshot(path)
            panel.close()
            print(f"wrote {path}")


def checkpoint_screenshot(browser: Any, path: Path) -> None:
    """The ResNet-18 panel in the "Checkpoint value" mode, the first planned module hovered."""
    rows = resnet18_profile().table().records()
    panel = browser.open_panel(_spec.filled({}), rows, width=WIDTH, height=HEIGHT)
    panel.click("mode_entry", lambda item: item.datum.get("key") == "ckpt")
    planned = [i for i in panel.items("node_rect") if i.datum.get("ckpt_state") == 1]
    if not planned:
        raise SystemExit("the 50 % plan checkpoints no module of the ResNet-18's top view")
    key = planned[0].datum["node_key"]
    panel.hover("node_rect", lambda item: item.datum.get("node_key") == key)
    if panel.errors():
        raise SystemExit(f"the panel reported errors: {panel.errors()}")
    panel.screenshot(path)
    panel.close()
    print(f"wrote {path}")


def hero_screenshot(browser: Any, prof: Any, path: Path) -> None:
    """The GPT-2 panel at `HERO_WIDTH` x `HERO_HEIGHT`, opened at `transformer`, fwd + bwd, the
    graph zoomed to `HERO_ZOOM` and panned so that blocks h.0 ... ln_f stand left of the hover
    card of the hottest block; captured at `HERO_PIXEL_RATIO` device pixels per CSS pixel."""
    rows = prof.table().records()
    panel = browser.open_panel(_spec.filled({}), rows, width=HERO_WIDTH, height=HERO_HEIGHT)
    panel.click("node_rect", lambda item: item.datum.get("label") == "transformer")
    panel.click("mode_entry", lambda item: item.datum.get("key") == "fwd_bwd")
    panel.click("scale_entry", lambda item: item.datum.get("key") == "linear")

    def block(label: str) -> Any:
        return panel.item("node_rect", lambda item: item.datum.get("label") == label)

    # one wheel turn from the fitted zoom to HERO_ZOOM (the spec zooms by 1.0018 ** -deltaY)
    anchor = block("h.1")
    panel.wheel(anchor.cx, anchor.cy, -math.log(HERO_ZOOM / panel.signal("k")) / math.log(1.0018))
    # then a drag on the background, as a user pans
    box = panel.page.locator("#panel").bounding_box()
    column, top = block("h.1"), block("h.0")
    start = (column.x + column.width + 24, column.cy)
    if panel.pick(*start).mark != "graph_bg":
        raise SystemExit(f"the pan would not start on the background: {panel.pick(*start)}")
    dx, dy = box["x"] + HERO_LEFT - column.x, box["y"] + HERO_TOP - top.y
    panel.drag(start, (start[0] + dx, start[1] + dy))
    nodes = [i for i in panel.items("node_rect") if i.datum.get("node_kind") == "module"]
    hottest = max(nodes, key=lambda i: float(i.datum.get("v") or 0))
    panel.hover("node_rect", lambda item: item.datum.get("node_key") == hottest.datum["node_key"])
    # device pixels: the page keeps its CSS layout (and the hover), only its resolution changes
    cdp = panel.page.context.new_cdp_session(panel.page)
    viewport = panel.page.viewport_size or {}
    cdp.send(
        "Emulation.setDeviceMetricsOverride",
        {**viewport, "deviceScaleFactor": HERO_PIXEL_RATIO, "mobile": False},
    )
    panel.settle()
    if panel.errors():
        raise SystemExit(f"the panel reported errors: {panel.errors()}")
    if panel.signal("card_key") != hottest.datum["node_key"]:
        raise SystemExit(f"the hover card shows {panel.signal('card_key')!r}, not the hottest")
    shot = cdp.send("Page.captureScreenshot", {"format": "png", "clip": {**box, "scale": 1}})
    path.write_bytes(base64.b64decode(shot["data"]))
    panel.close()


def report_screenshot(browser: Any, prof: Any, path: Path) -> None:
    html = path.with_suffix(".html")
    prof.to_html(html, mode="bwd", title="GPT-2 (4 layers, from a config)")
    report = browser.open_report(html, width=WIDTH + 40, height=HEIGHT + 160)
    report.click("node_rect", lambda item: item.datum.get("label") == "transformer")
    if report.errors():
        raise SystemExit(f"the report reported errors: {report.errors()}")
    report.page.screenshot(path=str(path))  # the whole page: header, totals and the chart
    report.close()
    html.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/images", type=Path)
    only = ("gpt2", "resnet", "moe", "hero", "sizes", "checkpoint")
    parser.add_argument("--only", choices=only, default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    from browser import launch

    with launch() as browser:
        if args.only in (None, "sizes"):
            size_screenshots(browser, args.out)
        if args.only in (None, "checkpoint"):
            checkpoint_screenshot(browser, args.out / "panel_resnet18_ckpt.png")
        for name, make, opens in (
            ("gpt2", gpt2_profile, ["transformer"]),
            ("resnet", resnet_profile, ["layer2", "0"]),
            ("moe", moe_profile, ["layers.0"]),
        ):
            if args.only in ("sizes", "checkpoint") or (
                args.only not in (None, name) and not (args.only == "hero" and name == "gpt2")
            ):
                continue
            prof = make()
            if name == "gpt2":
                hero_screenshot(browser, prof, args.out / "hero_panel.png")
                print(f"wrote {args.out / 'hero_panel.png'}")
                if args.only == "hero":
                    continue
            if name == "moe":
                path = args.out / "panel_moe_grid.png"
                screenshot(browser, prof, "fwd_bwd", "log", path, opens)
                print(f"wrote {path}")
                continue
            for mode, scale in MODES:
                path = args.out / f"panel_{name}_{mode}.png"
                screenshot(browser, prof, mode, scale, path, opens)
                print(f"wrote {path}")
            if name == "gpt2":
                report_screenshot(browser, prof, args.out / "report_gpt2.png")
                print(f"wrote {args.out / 'report_gpt2.png'}")


if __name__ == "__main__":
    main()
