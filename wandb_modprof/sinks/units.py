"""Numbers with their units, written one way everywhere: the terminal summary, the CLI, the
HTML report's header and (mirrored as Vega expressions by the spec generator, tested against
this module) the panel.

>>> format_value("ms", 999.96), format_value("bytes", 2.5 * 1024**4)
('1000 ms', '2.5 TiB')

Rules: 3 significant digits without exponent or trailing zeros (d3-format's `.3~r`); the
prefix is chosen on the unrounded value (999.96 ms stays in ms); binary prefixes for bytes,
decimal for FLOPs; "-" where a value was not measured.
"""

from __future__ import annotations

import math

NOT_MEASURED = "-"


def format_value(unit: str, value: float | None) -> str:
    """`value` with its unit, as the panel writes it (3 significant digits, binary prefixes
    for bytes); "-" where not measured."""
    if value is None:
        return NOT_MEASURED
    if unit == "ms":
        return _time(value)
    if unit == "bytes":
        return _bytes(value)
    if unit in ("flops", "flop_s"):
        return _decimal(value, "FLOP" if unit == "flops" else "FLOP/s")
    if unit == "ratio":
        return f"{_sig(value)}×"  # noqa: RUF001 (the multiplication sign is meant)
    return f"{value:.4g}"


def _time(ms: float) -> str:
    if abs(ms) >= 1000:
        return f"{_sig(ms / 1000)} s"
    return f"{_sig(ms)} ms" if abs(ms) >= 1 else f"{_sig(ms * 1000)} µs"


def _bytes(value: float) -> str:
    for power, prefix in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if abs(value) >= 1024**power:
            return f"{_sig(value / 1024**power)} {prefix}"
    return f"{value:,.0f} B"


def _decimal(value: float, unit: str) -> str:
    for size, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{_sig(value / size)} {prefix}{unit}"
    return f"{_sig(value)} {unit}"


def _sig(value: float) -> str:
    """3 significant digits, no exponent, no trailing zeros (d3-format's '.3~r')."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    text = f"{round(value, digits):.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
