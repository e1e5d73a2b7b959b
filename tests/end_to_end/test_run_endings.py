"""Nothing is lost at a run's end: a training loop ended by an exception, a Ctrl-C or a SIGTERM,
then `run.finish()`, still logs the last table (of every sample taken) and the profile
artifact into its run (`run_ending.py`, in a process of its own, read back from the offline
run's files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from wandb_history import artifacts, history

SCRIPT = Path(__file__).with_name("run_ending.py")
KEY = "modprof/Sequential"


@pytest.mark.parametrize(
    "ending, where",
    [
        ("exception", "in-process"),
        ("ctrl-c", "in-process"),
        ("sigterm", "in-process"),
        ("exception", "worker"),
    ],
)
def test_the_last_table_and_the_artifact_survive_the_ending(
    ending: str, where: str, tmp_path: Path
) -> None:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), ending, str(tmp_path), where],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    expected = {"exception": "RuntimeError: the data loader failed", "ctrl-c": "KeyboardInterrupt"}
    assert done.returncode != 0, done.stdout
    if ending in expected:
        assert expected[ending] in done.stderr, done.stderr[-2000:]
    samples = json.loads(done.stdout.strip().splitlines()[-1])["samples"]
    assert samples >= 25
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    rows = history(run_dir)
    with_table = [i for i, r in enumerate(rows) if any(k.startswith(f"{KEY}_table") for k in r)]
    last_sample = min(i for i, r in enumerate(rows) if r.get(f"{KEY}/samples") == samples)
    assert with_table and with_table[-1] >= last_sample, (with_table, last_sample)
    profiles = [a for a in artifacts(run_dir) if a["type"] == "modprof-profile"]
    assert profiles and profiles[-1]["metadata"]["samples"] == samples
