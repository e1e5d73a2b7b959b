"""The panel writes numbers as `wandb_modprof.view.units.format_value` does: the spec
generator's formatter expressions, evaluated by the vendored Vega 5 in Chromium, give the same
text for the same values, unit by unit."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest

from wandb_modprof.records.modes import Unit
from wandb_modprof.view.units import format_value

ROOT = Path(__file__).resolve().parents[2]
TIB = 1024.0**4
COMMON = [
    0.0,
    1e-300,
    1.234e-12,
    1e-9,
    0.000123456,
    0.5,
    1.0,
    1.125,
    2.5,
    12.3456,
    99.95,
    999.96,
    1000.0,
    1234.5,
    99999.0,
    123456.0,
    1e9,
    1.23456e15,
    1e20,
    1.5e22,
    1.234e25,
    3.3e300,
]
# A self time can come out a hair below zero: the minus sign must agree too.
NEGATIVE = [-0.0005, -0.75, -1.5, -999.96, -1234.5, -2.5e6]
VALUES: dict[Unit, list[float]] = {
    Unit.MS: [*COMMON, *NEGATIVE, 0.0009996, 59999.0, 86400000.0],
    Unit.BYTES: [
        *COMMON,
        *NEGATIVE,
        -2.5,
        512.0,
        1023.0,
        1023.6,
        1024.0,
        1536.0,
        1048575.0,
        2.5 * TIB,
        1e6 * TIB,
    ],
    Unit.FLOPS: [*COMMON, *NEGATIVE, 999.4, 999999.0, 2.5e12, 7.77e17],
    Unit.FLOP_S: [*COMMON, *NEGATIVE, 3.2e13, 999.5e15],
    Unit.RATIO: [*COMMON, *NEGATIVE, 1.02, 1.8, 1.005],
    Unit.NORM: [*COMMON, *NEGATIVE, 1.23456789, 0.00001234, 1234567.0, 12345.0, 1e-7],
}


@pytest.fixture(scope="module")
def expressions() -> Any:
    return runpy.run_path(str(ROOT / "tools" / "spec" / "expressions.py"))


def _evaluate(chromium: Any, expr: str, rows: list[dict[str, Any]]) -> list[str]:
    spec = {
        "$schema": "https://vega.github.io/schema/vega/v5.json",
        "data": [
            {"name": "wandb"},
            {
                "name": "out",
                "source": "wandb",
                "transform": [{"type": "formula", "as": "text", "expr": expr}],
            },
        ],
    }
    panel = chromium.open_panel(spec, rows, width=100, height=100)
    try:
        assert panel.errors() == []
        got = sorted(panel.data("out"), key=lambda d: d["i"])
        assert [d["i"] for d in got] == list(range(len(rows)))
        return [str(d["text"]) for d in got]
    finally:
        panel.close()


def test_spec_formatters_match_units_py(chromium: Any, expressions: Any) -> None:
    rows = [
        {"i": 0, "unit": "", "v": 0.0}  # placeholder, replaced below
    ][:0]
    for unit, values in VALUES.items():
        rows += [{"unit": unit.value, "v": v} for v in values]
    rows = [dict(r, i=i) for i, r in enumerate(rows)]
    dispatched = _evaluate(chromium, expressions["fmt"]("datum.unit", "datum.v"), rows)
    mismatches = [
        (r["unit"], r["v"], got, format_value(r["unit"], r["v"]))
        for r, got in zip(rows, dispatched, strict=True)
        if got != format_value(r["unit"], r["v"])
    ]
    assert mismatches == [], "\n".join(map(str, mismatches))
    # the per-unit formatters (used where the unit is known when the spec is generated)
    for unit, formatter in expressions["FORMATTERS"].items():
        unit_rows = [r for r in rows if r["unit"] == unit.value]
        got = _evaluate(
            chromium, formatter("datum.v"), [dict(r, i=i) for i, r in enumerate(unit_rows)]
        )
        assert got == [format_value(unit, r["v"]) for r in unit_rows], unit
