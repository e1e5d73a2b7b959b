"""The "Load" mode in the panel (`view/load.py`): a routed top-1 MoE with a dead expert, at
1100x640 and 640x400. The experts are coloured by their share of the rows, the banner names
the expert no sample called, and the cards give the list's imbalance and the dead expert's
samples sat out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import disabled_run

import wandb_modprof
from wandb_modprof.sinks import spec as _spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "view"))
from test_load import DEAD, dead_expert_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from test_routed_moe import batch


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    model = dead_expert_model()
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    for step in range(12):
        model.zero_grad(set_to_none=True)
        model(batch(step)).pow(2).mean().backward()
    return handle.unwatch().table().records()


@pytest.mark.parametrize("size", [(1100, 640), (640, 400)])
def test_the_load_mode_colours_names_and_flags_the_experts(
    chromium: Any, rows: list[dict[str, Any]], size: tuple[int, int], tmp_path: Path
) -> None:
    panel = chromium.open_panel(_spec.filled({}), rows, width=size[0], height=size[1])
    try:
        banner = [i.text for i in panel.items("message") if i.text and "Load:" in i.text]
        assert banner == []  # (said in the Load mode only)
        panel.click("mode_entry", lambda i: i.datum.get("key") == "load")
        banner = [i.text for i in panel.items("message") if i.text and "Load:" in i.text]
        assert banner and "never called in" in banner[0] and f"experts.{DEAD}" in banner[0]
        panel.hover("node_rect", lambda i: i.datum.get("node_key") == f"experts.{DEAD}#0")
        lines = [i.text for i in panel.items("card_text") if i.text]
        assert any(t.startswith("Never called in ") for t in lines), lines
        panel.move_away()
        panel.hover("node_rect", lambda i: i.datum.get("node_key") == "experts.0#0")
        lines = [i.text for i in panel.items("card_text") if i.text]
        assert any(t.startswith("List imbalance: ") for t in lines), lines
        assert not any(t.startswith("Never called") for t in lines), lines
        panel.move_away()
        # the router is no list member: grey, not coloured by load
        fills = {
            i.datum.get("node_key"): i.fill
            for i in panel.items("node_rect")
            if i.datum.get("node_key") in ("router#0", "experts.0#0")
        }
        assert fills["router#0"] != fills["experts.0#0"]
        assert panel.errors() == []
        panel.screenshot(tmp_path / f"load_{size[0]}x{size[1]}.png")
    finally:
        panel.close()
