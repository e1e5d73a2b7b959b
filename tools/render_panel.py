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
`--only NAME` renders one model's pictures. Needs `make vendor` and Debian's chromium (as the
browser tests do).
"""

from __future__ import annotations

import argparse
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
    table = prof.table()
    rows = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
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
    parser.add_argument("--only", choices=("gpt2", "resnet", "moe"), default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    from browser import launch

    with launch() as browser:
        for name, make, opens in (
            ("gpt2", gpt2_profile, ["transformer"]),
            ("resnet", resnet_profile, ["layer2", "0"]),
            ("moe", moe_profile, ["layers.0"]),
        ):
            if args.only not in (None, name):
                continue
            prof = make()
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
