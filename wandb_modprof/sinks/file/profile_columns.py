"""The columns of a version-8 profile file: one field of many records as one JSON value
(`profile_tables` lays the records out in them; `profile_file.py` describes the format).

- n >= 2 values all the same (bit for bit, for floats): `{"repeat": value, "times": n}`, the
  value as an array would hold it (`"repeat": 0` for a column of 0.0, `"repeat": null`),
  except in a table's first column and a list outside a table (the memory curve's), which say
  how many values there are;
- strings, integers, booleans: a JSON array, null where the field allows None;
- floats: a JSON array of integers where every value is a whole number (|x| < 2**53, not
  -0.0: sizes, counts, zeros) or null; else, where a value is null, a JSON array as version 7
  writes floats (numbers, "nan", "inf", "-inf", null); else base64 (RFC 4648, padded) of the
  values as little-endian IEEE 754 doubles.

Why: a profile repeats values (a call index of 0, a thread id, sizes of 0, None for what was
not measured), and a measured time or a mean is a noisy double of ~20 characters in decimal
(~0.45 us to print, ~0.2 us to parse), which base64 keeps in 10.7 characters, exactly (NaN,
infinities and -0.0 included), and numpy packs or unpacks a column of them at once. Each
column has one form (the rules above, in order), which loading demands, so a loaded file saved
again gives the same bytes.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from wandb_modprof.sinks.file.profile_schema import (
    INT_LIMIT,
    FileError,
    describe,
    exact_fields,
    scalar,
)

Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
At = Callable[[int], str]  # the JSON path of a column's i-th value

EXACT = 2**53  # every integer below this in magnitude is a double exactly
REPEAT = ("repeat", "times")


# ---- writing -------------------------------------------------------------------------------
def repeats(values: Sequence[Any]) -> bool:
    """`values` (not floats) are written as one: two or more, all equal (a string equal to
    another, None to None, a list to a list of the same values)."""
    return len(values) >= 2 and values.count(values[0]) == len(values)


def column(values: Sequence[Any], repeat: bool = True) -> Sequence[Any] | dict[str, Any]:
    """The column of integers, booleans or strings (or lists of strings) `values` (a tuple is
    written as an array too; `repeat` False: never as one repeated value)."""
    if repeat and repeats(values):
        return {"repeat": values[0], "times": len(values)}
    return values


def whole(values: Floats) -> Flags:
    """Which values a column writes as JSON integers (see the module docstring)."""
    with np.errstate(invalid="ignore"):
        flags: Flags = (
            np.isfinite(values)
            & (np.trunc(values) == values)
            & (np.abs(values) < EXACT)
            & ~((values == 0) & np.signbit(values))
        )
    return flags


def bits(values: Floats) -> npt.NDArray[np.int64]:
    """The doubles' bits (equal values compare equal, 0.0 not -0.0, NaN its own bits)."""
    return np.ascontiguousarray(values).view(np.int64)


def float_column(values: Floats, nulls: Flags | None = None, repeat: bool = True) -> Any:
    """The column of `values` (`nulls`: which are None; their value is ignored)."""
    null = nulls if nulls is not None and nulls.any() else None
    if (
        repeat
        and len(values) >= 2
        and (
            bool(null.all()) if null is not None else bool((bits(values) == bits(values[:1])).all())
        )
    ):
        return {"repeat": None if null is not None else _float(values[:1]), "times": len(values)}
    flags = whole(values) if null is None else whole(values) | null
    if flags.all():
        known = values if null is None else np.where(null, 0.0, values)
        out: list[Any] = known.astype(np.int64).tolist()
        for i in [] if null is None else np.flatnonzero(null).tolist():
            out[i] = None
        return out
    if null is not None:
        return [
            None if none else v if math.isfinite(v) else repr(v)
            for v, none in zip(values.tolist(), null.tolist(), strict=True)
        ]
    return base64.b64encode(values.astype("<f8", copy=False).tobytes()).decode("ascii")


def _float(one: Floats) -> Any:
    """A float as a column's array holds it (an integer if whole)."""
    value = float(one[0])
    if whole(one)[0]:
        return int(value)
    return value if math.isfinite(value) else repr(value)


def floats_column(values: Sequence[float | None], repeat: bool = True) -> Any:
    """The column of a float field's values, as records hold them."""
    # numpy reads None as NaN: only a NaN can be a None (4x faster than `None in values`)
    doubles = np.array(values, np.float64)
    nans = np.flatnonzero(np.isnan(doubles)).tolist()
    if not nans:
        return float_column(doubles, repeat=repeat)
    nulls = np.zeros(len(doubles), bool)
    nulls[nans] = [values[i] is None for i in nans]
    return float_column(doubles, nulls, repeat)


# ---- reading -------------------------------------------------------------------------------
def array(value: Any, n: int | None, where: str) -> list[Any]:
    """`value` as a JSON array of `n` values (any number if None)."""
    if not isinstance(value, list):
        raise FileError(where, f"expected an array, got {describe(value)}")
    _count(len(value), n, where)
    return value


def _count(got: int, n: int | None, where: str) -> None:
    if n is not None and got != n:
        raise FileError(where, f"expected {n} values (one per record), got {got}")


def _repeat(value: dict[str, Any], n: int | None, where: str) -> tuple[Any, int]:
    """(value, times) of a repeated value (the column at `where` is an object). Only where the
    number of values is known already (`n`): the first column of a table says how many records
    it has, with one value each (so a file holds no more values than its size allows)."""
    if n is None:
        expected = "an array (a table's first column, or a list outside a table)"
        raise FileError(where, f"expected {expected}, got an object")
    exact_fields(value, REPEAT, where)
    times = value["times"]
    if type(times) is not int or times < 2:
        raise FileError(f"{where}.times", f"expected an integer >= 2, got {describe(times)}")
    _count(times, n, where)
    return value["repeat"], times


def cells(value: Any, n: int | None, where: str) -> tuple[list[Any], bool]:
    """The values of a column of integers, booleans or strings (or lists of them), and
    whether they were one value repeated (else an array, whose values must not all be
    equal: checked here)."""
    if isinstance(value, dict):
        one, times = _repeat(value, n, where)
        return [one] * times, True
    col = array(value, n, where)
    if n is not None and repeats(col):
        _not_repeated(col, where)
    return col, False


def _not_repeated(col: list[Any], where: str, n: int | None = None) -> None:
    shown, n = describe(col[0]), len(col) if n is None else n
    raise FileError(
        where, f'expected {{"repeat": {shown}, "times": {n}}} (its values are all {shown})'
    )


def ints(value: Any, n: int | None, nullable: bool, at: At, where: str) -> list[Any]:
    """A column of integers (`at(i)`: the path of the i-th, as a record's field)."""
    col, repeated = cells(value, n, where)
    known = col[:1] if repeated else col
    if nullable:
        known = [v for v in known if v is not None]
    if all(type(v) is int for v in known) and (
        not known or (min(known) > -INT_LIMIT and max(known) < INT_LIMIT)
    ):
        return col
    _first_problem(col, repeated, int, nullable, at, where)
    raise AssertionError("a column that failed the fast check passed the slow one")


def strings(value: Any, n: int | None, nullable: bool, at: At, where: str) -> list[Any]:
    return _of_type(str, value, n, nullable, at, where)


def bools(value: Any, n: int | None, nullable: bool, at: At, where: str) -> list[Any]:
    return _of_type(bool, value, n, nullable, at, where)


def _of_type(
    kind: type, value: Any, n: int | None, nullable: bool, at: At, where: str
) -> list[Any]:
    """A column whose cells are all exactly of `kind` (or None where `nullable`)."""
    col, repeated = cells(value, n, where)
    if all(type(v) is kind or (nullable and v is None) for v in (col[:1] if repeated else col)):
        return col
    _first_problem(col, repeated, kind, nullable, at, where)
    raise AssertionError("a column that failed the fast check passed the slow one")


def _first_problem(
    col: list[Any], repeated: bool, tp: type, nullable: bool, at: At, where: str
) -> None:
    """Raise the version-7 message of the first value that is not of type `tp`."""
    or_null = " or null" if nullable else ""
    for i, v in enumerate(col[:1] if repeated else col):
        if not (nullable and v is None):
            scalar(v, tp, f"{where}.repeat" if repeated else at(i), or_null)


def floats(
    value: Any, n: int | None, nullable: bool, at: At, where: str
) -> tuple[Floats, Flags | None]:
    """A column of `n` floats (any number if None): the values (NaN where null) and which are
    null (None: none is)."""
    if isinstance(value, dict):
        one, times = _repeat(value, n, where)
        if one is None and nullable:
            return np.full(times, math.nan), np.ones(times, bool)
        return np.full(times, scalar(one, float, f"{where}.repeat", "")), None
    if isinstance(value, str):
        values = unpack(value, n, where)
        if whole(values).all():  # (none: [])
            raise FileError(where, "expected an array of integers (whole numbers), got base64")
        if n is not None and n >= 2 and (bits(values) == bits(values[:1])).all():
            _not_repeated([float(values[0])], where, n)
        return values, None
    col = array(value, n, where)
    if all(type(v) is int for v in col):
        if col and not (min(col) > -EXACT and max(col) < EXACT):
            i, v = next((i, v) for i, v in enumerate(col) if not -EXACT < v < EXACT)
            raise FileError(at(i), f"expected an integer with |x| < 2**53, got {describe(v)}")
        if n is not None and repeats(col):
            _not_repeated(col, where)
        return np.array(col, np.float64), None
    nulls = [v is None for v in col]
    if not nullable and any(nulls):
        scalar(None, float, at(nulls.index(True)), "")
    if not any(nulls):  # a number that is not an integer: the column should be base64
        i, v = next((i, v) for i, v in enumerate(col) if type(v) is not int)
        scalar(v, float, at(i), "")  # (a wrong type or a NaN literal: as version 7 says it)
        got = f"got {describe(v)}"
        raise FileError(at(i), f"expected an integer (else the column is base64), {got}")
    if n is not None and all(nulls) and n >= 2:
        _not_repeated(col, where)
    read = [
        math.nan if null else scalar(v, float, at(i), " or null")
        for i, (v, null) in enumerate(zip(col, nulls, strict=True))
    ]
    return np.array(read, np.float64), np.array(nulls)


def float_values(value: Any, n: int | None, nullable: bool, at: At, where: str) -> list[Any]:
    """A column of floats as Python values, None where null."""
    values, nulls = floats(value, n, nullable, at, where)
    out: list[Any] = values.tolist()
    if nulls is not None:
        for i in np.flatnonzero(nulls).tolist():
            out[i] = None
    return out


def unpack(text: str, n: int | None, where: str) -> Floats:
    """`n` doubles (any number if None) from base64, refusing any other spelling of them."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise FileError(where, "not valid base64") from None
    if len(raw) % 8 or (n is not None and len(raw) != 8 * n):
        expected = "a multiple of 8" if n is None else f"{8 * n} ({n} numbers)"
        raise FileError(where, f"expected {expected} bytes of base64, got {len(raw)}")
    if base64.b64encode(raw).decode("ascii") != text:
        raise FileError(where, "not in canonical base64 (its unused bits must be 0)")
    return np.frombuffer(raw, "<f8").astype(np.float64)
