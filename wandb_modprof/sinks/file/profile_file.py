"""`prof.save(path)` / `wandb_modprof.load(path)`: the profile as a versioned JSON file. Takes
a `ProfileData` (or a path); gives the file written (or the `ProfileData` read). This module
does the file I/O, the header and the migrations of old versions; `profile_tables.py` lays the
records out in columns (version 8) and back, `profile_schema.py` holds the rules a file meets
(and version 7's layout).

The file is one JSON object (UTF-8, in fact pure ASCII):

    {"format": "wandb_modprof.profile", "version": 8, "wandb_modprof_version": "0.1.0",
     "model_name": ..., "num_samples": ..., "stats": <table of ModuleStats>,
     "last_sample": Sample | null, "structures": <table of Structure>, "cold_left_out": int}

A tuple of records is a table: an object with one column per field of the record (each the
field's values for every record, in order: `profile_columns.py` says how a column is written,
`profile_statistics.py` how the statistics of `stats` are); any other record is an object with
exactly the fields of its dataclass (`records/sample.py`, `records/calls.py`), in field order.
Version 7 wrote every record as such an object (`{key: ModuleStats}` for `stats`, arrays of
records), which `save_profile(..., version=7)` still writes for tests and benchmarks. The
schema (`profile_schema.py`) is read from the dataclasses' type hints, so it follows them. JSON
has no NaN or infinity: in a float written as a JSON number those are the strings `"nan"`,
`"inf"`, `"-inf"` (a base64 column holds their bits). A value in a column is named by its
record's JSON path (`last_sample.invocations[3].fwd_ms`), as in version 7. Loading is
strict: every field must be present (`null` where the type allows it; `LATER_FIELDS` may be absent),
unknown fields are rejected (dropping data silently would break the exact round trip), `true`
is not an integer, an integer field holds a signed 64-bit value
(|x| < 2**63), and an integer where a float is expected is read as that float (the writer never
produces one: it writes `1.0`). The call trees must hold together: every `parent_key` in `stats`
is null or another key of `stats`, every `parent_key` in a structure's `calls` null or the key
of another call of that structure (keys unique there), no chain of parents loops, and a call
without a parent has depth 0. Within one structure (one forward pass) a call's depth is its
parent's depth + 1. The statistics only promise depth >= 1 below a parent: each key keeps the
parent and depth of its last sample, and with dynamic control flow a parent can be called at
another depth in a later sample that does not call the child. Values must make sense: no
key twice in one object, counts, sizes, FLOPs and indices >= 0 (sequence numbers >= -1, "none"),
a statistic's std >= 0 and min <= max (min >= 0 for byte and count metrics), a backward run of
kind "node" or "recompute" whose `owner_key` is an invocation of its sample. Loading only
parses JSON and builds the dataclasses: no code from the file ever runs. The file read must be
a regular file within the size cap of `sinks/files.py`. A statistic's median, where not null,
lies within [min, max].

Version 2 added each statistic's `median` (what the profile colours and ranks by), each
key's `gc_samples` (samples in which garbage collections took >= 5 % of the call) and each
invocation's `gc_ms` (and the metric of that name) and `fwd_wall_ms` (the forward's
wall-clock window; `fwd_ms` is now that less our own hook time inside it). Version-1 files
still load: those fields read as null, never invented. A profile without medians colours and
ranks by the mean, and says so (`ProfileData.statistic`, the table's `statistic` meta row,
the panel's sidebar heading and `summary`); saved again it is written as version 2 with those
nulls kept.

Version 3 added the last sample's `memory`: the step's memory curve (`records.sample.
MemoryCurve`: `source` "device" or "saved", `t_ms` non-decreasing, `live_bytes` >= 0, one per
time). With it the sample holds the step's whole timeline: each call's forward span
(`fwd_start_ms`, `fwd_wall_ms`), each backward node and recompute (`runs`, charged to their
call by `owner_key`) and the memory over the step. Version-1 and -2 files load with `memory`
null (not measured), and on CPU their calls' `fwd_mem_peak_bytes` / `bwd_mem_peak_bytes` stay
null as recorded (version 3 fills them on CPU from the curve).

Version 4 added each structure call's `compiled_region`: null outside compiled code, else the
key of the compiled region's root call (`torch.compile`) the call ran in, its own key for the
root. It must name a call of the same structure: the call itself (and then no ancestor is in
a region: only the outermost region counts) or an ancestor that is its own region's root.
Files of versions 1-3 load with every call's `compiled_region` null (not recorded: drawn as
before, without the compiled-region notes).

Version 5 added the last sample's `cold_start` (true: the model's first step in its process,
whose times include one-time start-up) and `cold_left_out` (how many such samples the
statistics left out because later samples exist: 0 or 1). Files of versions 1-4 load with
`cold_start` null (not recorded) and `cold_left_out` 0.

Version 6 added what each structure call's forward does, as the structure pass counted it:
`bwd_flops` / `bwd_self_flops` (its backward's FLOPs), `fwd_bytes` / `fwd_self_bytes` (bytes
its ops read and wrote), `fwd_ops` / `fwd_self_ops` (its ATen ops) and `work_known`; and each
structure's `roofline` (`records.roofline.Roofline`: the machine's peak FLOP/s, bytes/s and
per-op overhead, null where not found; peaks finite and > 0). Files of versions 1-5 load with
those counts 0, `work_known` false and `roofline` null (not counted: no efficiency shown).

Version 7 added what each structure call's backward did, counted on the structure pass's own
backward: `bwd_bytes` / `bwd_self_bytes`, `bwd_ops` / `bwd_self_ops` and `bwd_work_known`.
Files of versions 1-6 load with those counts 0 and `bwd_work_known` false (no backward
efficiency shown).

Version 8 stores the records as columns, with the same fields: the ~230,000 objects of a
10,000-call profile, field names and all (42 MB, 1 s to write, 5 s to load), are a few hundred
columns (9.5 MB, 0.2 s, 0.5 s: benchmarks/profile_file.py). Files of versions 1-7 load as
before (version 7's layout: `profile_schema.decode`, after the migrations below). Added in
version 8 (`LATER_FIELDS`; absent: null / false): invocation and call `rows`, `rows_linear`; the
last sample's step phases (`totals.phases`) and their medians over the samples (`phases`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wandb_modprof._errors import ModProfError
from wandb_modprof._version import __version__
from wandb_modprof.sinks.file.profile_encode import encode
from wandb_modprof.sinks.file.profile_schema import FileData, FileError, decode, describe
from wandb_modprof.sinks.file.profile_tables import decode_file, encode_file
from wandb_modprof.sinks.files import check_path, missing_directory, read_capped, write_atomic
from wandb_modprof.stats.quiet_gc import paused_gc

if TYPE_CHECKING:
    from wandb_modprof.records.snapshot import ProfileData

FORMAT = "wandb_modprof.profile"
VERSION = 8
SUPPORTED_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)


# ---- writing -------------------------------------------------------------------------------
def save_profile(
    prof: ProfileData, path: str | os.PathLike[str], *, version: int = VERSION
) -> Path:
    """Write `prof` to `path` as JSON; `wandb_modprof.load(path)` reads back an equal profile.

    >>> prof.save("run.modprof.json")                         # doctest: +SKIP
    PosixPath('run.modprof.json')

    Name files `*.modprof.json` by convention; another name is written as given, never
    renamed. The output is deterministic (no timestamps; records in field order, statistics in
    forward order), so saving a loaded profile gives the same bytes. The file is written to a
    temporary file beside it and renamed over `path`, so a reader never sees half a file and a
    failed write leaves the old file as it was; a symlink is written through, and a `path`
    that is a device, FIFO or directory is refused (`sinks/files.py`). `version` 7 writes the
    layout before version 8 (one object per record), for tests and benchmarks only.
    """
    assert version in (7, VERSION), version
    target = check_path(path, "save()")
    fields = (prof.model_name, prof.num_samples, dict(prof.stats), prof.last, prof.structures)
    data = FileData(*fields, prof.cold_left_out, prof.phases)
    doc = {"format": FORMAT, "version": version, "wandb_modprof_version": __version__}
    with paused_gc():  # (many short-lived objects, no cycles)
        doc.update(encode_file(data) if version == VERSION else encode(data, FileData))
    # ensure_ascii: escapes keep every Python str (even a lone surrogate in an odd module name)
    # round-tripping exactly; allow_nan=False: non-finite floats are already strings. No
    # indent: with one, CPython's json falls back from its C encoder to the pure-Python one,
    # 5-10x slower (most of a 10,000-call model's unwatch() in the worker). No spaces after
    # separators from version 8 on (a character per value).
    compact = version == VERSION
    options: dict[str, Any] = {"allow_nan": False, "check_circular": not compact}
    if compact:  # (built here: no cycles to look for)
        options["separators"] = (",", ":")
    # Text that is ASCII already is the same with or without escaping non-ASCII characters,
    # and is written faster without (version 8: a tenth of the writing).
    text = json.dumps(doc, ensure_ascii=not compact, **options)
    if not text.isascii():
        text = json.dumps(doc, ensure_ascii=True, **options)
    text += "\n"
    what = f"cannot save profile to {str(target)!r}"
    try:
        write_atomic(target, text.encode("ascii"), what)
    except OSError as e:
        why = missing_directory(e, target) or e.strerror or str(e)
        raise ModProfError(f"{what}: {why}") from None
    return target


# ---- reading -------------------------------------------------------------------------------
def read_profile(path: str | os.PathLike[str]) -> ProfileData:
    """The data of a profile file written by `save_profile` (see `wandb_modprof.load`)."""
    from wandb_modprof.records.snapshot import ProfileData

    where = str(check_path(path, "load()"))
    raw = read_capped(Path(where), f"cannot load {where!r}")
    try:
        with paused_gc():  # (the records it builds live on; they form no cycles)
            data = _parse(raw)
    except FileError as e:
        raise ModProfError(f"cannot load {where!r}: {e}") from None
    fields = (data.model_name, data.num_samples, data.stats, data.last_sample, data.structures)
    return ProfileData(*fields, cold_left_out=data.cold_left_out, phases=data.phases)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a repeated key: JSON parsers disagree on which one wins, so a
    file could read one way here and another elsewhere (a `"format"` before the real one)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise FileError("", f"duplicate key {json.dumps(key)} in a JSON object")
            seen.add(key)
    return obj


def _parse(raw: bytes) -> FileData:
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
        raise FileError("", f"not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise FileError(
            "", f"not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
        ) from None
    except RecursionError:
        raise FileError("", "not valid JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer literal with more digits than Python converts
        raise FileError("", f"not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise FileError(
            "", f"not a wandb_modprof profile: expected a JSON object, got {describe(doc)}"
        )
    marker = doc.pop("format", None)
    if marker != FORMAT:
        got = "no format field" if marker is None else f"format {describe(marker)}"
        raise FileError("", f"not a wandb_modprof profile: expected format {FORMAT!r}, got {got}")
    version = doc.pop("version", None)
    writer = doc.pop("wandb_modprof_version", None)
    if type(version) is not int:
        raise FileError("version", f"expected an integer, got {describe(version)}")
    if version not in SUPPORTED_VERSIONS:
        by = f" (written by wandb_modprof {writer})" if isinstance(writer, str) else ""
        newer = version > max(SUPPORTED_VERSIONS)
        raise FileError(
            "",
            f"unsupported file format version {version}{by}; wandb_modprof {__version__} reads "
            f"version {', '.join(map(str, SUPPORTED_VERSIONS))}"
            + ("; upgrade wandb_modprof to read it" if newer else ""),
        )
    if not isinstance(writer, str):
        raise FileError("wandb_modprof_version", f"expected a string, got {describe(writer)}")
    if version == VERSION:
        return decode_file(doc)
    if version == 1:
        _migrate_v1(doc)
    if version <= 2:
        _migrate_v2(doc, version)
    if version <= 3:
        _migrate_v3(doc, version)
    if version <= 4:
        _migrate_v4(doc, version)
    if version <= 5:
        _migrate_v5(doc, version)
    if version <= 6:
        _migrate_v6(doc, version)
    data: FileData = decode(doc, FileData, "")
    return data


def _migrate_v1(doc: dict[str, Any]) -> None:
    """Give a version-1 document the fields version 2 added, as null (not known): a median
    per statistic, `gc_samples` per key, `gc_ms` per invocation of the last sample. Shapes
    that are wrong are left for `decode` to report; a v1 file that already has one of these
    fields is refused as it always was (unknown field)."""

    def fill(obj: Any, name: str, where: str) -> None:
        if isinstance(obj, dict):
            if name in obj:
                raise FileError(where, f"unknown field {json.dumps(name)} (in a version 1 file)")
            obj[name] = None

    stats = doc.get("stats")
    if isinstance(stats, dict):
        for key, stat in stats.items():
            at = f"stats[{json.dumps(key)}]"
            fill(stat, "gc_samples", at)
            metrics = stat.get("metrics") if isinstance(stat, dict) else None
            if isinstance(metrics, dict):
                for metric, running in metrics.items():
                    fill(running, "median", f"{at}.metrics[{json.dumps(metric)}]")
    last = doc.get("last_sample")
    invocations = last.get("invocations") if isinstance(last, dict) else None
    if isinstance(invocations, list):
        for i, inv in enumerate(invocations):
            fill(inv, "gc_ms", f"last_sample.invocations[{i}]")
            fill(inv, "fwd_wall_ms", f"last_sample.invocations[{i}]")


def _migrate_v2(doc: dict[str, Any], version: int) -> None:
    """Give a version-1 or -2 document's last sample the `memory` field version 3 added, as
    null (no curve was recorded). A file of those versions that has it is refused."""
    last = doc.get("last_sample")
    if isinstance(last, dict):
        _add_field(last, "memory", None, "last_sample", version)


def _migrate_v3(doc: dict[str, Any], version: int) -> None:
    """Give every structure call of a version-1 to -3 document the `compiled_region` field
    version 4 added, as null (not recorded). A file of those versions that has it is refused."""
    for where, call in _structure_calls(doc):
        _add_field(call, "compiled_region", None, where, version)


def _structure_calls(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON path, call) of every structure call that is an object (other shapes are left for
    `decode` to report)."""
    structures = doc.get("structures")
    for i, structure in enumerate(structures if isinstance(structures, list) else ()):
        calls = structure.get("calls") if isinstance(structure, dict) else None
        for j, call in enumerate(calls if isinstance(calls, list) else ()):
            if isinstance(call, dict):
                yield f"structures[{i}].calls[{j}]", call


def _add_field(obj: dict[str, Any], name: str, value: Any, where: str, version: int) -> None:
    """A field a later version added, given its "not recorded" value; refused if present."""
    if name in obj:
        problem = f"unknown field {json.dumps(name)} (in a version {version} file)"
        raise FileError(where, problem)
    obj[name] = value


def _migrate_v4(doc: dict[str, Any], version: int) -> None:
    """Give a version-1 to -4 document the fields version 5 added: `cold_left_out` 0 and the
    last sample's `cold_start` null (not recorded). A file of those versions that has either
    is refused."""
    _add_field(doc, "cold_left_out", 0, "", version)
    last = doc.get("last_sample")
    if isinstance(last, dict):
        _add_field(last, "cold_start", None, "last_sample", version)


_V6_CALL_FIELDS = {
    **dict.fromkeys(("bwd_flops", "bwd_self_flops", "fwd_bytes", "fwd_self_bytes"), 0),
    **dict.fromkeys(("fwd_ops", "fwd_self_ops"), 0),
    "work_known": False,
}


def _migrate_v5(doc: dict[str, Any], version: int) -> None:
    """Give a version-1 to -5 document the fields version 6 added: per structure call the
    work counts (0) and `work_known` false, per structure `roofline` null (not counted). A file
    of those versions that has one of them is refused."""
    structures = doc.get("structures")
    for i, structure in enumerate(structures if isinstance(structures, list) else ()):
        if isinstance(structure, dict):
            _add_field(structure, "roofline", None, f"structures[{i}]", version)
    for where, call in _structure_calls(doc):
        for name, value in _V6_CALL_FIELDS.items():
            _add_field(call, name, value, where, version)


_V7_CALL_FIELDS = {
    **dict.fromkeys(("bwd_bytes", "bwd_self_bytes", "bwd_ops", "bwd_self_ops"), 0),
    "bwd_work_known": False,
}


def _migrate_v6(doc: dict[str, Any], version: int) -> None:
    """Give a version-1 to -6 document's structure calls the backward counts version 7 added
    (0) and `bwd_work_known` false. A file of those versions that has one of them is refused."""
    for where, call in _structure_calls(doc):
        for name, value in _V7_CALL_FIELDS.items():
            _add_field(call, name, value, where, version)
