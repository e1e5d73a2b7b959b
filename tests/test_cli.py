"""The README's main job, run the way a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_demo_trains_and_prints_top_modules():
    pytest.importorskip("transformers")
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
