"""Vega transforms that make the lists' rows: `sequence` (n rows from nothing, numbered by `i`)
and `numbered` (rows numbered `n` in their order, for the marks that place one per line)."""

from __future__ import annotations

from typing import Any


def sequence(n: int) -> dict[str, Any]:
    return {"type": "sequence", "start": 0, "stop": n, "as": "i"}


def numbered() -> dict[str, Any]:
    return {"type": "window", "ops": ["row_number"], "as": ["n"]}
