"""Version 8 of the profile file: records as tables of columns. Takes a `FileData`; gives the
JSON builtins of the file's body (or the way back, a `FileData` checked by the rules of
`profile_schema`, or a `FileError` saying where the file is wrong). `profile_file.py`
describes the format and does the file I/O.

- A tuple of records (the last sample's `invocations` and `runs`, the `structures`, each
  structure's `calls` and `edges`) is a *table*: an object with one column per field of the
  record (`profile_columns`), each one value per record, in order; the field names once.
- `stats` is a table of `ModuleStats` whose `metrics` holds the running statistics of every
  key, per metric (`profile_statistics`).
- Any other record (the sample, its totals and memory curve, a roofline) is an object with
  its fields, as in version 7; the memory curve's times are a float column.

A value in a table has the JSON path of the record's field, `last_sample.invocations[3].fwd_ms`
(`stats["fc#0"].depth` for a key's statistics), as in version 7, so errors read the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from operator import attrgetter
from typing import Any, get_args, get_origin

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.frozen import frozen
from wandb_modprof.records.sample import ModuleStats
from wandb_modprof.sinks.file.profile_columns import (
    array,
    bools,
    cells,
    column,
    float_values,
    floats_column,
    ints,
    strings,
)
from wandb_modprof.sinks.file.profile_encode import encoder, hints, is_record, optional
from wandb_modprof.sinks.file.profile_schema import (
    FileData,
    FileError,
    absent_later_fields,
    check_least,
    check_record,
    decode,
    decode_record,
    describe,
    exact_fields,
)
from wandb_modprof.sinks.file.profile_statistics import decode_statistics, encode_statistics

At = Callable[[int], str]


def encode_file(data: FileData) -> dict[str, Any]:
    """The body of a version-8 file: the fields of `data`."""
    return _record(data, FileData)


def decode_file(doc: dict[str, Any]) -> FileData:
    """A version-8 file's body (the header taken out), checked."""
    data: FileData = decode_record(doc, FileData, "", _value)
    return data


def _stats_type(tp: Any) -> bool:
    return get_origin(tp) in (dict, Mapping) and get_args(tp)[1] is ModuleStats


def _string_tuples(tp: Any) -> bool:
    return get_origin(tp) is tuple and get_args(tp)[0] is str


# ---- writing -------------------------------------------------------------------------------
def _encode(value: Any, tp: Any) -> Any:
    inner, _ = optional(tp)
    if value is None:
        return None
    if is_record(inner):
        return _record(value, inner)
    if get_origin(inner) is tuple:
        item = get_args(inner)[0]
        if is_record(item):
            return _table(value, item)
        if item in (float, int):  # (the memory curve's: a column that says its length)
            return _column(value, item, repeat=False)
    if _stats_type(inner):
        return _stats(value)
    return encoder(tp)(value)  # a scalar: as version 7


def _record(value: Any, cls: type) -> dict[str, Any]:
    types = hints(cls)
    return {f.name: _encode(getattr(value, f.name), types[f.name]) for f in fields(cls)}


def _table(records: Sequence[Any], cls: type, skip: str = "") -> dict[str, Any]:
    names = [f.name for f in fields(cls) if f.name != skip]
    # Each record's fields in one C call, then transposed: no Python frame per value (a getattr
    # per value was a third of the writing).
    rows = list(map(attrgetter(*names), records))
    if len(names) == 1:  # (attrgetter of one name gives the value, not a tuple)
        rows = [(value,) for value in rows]
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    types = hints(cls)
    return {  # (the first column says how many records: never one value repeated)
        name: _column(values, types[name], repeat=i > 0)
        for i, (name, values) in enumerate(zip(names, columns, strict=True))
    }


def _column(values: Sequence[Any], tp: Any, repeat: bool = True) -> Any:
    inner, _ = optional(tp)
    if inner in (str, int, bool):
        return column(values, repeat)
    if inner is float:
        return floats_column(values, repeat)
    if _string_tuples(inner):
        lists = {cell: list(cell) for cell in dict.fromkeys(values)}  # (equal cells: one list)
        return column(list(map(lists.__getitem__, values)))
    if get_origin(inner) is tuple and is_record(get_args(inner)[0]):
        return [_table(v, get_args(inner)[0]) for v in values]
    if is_record(inner):
        return [_encode(v, tp) for v in values]
    raise AssertionError(f"no column for {tp}")


def _stats(stats: Mapping[str, ModuleStats]) -> dict[str, Any]:
    modules = list(stats.values())
    for key, module in stats.items():  # (the file holds each key once, as the record's)
        if key != module.key:
            got = f"a statistics record of {json.dumps(module.key)}"
            raise ModProfError(f"cannot save stats[{json.dumps(key)}]: {got}")
    table = _table(modules, ModuleStats, skip="metrics")
    table["metrics"] = encode_statistics(modules)
    return {f.name: table[f.name] for f in fields(ModuleStats)}  # (in field order)


# ---- reading -------------------------------------------------------------------------------
def _value(value: Any, tp: Any, where: str) -> Any:
    inner, nullable = optional(tp)
    if value is None and nullable:
        return None
    if is_record(inner):
        return decode_record(value, inner, where, _value)
    if get_origin(inner) is tuple:
        item = get_args(inner)[0]
        if is_record(item):
            return _read_table(value, item, where)
        if item in (float, int):
            read = float_values if item is float else ints
            return tuple(read(value, None, False, _item(where), where))
    if _stats_type(inner):
        return _read_stats(value, where)
    return decode(value, tp, where)  # a scalar: as version 7


def _read_table(value: Any, cls: type, where: str) -> tuple[Any, ...]:
    if not isinstance(value, dict):
        got = describe(value)
        raise FileError(where, f"expected an object (a table of {cls.__name__}), got {got}")
    names = [f.name for f in fields(cls)]
    absent = absent_later_fields(cls, value)  # (a file written before them: "not recorded")
    exact_fields(value, [name for name in names if name not in absent], where)
    types = hints(cls)
    columns: list[list[Any]] = []
    for name in names:  # (as many records as the first column has values)
        n = len(columns[0]) if columns else None
        if name in absent:
            assert n is not None, "the first field of a record is never a later one"
            columns.append([absent[name]] * n)
            continue
        here = f"{where}.{name}"
        columns.append(_read_column(value[name], n, types[name], _field(where, name), here))
    records: list[Any] = []
    for i, row in enumerate(zip(*columns, strict=True)):
        record: Any = frozen(cls, dict(zip(names, row, strict=True)))
        check_record(record, f"{where}[{i}]")
        records.append(record)
    return tuple(records)


def _read_column(value: Any, n: int | None, tp: Any, at: At, where: str) -> list[Any]:
    inner, nullable = optional(tp)
    readers = {str: strings, int: ints, bool: bools, float: float_values}
    if inner in readers:
        return readers[inner](value, n, nullable, at, where)
    if _string_tuples(inner):
        return _read_string_tuples(value, n, at, where)
    items = array(value, n, where)
    if get_origin(inner) is tuple and is_record(get_args(inner)[0]):
        return [_read_table(cell, get_args(inner)[0], at(i)) for i, cell in enumerate(items)]
    if is_record(inner):
        return [_value(cell, tp, at(i)) for i, cell in enumerate(items)]
    raise AssertionError(f"no column for {tp}")


def _read_string_tuples(value: Any, n: int | None, at: At, where: str) -> list[Any]:
    """A column of tuples of strings: an array of arrays of strings (a cell's strings may
    repeat: it is not a column)."""
    lists, repeated = cells(value, n, where)
    times = len(lists)
    if repeated:  # (one cell, read once)
        lists, at = lists[:1], lambda i: f"{where}.repeat"
    read: dict[tuple[str, ...], tuple[str, ...]] = {}  # (equal cells: one tuple)
    out = []
    for i, cell in enumerate(lists):
        if not isinstance(cell, list) or not all(type(v) is str for v in cell):
            for k, v in enumerate(array(cell, None, at(i))):
                if type(v) is not str:
                    raise FileError(f"{at(i)}[{k}]", f"expected a string, got {describe(v)}")
        strings_of = tuple(cell)
        out.append(read.setdefault(strings_of, strings_of))
    return out * times if repeated else out


def _read_stats(value: Any, where: str) -> dict[str, ModuleStats]:
    if not isinstance(value, dict):
        got = describe(value)
        raise FileError(where, f"expected an object (a table of ModuleStats), got {got}")
    names = [f.name for f in fields(ModuleStats)]
    exact_fields(value, names, where)
    keys = strings(value["key"], None, False, _field(where, "key"), f"{where}.key")
    n = len(keys)

    def at(i: int) -> str:
        return f"{where}[{json.dumps(keys[i])}]"

    types = hints(ModuleStats)
    columns: dict[str, list[Any]] = {"key": keys}
    for name in names[1:]:
        here = f"{where}.{name}"
        if name == "metrics":
            columns[name] = decode_statistics(value[name], n, at, here)
        else:
            columns[name] = _read_column(value[name], n, types[name], _field(at, name), here)
    out: dict[str, ModuleStats] = {}
    for i, row in enumerate(zip(*columns.values(), strict=True)):
        module = frozen(ModuleStats, dict(zip(names, row, strict=True)))
        if module.key in out:
            raise FileError(f"{where}[{i}].key", f"{json.dumps(module.key)} repeats an earlier key")
        check_least(module, at(i))
        out[module.key] = module
    return out


def _field(record: str | At, name: str) -> At:
    """The path of field `name` of the i-th record of a table (at `record`, or `record(i)`)."""
    if isinstance(record, str):
        return lambda i: f"{record}[{i}].{name}"
    return lambda i: f"{record(i)}.{name}"


def _item(where: str) -> At:
    return lambda i: f"{where}[{i}]"
