"""Records (frozen dataclasses) to JSON builtins, for the profile file (`profile_schema` has
the schema and the checks of the way back; `profile_file.py` describes the format).

The encoder of each type is built once from its type hints. A 10,000-call profile holds
~230,000 records and ~2 million values; calling a small function per field of each record
was most of writing the file, so each record type gets one function, generated from its
fields (as `dataclasses` generates `__init__`), that reads every field inline: floats
written as floats (an int in a float field too) or, non-finite, as their `repr` ("nan",
"inf", "-inf"); `None` only where the type allows it; other values through their own
encoder.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, TypeGuard, Union, get_args, get_origin, get_type_hints


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def optional(tp: Any) -> tuple[Any, bool]:
    """`X | None` -> (X, True); any other type -> (it, False)."""
    if get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp):
        (inner,) = (a for a in get_args(tp) if a is not type(None))
        return inner, True
    return tp, False


def is_record(tp: Any) -> TypeGuard[type]:
    return isinstance(tp, type) and is_dataclass(tp)


def encode(value: Any, tp: Any) -> Any:
    """`value` (of type `tp`) as JSON builtins."""
    return encoder(tp)(value)


def _float(value: Any) -> Any:
    value = float(value)
    return value if math.isfinite(value) else repr(value)


def _missing(where: str) -> Any:
    raise AssertionError(f"None in a field that cannot be None ({where})")


def _passes(tp: Any) -> bool:
    """Values of `tp` are their own JSON (str, int, bool)."""
    return tp in (str, int, bool)


@functools.cache
def encoder(tp: Any) -> Callable[[Any], Any]:
    """The function that encodes values of type `tp`."""
    inner, nullable = optional(tp)
    enc: Callable[[Any], Any]
    if is_record(inner):
        enc = _record_encoder(inner)
    elif get_origin(inner) in (tuple, dict, Mapping):  # tuple[X, ...], dict / Mapping[K, X]
        item_type = get_args(inner)[get_origin(inner) is not tuple]
        item = encoder(item_type)
        if item_type is float:
            item = _float  # (non-nullable: no None check per item)
        rows = _record_encoder(item_type, from_fields=True) if is_record(item_type) else None

        def enc(value: Any) -> Any:
            if isinstance(value, Mapping):
                if rows is not None and getattr(value, "row_type", None) is item_type:
                    # a mapping that holds its records as field values (`ColumnMetrics`)
                    field_rows = value.field_rows  # type: ignore[attr-defined]
                    return {key: rows(row) for key, row in field_rows()}
                return {key: item(v) for key, v in value.items()}
            return [item(v) for v in value]

    elif inner is float:
        enc = _float
    else:

        def enc(value: Any) -> Any:
            return value

    if not nullable:
        return enc

    def encode_nullable(value: Any) -> Any:
        return None if value is None else enc(value)

    return encode_nullable


def _record_encoder(record: type, from_fields: bool = False) -> Callable[[Any], Any]:
    """One generated function per record type (see the module docstring); `from_fields`:
    one that takes the record's field values as a tuple, in order, instead of the record.
    The field encoders are looked up at the first call: records may refer to themselves."""
    generated: list[Callable[[Any], Any]] = []

    def first_call(value: Any) -> Any:
        if not generated:
            generated.append(_generate(record, from_fields))
        return generated[0](value)

    return first_call


def _generate(record: type, from_fields: bool) -> Callable[[Any], Any]:
    namespace: dict[str, Any] = {
        "_isfinite": math.isfinite, "_f": float, "_repr": repr, "_missing": _missing,
    }  # fmt: skip
    items = []
    for i, field in enumerate(fields(record)):
        inner, nullable = optional(hints(record)[field.name])
        read = f"value[{i}]" if from_fields else f"value.{field.name}"
        where = f"{record.__name__}.{field.name}"
        if inner is float:
            # (a float field: the walrus keeps it to one conversion and one read)
            code = "(x if _isfinite(x := _f(v)) else _repr(x))"
        elif _passes(inner):
            code = "v"
        else:
            namespace[f"_e{i}"] = encoder(inner)
            code = f"_e{i}(v)"
        if nullable:
            code = f"(None if (v := {read}) is None else {code})"
        else:
            code = f"({code} if (v := {read}) is not None else _missing({where!r}))"
        items.append(f"{field.name!r}: {code}")
    source = "def enc(value):\n    return {" + ", ".join(items) + "}\n"
    exec(source, namespace)
    generated: Callable[[Any], Any] = namespace["enc"]
    return generated
