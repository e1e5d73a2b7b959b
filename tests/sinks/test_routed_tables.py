"""Every table a watched routed mixture of experts logs to W&B (an offline run, the files on
disk) gives every expert that ran by then its FLOPs: no table of the schedule shows an expert
without them, whichever experts the router picked on the steps before it. (At `log_freq=4`
the first step is the structure pass; at `log_freq=1` the first sample comes before it, and
its table, logged at once, has no FLOPs for any model.)"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import wandb

import wandb_modprof
from wandb_modprof.sinks.wandb.packed import unpacked

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "capture"))
from test_routed_moe import Top1, batch


def test_every_logged_table_counts_every_expert_that_ran(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Top1()
    run = wandb.init(mode="offline", project="modprof-test", dir=str(tmp_path), entity="me")
    with warnings.catch_warnings():  # (the offline notice: once per process)
        warnings.filterwarnings("ignore", message=".*is offline")
        handle = wandb_modprof.watch(model, log_freq=4, run=run)
    for step in range(80):
        model.zero_grad(set_to_none=True)
        model(batch(step)).pow(2).mean().backward()
    handle.unwatch()
    run.finish()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    files = sorted((run_dir / "files" / "media" / "table" / "modprof").glob("Top1_table_*"))
    assert len(files) >= 3  # the schedule's: the first sample's, later ones, the last
    for path in files:
        data = json.loads(path.read_text())
        columns, rows = unpacked(data["columns"], data["data"])
        at = {c: i for i, c in enumerate(columns)}
        experts = [
            r
            for r in rows
            if r[at["row_kind"]] == "node"
            and r[at["node_kind"]] == "module"
            and str(r[at["node_ref"]]).startswith("experts.")
            and r[at["samples"]] > 0  # it ran on some sample before this table
        ]
        assert experts, path.name
        for r in experts:
            missing = str(r[at["missing"]]).split(",")
            assert "fwd_flops" not in missing, (path.name, r[at["node_ref"]], missing)
            assert r[at["fwd_flops"]] > 0, (path.name, r[at["node_ref"]])
