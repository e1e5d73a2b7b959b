"""The spec's scales: Turbo for values, a diverging map for ratios to a baseline run."""

from __future__ import annotations

from typing import Any

from tools.spec.theme import DIVERGE


def scales() -> list[dict[str, Any]]:
    return [
        {"name": "turbo", "type": "linear", "domain": [0, 1], "range": {"scheme": "turbo"}},
        {"name": "diverge", "type": "linear", "domain": [-1, 0, 1], "range": DIVERGE},
    ]
