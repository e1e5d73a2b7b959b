"""One definition per displayed number: the per-step figures read the same in `summary()`,
the CLI's summary of the saved file, the report's header, and the table's meta rows (what the
panel's totals and the W&B table show); each names its statistic, the last sample its step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from models import TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof.api import cli as _cli
from wandb_modprof.view.units import format_value


def test_the_per_step_figures_agree_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    model, x = TinyGPT(), gpt_input()
    model(x).float().pow(2).mean().backward()  # start-up, untimed
    with wandb_modprof.profile(model) as prof:
        for _ in range(4):  # timed, structure pass, timed, timed: 3 samples
            model(x).float().pow(2).mean().backward()
    meta = {r["meta_key"]: r for r in prof.table().records() if r["row_kind"] == "meta"}
    fwd = format_value("ms", float(meta["total_fwd_ms"]["meta_number"]))
    bwd = format_value("ms", float(meta["total_bwd_ms"]["meta_number"]))
    act = format_value("bytes", float(meta["total_act_bytes"]["meta_number"]))
    assert meta["statistic"]["meta_value"] == "median"
    per_step = f"per step (median of 3 samples): forward {fwd}, backward {bwd}, activations {act}"

    summary = prof.summary()
    assert per_step in summary.splitlines()
    last = prof.last_sample
    assert last is not None
    assert f"last sample (step {last.step}): forward " in summary

    saved = prof.save(tmp_path / "p.modprof.json")
    assert _cli.main(["summary", str(saved)]) == 0
    assert per_step in capsys.readouterr().out.splitlines()

    page = prof.to_html(tmp_path / "r.html").read_text(encoding="utf-8")
    heads = re.findall(r"<th>([^<]*)</th>", page)
    assert "forward / step (median)" in heads and "backward / step (median)" in heads
    cells = re.findall(r"<td>([^<]*)</td>", page)
    assert fwd in cells and bwd in cells and act in cells
    # the timeline strip ("Timeline of step N") shows the last sample, named by its step
    assert meta["timeline"]["meta_number"] == last.step
