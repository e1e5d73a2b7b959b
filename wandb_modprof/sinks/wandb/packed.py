"""The W&B copy of a profile table: each row's cells packed into one text cell.

Takes a `ProfileTable`'s columns and rows; gives the columns and rows `wandb.Table` gets
(`logged`), and back (`unpacked`: what the spec's first transforms do in the browser, for tests
and for reading a logged table file).

Why: W&B's work per cell (a type check when the table is built, `json_friendly` and a JSON
encode in `run.log`) is most of a large log's cost: 9,987 rows x 57 columns (the columns the
spec reads) took 1.5 s to build and 3.5 s to log offline (CPU time), the same rows packed
much less (README, Logging). So the W&B copy carries, per row:

- `UNPACKED` as their own columns: a panel of version 3 (preset `wandb-modprof-v3`, given as
  `chart=`) finds the `table_format` meta row in `row_kind`, `meta_key` and `meta_number` and
  says the table is newer; without `node_ref`, `src_ref` and `dst_ref` its expressions fail
  on a missing text and it shows an error instead (tested with that spec as a fixture);
- `packed`: the numbers the spec reads, joined by commas (`repr` of a float: an exact round
  trip; `str` of an int; 1 / 0 for a bool; an empty field for a column the table lacks: read as
  missing), then `SEP` and each text column the spec reads, joined by `SEP`. Text can hold any
  character (module names are the user's), so `ESC` and `SEP` inside a text are written as
  `ESC 0` and `ESC 1` (two control characters no name needs; decoded in that order, which is
  unambiguous since every `ESC` written starts a pair).

The order of both lists is the spec's own (`usermeta.wandb_modprof`): the spec registered in
W&B decodes by position, so the logging side reads the order from the spec it ships with.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from wandb_modprof.sinks.spec import read_columns, spec_text
from wandb_modprof.view.columns import BOOL_COLUMNS, INT_COLUMNS

PACKED = "packed"
UNPACKED = ("row_kind", "node_ref", "src_ref", "dst_ref", "meta_key", "meta_number")  # table order
SEP = "\x1f"  # ASCII unit separator
ESC = "\x1e"  # ASCII record separator, the escape


@functools.cache
def packed_columns() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The numeric and the text columns packed into `PACKED`, in the spec's order."""
    meta: dict[str, Any] = json.loads(spec_text()).get("usermeta", {}).get("wandb_modprof", {})
    return tuple(meta.get("numbers", ())), tuple(meta.get("texts", ()))


def logged(
    columns: Sequence[str], rows: Sequence[Sequence[object]]
) -> tuple[list[str], list[list[object]]]:
    """The columns and rows of a table as W&B gets them (see the module docstring)."""
    numbers, texts = packed_columns()
    skip = set(numbers) | set(texts)
    plain = [c for c in read_columns(tuple(columns)) if c not in skip]
    if not rows:
        return [*plain, PACKED], []
    at = {c: i for i, c in enumerate(columns)}
    by_column = list(zip(*rows, strict=True))
    blank = [""] * len(rows)
    number_fields = [_numbers(n, by_column[at[n]]) if n in at else blank for n in numbers]
    text_fields = [_texts(by_column[at[n]]) if n in at else blank for n in texts]
    joined = [",".join(parts) for parts in zip(*number_fields, strict=True)]
    cells = [SEP.join(parts) for parts in zip(joined, *text_fields, strict=True)]
    out = [list(r) for r in zip(*(by_column[at[c]] for c in plain), strict=True)]
    for row, cell in zip(out, cells, strict=True):
        row.append(cell)
    return [*plain, PACKED], out


def _numbers(name: str, values: Sequence[object]) -> list[str]:
    if name in BOOL_COLUMNS:
        return ["1" if v else "0" for v in values]
    if name in INT_COLUMNS:
        return list(map(str, values))
    return list(map(repr, values))


def _texts(values: Sequence[object]) -> list[str]:
    strings = [v if isinstance(v, str) else str(v) for v in values]
    joined = "".join(strings)
    if ESC not in joined and SEP not in joined:  # the usual case: nothing to escape
        return strings
    return [s.replace(ESC, ESC + "0").replace(SEP, ESC + "1") for s in strings]


def unpacked(
    columns: Sequence[str], rows: Sequence[Sequence[object]]
) -> tuple[list[str], list[list[object]]]:
    """`logged`'s output back as plain columns: the other columns in their order, then the
    packed numbers, then the packed texts. Rows without `PACKED` come back as they are."""
    if PACKED not in columns:
        return list(columns), [list(r) for r in rows]
    numbers, texts = packed_columns()
    cut = list(columns).index(PACKED)
    plain = [c for i, c in enumerate(columns) if i != cut]
    out = []
    for row in rows:
        values = [v for i, v in enumerate(row) if i != cut]
        head, *text_fields = str(row[cut]).split(SEP)
        number_fields = head.split(",")
        values.extend(_number(n, f) for n, f in zip(numbers, number_fields, strict=True))
        values.extend(_text(f) for f in text_fields)
        if len(text_fields) != len(texts):
            raise ValueError(f"a packed cell holds {len(text_fields)} texts, expected {len(texts)}")
        out.append(values)
    return [*plain, *numbers, *texts], out


def _number(name: str, field: str) -> object:
    if field == "":
        return None
    if name in BOOL_COLUMNS:
        return field == "1"
    return int(field) if name in INT_COLUMNS else float(field)


def _text(field: str) -> str:
    return field.replace(ESC + "1", SEP).replace(ESC + "0", ESC) if ESC in field else field
