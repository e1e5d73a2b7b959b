"""Numbers with their units, written one way everywhere: the terminal summary, the CLI, the
HTML report's header and (mirrored as Vega expressions by the spec generator, tested against
this module) the panel.

>>> format_value("ms", 999.96), format_value("bytes", 2.5 * 1024**4)
('1000 ms', '2.5 TiB')

Rules: 3 significant digits without exponent or trailing zeros (d3-format's `.3~r`, rounding
half up as JavaScript does: 1.125 -> 1.13, 123456 -> 123000); the prefix is chosen on the
unrounded value (999.96 ms stays in ms); binary prefixes for bytes (whole bytes below 1 KiB),
decimal for FLOPs; norms with 4 significant digits (d3-format's `.4~g`: 1.235e+6, 0.00001234);
"-" where a value was not measured (None, or not finite: the table treats those as missing).
Negative numbers (a self time a hair below zero) get U+2212, the minus sign d3-format writes.
"""

from __future__ import annotations

import math
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal

NOT_MEASURED = "-"
MINUS = "\u2212"  # d3-format's minus sign: the panel writes negative numbers with it


def format_value(unit: str, value: float | None) -> str:
    """`value` with its unit, as the panel writes it (3 significant digits, binary prefixes
    for bytes); "-" where not measured."""
    if value is None or not math.isfinite(value):
        return NOT_MEASURED
    if unit == "ms":
        return _time(value)
    if unit in ("bytes", "bytes_per_ms"):
        return _bytes(value) + ("/ms" if unit == "bytes_per_ms" else "")
    if unit in ("flops", "flop_s"):
        return _decimal(value, "FLOP" if unit == "flops" else "FLOP/s")
    if unit in ("ratio", "percent"):
        # (the multiplication sign is meant)
        return f"{_sig(value)}{'×' if unit == 'ratio' else '%'}"  # noqa: RUF001
    return _general(value, 4)


def _time(ms: float) -> str:
    if abs(ms) >= 1000:
        return f"{_sig(ms / 1000)} s"
    return f"{_sig(ms)} ms" if abs(ms) >= 1 else f"{_sig(ms * 1000)} µs"


def _bytes(value: float) -> str:
    for power, prefix in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if abs(value) >= 1024**power:
            return f"{_sig(value / 1024**power)} {prefix}"
    # d3's `,d`: Math.round of the absolute value (halves away from zero), sign put back,
    # thousands separated
    whole = int((Decimal(abs(value)) + Decimal("0.5")).to_integral_value(rounding=ROUND_FLOOR))
    return f"{_sign(value) if whole else ''}{whole:,} B"


def _decimal(value: float, unit: str) -> str:
    for size, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{_sig(value / size)} {prefix}{unit}"
    return f"{_sig(value)} {unit}"


def _sig(value: float) -> str:
    """3 significant digits, no exponent, no trailing zeros (d3-format's '.3~r')."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits, exp = _digits(value, 3)
    return _sign(value) + _fixed(digits, exp)


def _general(value: float, precision: int) -> str:
    """d3-format's '.{precision}~g': JavaScript's toPrecision, trailing zeros trimmed."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits, exp = _digits(value, precision)
    if exp < -6 or exp >= precision:
        mantissa = (digits[0] + "." + digits[1:]).rstrip("0").rstrip(".")
        return f"{_sign(value)}{mantissa}e{'+' if exp >= 0 else '-'}{abs(exp)}"
    return _sign(value) + _fixed(digits, exp)


def _digits(value: float, precision: int) -> tuple[str, int]:
    """The `precision` significant digits of |value| and its decimal exponent, rounded half up
    on the exact binary value (JavaScript's toExponential, which d3-format uses)."""
    exact = Decimal(abs(value))
    exp = exact.adjusted()
    step = Decimal(1).scaleb(1 - precision)
    mantissa = exact.scaleb(-exp).quantize(step, rounding=ROUND_HALF_UP)
    if mantissa >= 10:  # 9.995 -> 10.0: one more digit before the point
        exp += 1
        mantissa = (mantissa / 10).quantize(step, rounding=ROUND_HALF_UP)
    return str(mantissa).replace(".", ""), exp


def _fixed(digits: str, exp: int) -> str:
    """`digits` x 10^(exp - len + 1) without exponent, trailing zeros trimmed."""
    if exp < 0:
        text = "0." + "0" * (-exp - 1) + digits
    elif len(digits) > exp + 1:
        text = digits[: exp + 1] + "." + digits[exp + 1 :]
    else:
        text = digits + "0" * (exp + 1 - len(digits))
    return text.rstrip("0").rstrip(".") if "." in text else text


def _sign(value: float) -> str:
    return MINUS if value < 0 else ""
