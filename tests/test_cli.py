"""The README's main job, run the way a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import wandb_modprof


def test_demo_trains_and_prints_top_modules(tmp_path):
    pytest.importorskip("transformers")
    saved = tmp_path / "sub" / "demo.modprof.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wandb_modprof",
            "demo",
            "--steps",
            "3",
            "--log-freq",
            "1",
            "--top",
            "3",
            "--save",
            str(saved),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "2 sampled step(s)" in out
    assert "Top modules by backward time" in out
    assert out.count("(sampled)") == 2
    assert out.count("(structure pass)") == 1
    assert f"Profile written to {saved}" in out
    prof = wandb_modprof.load(saved)
    assert prof.num_samples == 2
    assert len(prof.structures()) == 1
    assert any(r["node_kind"] == "self" for r in prof.table().records())
    trace = saved.with_name("demo.trace.json")
    assert f"Trace of the last sampled step written to {trace}" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(ev.get("name") == "transformer.h.0.backward" for ev in events)
    # an offline W&B run next to the profile (WANDB_MODE=offline here), one table per sample
    (run_dir,) = (saved.parent / "wandb").glob("offline-run-*")
    assert f"W&B offline run (modprof/GPT2LMHeadModel) written to {run_dir}" in out
    assert f"wandb sync {run_dir}" in out
    tables = list((run_dir / "files/media/table/modprof").glob("GPT2LMHeadModel_table_*.json"))
    assert len(tables) == 2


def test_cli_rejects_bad_arguments():
    proc = subprocess.run(
        [sys.executable, "-m", "wandb_modprof", "demo", "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "expected an integer >= 1, got 0" in proc.stderr
