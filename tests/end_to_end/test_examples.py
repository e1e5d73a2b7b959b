"""The examples in examples/, run as a user runs them: a script in its own process, offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import wandb_modprof
from wandb_modprof.sinks.wandb.table_schedule import TableSchedule

ROOT = Path(__file__).resolve().parents[2]


def test_the_cars_example_learns_and_leaves_a_profile_a_report_and_an_offline_run(
    tmp_path: Path,
) -> None:
    pytest.importorskip("vega_datasets")
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("WANDB_ENTITY", None)
    proc = subprocess.run(
        [
            *(sys.executable, str(ROOT / "examples" / "train_cars.py"), "--out", "cars"),
            *("--epochs", "12", "--log-freq", "25"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = re.search(r"mean absolute error ([\d.]+) .* training mean: ([\d.]+)\)", proc.stdout)
    assert found, proc.stdout
    error, baseline = map(float, found.groups())
    assert error < 0.6 * baseline, (error, baseline)  # it learned something from the data
    assert "Top modules by backward time" in proc.stdout

    out = tmp_path / "cars"
    prof = wandb_modprof.load(out / "cars.modprof.json")
    assert prof.num_samples == 120 // 25  # 10 optimizer steps an epoch: steps 25, 50, ..., 100
    assert {"origin#0", "body#0", "body.0#0", "head#0"} <= set(prof.stats())
    assert (out / "cars.html").read_text("utf-8").startswith("<!doctype html>")
    tables = list(out.glob("wandb/offline-run-*/files/media/table/modprof/*.table.json"))
    # the scheduled tables (the run is shorter than the default interval): the 1st, 2nd, 4th,
    # ... sample's, and the last one at unwatch() where it came after them
    schedule = TableSchedule(None)
    expected = [n for n in range(1, prof.num_samples + 1) if schedule.take(n, now=0.0)]
    expected += [prof.num_samples] if schedule.behind(prof.num_samples) else []
    assert len(tables) == len(expected), tables
