"""The one unit formatter (`view/units.py`); `test_spec_units.py` checks the panel writes the
same text for the same values."""

from __future__ import annotations

import math

import pytest

from wandb_modprof.view.units import MINUS, NOT_MEASURED, format_value


@pytest.mark.parametrize(
    ("unit", "value", "text"),
    [
        ("ms", 999.96, "1000 ms"),  # the prefix is chosen on the unrounded value
        ("ms", 1000.0, "1 s"),
        ("ms", 0.0123, "12.3 µs"),
        ("bytes", 2.5 * 1024**4, "2.5 TiB"),
        ("bytes", 1023.0, "1,023 B"),
        ("flops", 3e9, "3 GFLOP"),
        ("flop_s", 1.25e12, "1.25 TFLOP/s"),
        ("ratio", 1.8, "1.8×"),  # noqa: RUF001 (the multiplication sign is meant)
        ("norm", 12345.0, "1.235e+4"),
        ("ms", -1.5, f"{MINUS}1.5 ms"),
        ("bytes", -2.5, f"{MINUS}3 B"),  # d3 rounds |value| (halves away from zero)
    ],
)
def test_values_are_written_with_their_units(unit: str, value: float, text: str) -> None:
    assert format_value(unit, value) == text


@pytest.mark.parametrize("value", [None, math.nan, math.inf, -math.inf])
def test_what_was_not_measured_is_a_dash(value: float | None) -> None:
    for unit in ("ms", "bytes", "flops", "flop_s", "ratio", "norm"):
        assert format_value(unit, value) == NOT_MEASURED
