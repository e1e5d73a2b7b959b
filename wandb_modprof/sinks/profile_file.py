"""`prof.save(path)` / `wandb_modprof.load(path)`: the profile as a versioned JSON file.

The file is one JSON object (UTF-8, in fact pure ASCII):

    {"format": "wandb_modprof.profile", "version": 1, "wandb_modprof_version": "0.1.0",
     "model_name": ..., "num_samples": ..., "stats": {key: ModuleStats},
     "last_sample": Sample | null, "structures": [Structure]}

Each record is an object with exactly the fields of its dataclass (`_records.py`,
`_structure.py`), in field order; tuples are arrays. The schema is read from the dataclasses'
type hints, so it follows them. JSON has no NaN or infinity: in float-typed fields those are
written as the strings `"nan"`, `"inf"`, `"-inf"`. Loading is strict: every field must be
present (`null` where the type allows it), unknown fields are rejected (a change of the schema
means a new `version`, and dropping data silently would break the exact round trip), `true` is
not an integer, an integer field holds a signed 64-bit value (|x| < 2**63), and an integer
where a float is expected is read as that float (the writer never produces one: it writes
`1.0`). The call trees must hold together: every `parent_key` in `stats` is null or another key
of `stats`, every `parent_key` in a structure's `calls` null or the key of another call of that
structure (keys unique there), no chain of parents loops, and a call without a parent has depth
0. Within one structure (one forward pass) a call's depth is its parent's depth + 1. The
statistics only promise depth >= 1 below a parent: each key keeps the parent and depth of its
last sample, and with dynamic control flow a parent can be called at another depth in a later
sample that does not call the child. Loading only parses JSON and builds the dataclasses: no
code from the file ever runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import secrets
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Protocol,
    TypeGuard,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from wandb_modprof._errors import ModProfError
from wandb_modprof._version import __version__
from wandb_modprof.records.calls import Structure
from wandb_modprof.records.sample import METRICS, ModuleStats, Sample

if TYPE_CHECKING:
    from wandb_modprof.records.snapshot import ProfileData

FORMAT = "wandb_modprof.profile"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
# Every integer the profiler records (bytes, FLOPs, counts, indices) fits a signed 64-bit int;
# a larger one can only be corrupt, and would overflow a float (or a W&B cell) downstream.
_INT_LIMIT = 2**63


@dataclass(frozen=True)
class _Data:
    """What a file holds besides its header (its field names are the file's keys; per-rank
    data is not saved)."""

    model_name: str
    num_samples: int
    stats: dict[str, ModuleStats]
    last_sample: Sample | None
    structures: tuple[Structure, ...]


class _FileError(Exception):
    """A problem at a JSON path inside the file; `load` turns it into a `ModProfError`."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


# ---- writing -------------------------------------------------------------------------------
def save_profile(prof: ProfileData, path: str | os.PathLike[str]) -> Path:
    """Write `prof` to `path` as JSON; `wandb_modprof.load(path)` reads back an equal profile.

    >>> prof.save("run.modprof.json")                         # doctest: +SKIP
    PosixPath('run.modprof.json')

    Name files `*.modprof.json` by convention; another name is written as given, never
    renamed. The output is deterministic (no timestamps; records in field order, statistics in
    forward order), so saving a loaded profile gives the same bytes. The file is written to a
    temporary file beside it and renamed over `path`, so a reader never sees half a file.
    """
    data = _Data(prof.model_name, prof.num_samples, dict(prof.stats), prof.last, prof.structures)
    doc = {"format": FORMAT, "version": VERSION, "wandb_modprof_version": __version__}
    doc.update(_encode(data, _Data))
    # ensure_ascii: escapes keep every Python str (even a lone surrogate in an odd module name)
    # round-tripping exactly; allow_nan=False: non-finite floats are already strings.
    text = json.dumps(doc, indent=1, ensure_ascii=True, allow_nan=False) + "\n"
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        # os.open with 0o666 (not mkstemp's 0o600) so the file gets the usual umask permissions.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("ascii"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
    except OSError as e:
        why = e.strerror or str(e)
        if isinstance(e, FileNotFoundError):
            why = f"directory {str(target.parent)!r} does not exist"
        raise ModProfError(f"cannot save profile to {str(target)!r}: {why}") from None
    return target


def _encode(value: Any, tp: Any) -> Any:
    """`value` (of type `tp`) as JSON builtins."""
    tp, nullable = _optional(tp)
    if value is None:
        assert nullable, f"None in a field of type {tp}"
        return None
    if _is_record(tp):
        hints = _hints(tp)
        return {f.name: _encode(getattr(value, f.name), hints[f.name]) for f in fields(tp)}
    if get_origin(tp) is tuple:
        return [_encode(item, get_args(tp)[0]) for item in value]
    if get_origin(tp) is dict:
        return {key: _encode(item, get_args(tp)[1]) for key, item in value.items()}
    if tp is float:
        value = float(value)  # an int in a float field is still written as a float
        return value if math.isfinite(value) else repr(value)  # repr: "nan", "inf", "-inf"
    return value


def _optional(tp: Any) -> tuple[Any, bool]:
    """`X | None` -> (X, True); any other type -> (it, False)."""
    if get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp):
        (inner,) = (a for a in get_args(tp) if a is not type(None))
        return inner, True
    return tp, False


def _is_record(tp: Any) -> TypeGuard[type]:
    return isinstance(tp, type) and is_dataclass(tp)


# ---- reading -------------------------------------------------------------------------------
def read_profile(path: str | os.PathLike[str]) -> ProfileData:
    """The data of a profile file written by `save_profile` (see `wandb_modprof.load`)."""
    from wandb_modprof.records.snapshot import ProfileData

    where = str(Path(path))
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ModProfError(f"cannot load {where!r}: {e.strerror or e}") from None
    try:
        data = _parse(raw)
    except _FileError as e:
        raise ModProfError(f"cannot load {where!r}: {e}") from None
    return ProfileData(
        data.model_name, data.num_samples, data.stats, data.last_sample, data.structures
    )


def _parse(raw: bytes) -> _Data:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise _FileError("", f"not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise _FileError(
            "", f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
        ) from None
    except RecursionError:
        raise _FileError("", "not valid JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer literal with more digits than Python converts
        raise _FileError("", f"not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise _FileError(
            "", f"not a wandb_modprof profile: expected a JSON object, got {_kind(doc)}"
        )
    marker = doc.pop("format", None)
    if marker != FORMAT:
        got = "no format field" if marker is None else f"format {_kind(marker)}"
        raise _FileError("", f"not a wandb_modprof profile: expected format {FORMAT!r}, got {got}")
    version = doc.pop("version", None)
    writer = doc.pop("wandb_modprof_version", None)
    if type(version) is not int:
        raise _FileError("version", f"expected an integer, got {_kind(version)}")
    if version not in SUPPORTED_VERSIONS:
        by = f" (written by wandb_modprof {writer})" if isinstance(writer, str) else ""
        newer = version > max(SUPPORTED_VERSIONS)
        raise _FileError(
            "",
            f"unsupported file format version {version}{by}; wandb_modprof {__version__} reads "
            f"version {', '.join(map(str, SUPPORTED_VERSIONS))}"
            + ("; upgrade wandb_modprof to read it" if newer else ""),
        )
    if not isinstance(writer, str):
        raise _FileError("wandb_modprof_version", f"expected a string, got {_kind(writer)}")
    data: _Data = _decode(doc, _Data, "")
    return data


def _decode(value: Any, tp: Any, where: str) -> Any:
    """`value` (parsed JSON) checked against type `tp` and built into it; `where` is its path."""
    tp, nullable = _optional(tp)
    if value is None and nullable:
        return None
    if _is_record(tp):
        return _record(value, tp, where)
    if get_origin(tp) is tuple:
        if not isinstance(value, list):
            raise _FileError(where, f"expected an array, got {_kind(value)}")
        item = get_args(tp)[0]
        return tuple(_decode(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise _FileError(where, f"expected an object, got {_kind(value)}")
        item = get_args(tp)[1]
        return {k: _decode(v, item, f"{where}[{json.dumps(k)}]") for k, v in value.items()}
    return _scalar(value, tp, where, " or null" if nullable else "")


def _record(value: Any, cls: type, where: str) -> Any:
    """A dataclass from a JSON object with exactly its fields."""
    if not isinstance(value, dict):
        raise _FileError(where, f"expected an object ({cls.__name__}), got {_kind(value)}")
    names = [f.name for f in fields(cls)]
    for name in names:
        if name not in value:
            raise _FileError(where, f"missing field {json.dumps(name)}")
    for name in value:
        if name not in names:
            raise _FileError(where, f"unknown field {json.dumps(name)}")
    hints = _hints(cls)
    prefix = f"{where}." if where else ""
    obj = cls(**{n: _decode(value[n], hints[n], prefix + n) for n in names})
    _check(obj, where)
    return obj


def _scalar(value: Any, tp: type, where: str, or_null: str) -> Any:
    if tp is float:
        if isinstance(value, float) and math.isfinite(value):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise _FileError(where, "integer too large for a float") from None
        if isinstance(value, str) and value in _NON_FINITE:
            return _NON_FINITE[value]
        if isinstance(value, float):  # a bare NaN / Infinity literal, or 1e999
            problem = "a non-finite number literal, which is not JSON"
            raise _FileError(where, f'{problem}; write "nan", "inf" or "-inf"')
        expected = 'a number or "nan", "inf", "-inf"'
    else:
        assert tp in (int, str, bool), f"no JSON decoding for {tp}"
        # type() not isinstance(): JSON true/false must not pass for an integer
        if type(value) is tp:
            if isinstance(value, int) and abs(value) >= _INT_LIMIT:
                raise _FileError(
                    where, f"integer out of range: expected |x| < 2**63, got {_kind(value)}"
                )
            return value
        expected = {int: "an integer", str: "a string", bool: "true or false"}[tp]
    raise _FileError(where, f"expected {expected}{or_null}, got {_kind(value)}")


def _kind(value: Any) -> str:
    """A parsed JSON value described for an error message, kept short."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "an array"
    text = json.dumps(value)  # a bare NaN literal shows as NaN
    return text if len(text) <= 40 else text[:37] + "..."


def _check(obj: object, where: str) -> None:
    """Cross-field checks the type hints cannot express."""
    if isinstance(obj, ModuleStats):
        for metric in obj.metrics:
            if metric not in METRICS:
                at = f"{where}.metrics[{json.dumps(metric)}]"
                raise _FileError(at, f"unknown metric (known: {', '.join(METRICS)})")
    elif isinstance(obj, _Data):
        for key, stat in obj.stats.items():
            if stat.key != key:
                at = f"stats[{json.dumps(key)}].key"
                raise _FileError(at, f"{json.dumps(stat.key)} does not match its key in stats")
        stats = list(obj.stats.values())
        _check_tree(stats, lambda i: f"stats[{json.dumps(stats[i].key)}]", "a key of stats")
        signatures = [s.signature for s in obj.structures]
        for i, signature in enumerate(signatures):
            if signature in signatures[:i]:
                raise _FileError(f"structures[{i}].signature", "repeats an earlier structure's")
    elif isinstance(obj, Structure):
        calls = {c.key for c in obj.calls}
        earlier: set[str] = set()
        for i, call in enumerate(obj.calls):
            if call.key in earlier:
                at = f"{where}.calls[{i}].key"
                raise _FileError(at, f"{json.dumps(call.key)} repeats an earlier call's key")
            earlier.add(call.key)
        _check_tree(
            obj.calls, lambda i: f"{where}.calls[{i}]", "a call of this structure", exact=True
        )
        for i, edge in enumerate(obj.edges):
            for name in ("view_key", "src_key", "dst_key"):
                node = getattr(edge, name)
                # a view is a call; the other nodes a call or "<call key>|in:<slot>" (|out:, |self)
                ok = node in calls or (
                    name != "view_key"
                    and any(node[:j] in calls for j, ch in enumerate(node) if ch == "|")
                )
                if not ok:
                    at = f"{where}.edges[{i}].{name}"
                    raise _FileError(at, f"{json.dumps(node)} is not a call of this structure")


class _Call(Protocol):
    """What `ModuleStats` and `CallInfo` share: a place in the call tree."""

    @property
    def key(self) -> str: ...
    @property
    def parent_key(self) -> str | None: ...
    @property
    def depth(self) -> int: ...


def _check_tree(
    calls: Sequence[_Call], at: Callable[[int], str], within: str, exact: bool = False
) -> None:
    """Parents within `calls` (unique keys), no cycle, depth 0 at a root; below a parent depth
    is the parent's + 1 where `exact` (one forward pass), else at least 1 (see the module
    docstring). `at(i)` is the JSON path of `calls[i]`, `within` what a parent must be."""
    index = {c.key: i for i, c in enumerate(calls)}
    for i, call in enumerate(calls):
        if call.parent_key is not None and call.parent_key not in index:
            raise _FileError(
                f"{at(i)}.parent_key", f"{json.dumps(call.parent_key)} is not {within}"
            )
    rooted: set[str] = set()  # keys whose chain of parents is known to end at a root
    for call in calls:
        chain: dict[str, None] = {}  # the keys walked so far, in order
        key: str | None = call.key
        while key is not None and key not in rooted:
            if key in chain:
                loop = [*list(chain)[list(chain).index(key) :], key]
                shown = " -> ".join(json.dumps(k) for k in loop[:6])
                more = " -> ..." if len(loop) > 6 else ""
                raise _FileError(
                    f"{at(index[key])}.parent_key", f"a cycle of parents: {shown}{more}"
                )
            chain[key] = None
            key = calls[index[key]].parent_key
        rooted.update(chain)
    for i, call in enumerate(calls):
        if call.parent_key is None:
            expected = "0 (a call without a parent)"
            ok = call.depth == 0
        elif exact:
            parent = calls[index[call.parent_key]].depth
            expected = f"{parent + 1} (its parent {json.dumps(call.parent_key)}'s depth + 1)"
            ok = call.depth == parent + 1
        else:
            expected = "at least 1 (a call below a parent)"
            ok = call.depth >= 1
        if not ok:
            raise _FileError(f"{at(i)}.depth", f"expected {expected}, got {call.depth}")
