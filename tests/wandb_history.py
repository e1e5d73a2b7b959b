"""The history rows of an offline W&B run, read back from its `.wandb` file (W&B writes its
records in LevelDB's log framing: 32 KiB blocks of chunks, each with a 7-byte header), for
tests that check which step a row of ours joined. W&B's SDK has no reader of its own."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7  # crc32c (4 bytes), length (2), chunk type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
    pos, buffer = 7, b""  # after the file's own header: magic, version, ident
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:  # zero padding to the block's end
            pos += left
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, FIRST):
            buffer = chunk
        else:
            buffer += chunk
        if kind in (FULL, LAST):
            yield buffer


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The run's history rows in order, each with `_step` and its keys' values (parsed JSON;
    a nested key joined with "/")."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("*.wandb")
    rows = []
    for raw in _records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {"_step": record.history.step.num}
        for item in record.history.item:
            row[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        rows.append(row)
    return rows


def artifacts(run_dir: Path) -> list[dict[str, Any]]:
    """The artifacts the run logged, in order: name, type and metadata (parsed JSON)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("*.wandb")
    out = []
    for raw in _records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "artifact":
            continue
        art = record.artifact
        out.append(
            {
                "name": art.name,
                "type": art.type,
                "metadata": json.loads(art.metadata) if art.metadata else {},
            }
        )
    return out
