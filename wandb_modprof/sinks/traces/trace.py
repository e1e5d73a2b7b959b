"""The last sample as a Chrome / Perfetto trace: module forward and backward spans per call,
standalone (`standalone_trace`) or merged into a torch.profiler trace (`merged_trace`, in
`trace_merge.py`); reading the profiler's trace file and writing ours; a nesting check. Takes a
`Sample`; gives the trace as a dict (Chrome trace JSON) or the file written.

The events themselves (backward segments and why they nest) are built in `trace_events.py`.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import tempfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.sample import Sample
from wandb_modprof.sinks.files import (
    check_path,
    max_file_bytes,
    missing_directory,
    read_capped,
    too_large,
    write_atomic,
)
from wandb_modprof.sinks.traces.trace_events import PID, module_events
from wandb_modprof.sinks.traces.trace_merge import NODE_EVENT_PREFIX, merged_trace

__all__ = [
    "NODE_EVENT_PREFIX",
    "load_profiler_trace",
    "merged_trace",
    "nesting_errors",
    "standalone_trace",
    "write_trace",
]


def _metadata(sample: Sample, model_name: str) -> list[dict[str, Any]]:
    threads = {sample.forward_thread_id: "forward"}
    for run in sample.runs:
        threads.setdefault(run.thread_id, "backward")
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "args": {"name": model_name}}
    ]
    for tid, role in threads.items():
        name = f"{role} (thread {tid})"
        meta = {"ph": "M", "name": "thread_name", "pid": PID, "tid": tid}
        events.append({**meta, "args": {"name": name}})
    return events


def standalone_trace(sample: Sample, model_name: str) -> dict[str, Any]:
    """The sample on its own clock: time 0 is the start of the root module's forward."""
    runs = [(r, r.start_ms * 1e3, r.end_ms * 1e3) for r in sample.runs]
    events = _metadata(sample, model_name)
    events += module_events(sample, model_name, 0.0, {}, runs, with_runs=True)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def load_profiler_trace(source: Any) -> dict[str, Any]:
    """A torch.profiler Chrome trace from a finished `torch.profiler.profile` or a file."""
    if hasattr(source, "export_chrome_trace"):
        fd, tmp = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            source.export_chrome_trace(tmp)
        except Exception as error:  # still recording, never started, ...
            os.unlink(tmp)
            raise ModProfError(
                "torch_profiler must be a finished torch.profiler.profile (its recording "
                f"stopped); exporting its trace failed: {type(error).__name__}: {error}"
            ) from None
        try:
            return _read_json(Path(tmp))
        finally:
            os.unlink(tmp)
    if isinstance(source, (str, os.PathLike)):
        return _read_json(check_path(source, "torch_profiler"))
    raise ModProfError(
        "torch_profiler must be a finished torch.profiler.profile or the path of its exported "
        f"Chrome trace; got {type(source).__name__}"
    )


def _read_json(path: Path) -> dict[str, Any]:
    what = f"cannot read the profiler trace {str(path)!r}"
    raw = read_capped(path, what)
    try:
        if raw[:2] == b"\x1f\x8b":  # tensorboard_trace_handler(use_gzip=True) writes .json.gz
            raw = _gunzip(raw, what)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, zlib.error, ValueError, RecursionError) as error:
        raise ModProfError(f"{what}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ModProfError(
            f"{str(path)!r} is not a Chrome trace: expected an object with 'traceEvents'"
        )
    return data


def _gunzip(raw: bytes, what: str) -> bytes:
    """`raw` decompressed, at most the file size cap (a small .gz can expand to any size)."""
    cap = max_file_bytes()
    with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
        out = f.read(cap + 1)
    if len(out) > cap:
        raise ModProfError(too_large(what, cap))
    return out


def write_trace(trace: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write `trace` as JSON to `path` atomically (`sinks/files.py`)."""
    target = check_path(path, "export_chrome_trace()")
    what = f"cannot write the trace to {str(target)!r}"
    try:
        text = json.dumps(trace, allow_nan=False)
    except ValueError:  # a NaN or infinity (a loaded file's "not measured"): only then the copy
        text = json.dumps(_finite(trace), allow_nan=False)
    data = text.encode("utf-8")
    try:
        write_atomic(target, data, what)
    except OSError as error:
        why = missing_directory(error, target) or error.strerror or str(error)
        raise ModProfError(f"{what}: {why}") from None
    return target


def _finite(value: Any) -> Any:
    """`value` with every float that JSON cannot hold (NaN: a time not measured) as null, and
    without the events whose place on the time axis is such a float (nothing to draw)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        if any(
            isinstance(value.get(k), float) and not math.isfinite(value[k]) for k in ("ts", "dur")
        ):
            return None
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [_finite(v) for v in value]
        return [v for v, old in zip(items, value, strict=True) if v is not None or old is None]
    return value


# ---- checks (used by the tests; cheap enough to run on any trace) ------------------------------
def nesting_errors(events: Iterable[dict[str, Any]], cats: str = "") -> list[str]:
    """Spans that end before they start or overlap without nesting, per (pid, tid); only
    events whose category starts with `cats`."""
    by_track: dict[tuple[Any, Any], list[tuple[int, int, str]]] = {}
    errors: list[str] = []
    for ev in events:
        if ev.get("ph") != "X" or not str(ev.get("cat", "")).startswith(cats):
            continue
        ts, dur = float(ev["ts"]), float(ev["dur"])
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:
            errors.append(f"{ev['name']}: ts={ts} dur={dur}")
            continue
        # As viewers do: microseconds to integer nanoseconds, start and length separately.
        start, length = round(ts * 1000), round(dur * 1000)
        spans = by_track.setdefault((ev.get("pid"), ev.get("tid")), [])
        spans.append((start, start + length, ev["name"]))
    for track, spans in by_track.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_: list[tuple[int, int, str]] = []
        for start, end, name in spans:
            while open_ and open_[-1][1] <= start:
                open_.pop()
            if open_ and end > open_[-1][1]:
                errors.append(f"{track}: {name} [{start}, {end}] overlaps {open_[-1]}")
            open_.append((start, end, name))
    return errors
