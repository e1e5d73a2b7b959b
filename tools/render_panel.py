"""Pictures of the W&B panel for the README: the shipped Vega spec with real profiles' rows,
rendered by Vega itself (vl-convert runs Vega in Deno; no browser, no network).

    .venv/bin/python tools/render_panel.py --out docs/images

writes `panel_gpt2_<mode>.png` (GPT-2 from a random-weight config, opened at
`transformer#0`, the view with the blocks) and `panel_resnet_<mode>.png` (`tests/models.py`'s
ResNet, opened at the residual block `layer2.0#0`) for three analysis modes. Each model trains
a few steps with AdamW under `wandb_modprof.profile`, so optimizer state is measured too. The
panel's start state is set the way a click would set it (the spec's `view_pick` signal); the
clicks themselves are tested in Chromium (tests/test_panel_browser.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch
import vl_convert

import wandb_modprof
from wandb_modprof import _spec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
MODES = (("fwd_bwd", "linear"), ("bwd", "log"), ("act", "linear"))
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


def render(prof: Any, mode: str, scale: str, view: str) -> bytes:
    table = prof.table()
    spec = _spec.with_rows(_spec.filled({"mode": mode, "scale": scale}), table.columns, table.rows)
    spec["width"], spec["height"] = WIDTH, HEIGHT
    for signal in spec["signals"]:
        if signal["name"] == "view_pick":
            signal["value"] = view
    png: bytes = vl_convert.vega_to_png(spec, scale=1.5)
    return png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/images", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for name, make, view in (
        ("gpt2", gpt2_profile, "transformer#0"),
        ("resnet", resnet_profile, "layer2.0#0"),
    ):
        prof = make()
        for mode, scale in MODES:
            path = args.out / f"panel_{name}_{mode}.png"
            path.write_bytes(render(prof, mode, scale, view))
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
