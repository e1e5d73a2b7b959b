"""What the benchmarks print about the checkout they measured (shared by the scripts here)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def revision() -> str:
    """`git describe` of the checkout being measured (`-dirty`: uncommitted changes)."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"
