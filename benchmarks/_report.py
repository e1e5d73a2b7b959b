"""What every benchmark script here prints: the checkout measured, and the report itself."""

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


def emit(report: str, out: str | None) -> None:
    """Print the markdown report and, with `--out PATH`, also write it there."""
    print(report)
    if out:
        Path(out).write_text(report, encoding="utf-8")
