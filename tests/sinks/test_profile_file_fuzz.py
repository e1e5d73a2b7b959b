"""Fuzzing the profile loader: a few thousand corrupted files (byte flips, truncation,
duplicate keys, nesting bombs, huge numbers, wrong values at random JSON paths) with a fixed
seed, of version 8 (columns) and of version 7 (an object per record). `load` must either
succeed or raise ModProfError; anything else fails, naming the case."""

from __future__ import annotations

import json
import random
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.sinks.file.profile_file import VERSION, save_profile
from wandb_modprof.sinks.file.profile_schema import LATER_FIELDS

SEED = 20240617
CASES = 2100  # 300 of each mutation

_JUNK: list[Any] = [
    None, True, False, 0, -1, -5, 1, 2**63, -(2**63), 2**64, 10**30, 0.5, -0.5, 1e308,
    "", "nan", "inf", "-inf", "evil", "node", "recompute", "<root>#0", [], {}, [1], {"a": 1},
]  # fmt: skip


_HUGE = ["1e999", "-1e999", "1" + "0" * 5000, "-" + "9" * 400, "1e-999", "9223372036854775808",
         "-9223372036854775809", "NaN", "Infinity"]  # fmt: skip


class _Tiny(nn.Module):
    """Small (a fast load), with a module called twice and a nested one."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.block(x))


@pytest.fixture(scope="module")
def profile() -> wandb_modprof.Profile:
    torch.manual_seed(0)
    model = _Tiny()
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(torch.randn(3, 4)).sum().backward()
    return prof


def _save(prof: wandb_modprof.Profile, path: Path, version: int) -> bytes:
    return save_profile(prof.snapshot(), path, version=version).read_bytes()


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every JSON path in `doc`."""
    out = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*at, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def _flip(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def _truncate(rng: random.Random, raw: bytes) -> bytes:
    return raw[: rng.randrange(len(raw))]


def _duplicate_key(rng: random.Random, raw: bytes) -> bytes:
    """A key repeated in one object: a fake header first, or any key of some object again."""
    text = raw.decode()
    braces = [i for i, ch in enumerate(text) if ch == "{"]
    at = rng.choice(braces[:1] * 4 + braces)
    extra = rng.choice(['"format": "evil"', '"version": 2', '"num_samples": 1', '"key": "x"'])
    return (text[: at + 1] + extra + "," + text[at + 1 :]).encode()


def _nesting_bomb(rng: random.Random, raw: bytes) -> bytes:
    depth = rng.choice([100, 1000, 10**4, 10**5])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    bomb = opener * depth + "1" + closer * depth * rng.randint(0, 1)
    doc = json.loads(raw)
    path = rng.choice(_paths(doc))
    marker = "\u0000BOMB\u0000"
    text = json.dumps(_set(doc, path, marker))
    return text.replace(json.dumps(marker), bomb).encode()


def _huge_number(rng: random.Random, raw: bytes) -> bytes:
    doc = json.loads(raw)
    path = rng.choice(_paths(doc))
    literal = rng.choice(_HUGE)
    marker = "\u0000NUM\u0000"
    return json.dumps(_set(doc, path, marker)).replace(json.dumps(marker), literal).encode()


def _wrong_value(rng: random.Random, raw: bytes) -> bytes:
    doc = json.loads(raw)
    for _ in range(rng.randint(1, 3)):
        doc = _set(doc, rng.choice(_paths(doc)), rng.choice(_JUNK))
    return json.dumps(doc).encode()


def _drop_or_add_field(rng: random.Random, raw: bytes) -> bytes:
    doc = json.loads(raw)
    objects = [p for p in _paths(doc) if isinstance(_get(doc, p), dict) and _get(doc, p)]
    node = _get(doc, rng.choice(objects))
    if rng.random() < 0.5:
        del node[rng.choice(list(node))]
    else:
        node[rng.choice(["extra", "__class__", "kind", "key"])] = rng.choice(_JUNK)
    return json.dumps(doc).encode()


def _content(raw: bytes) -> Any:
    """The JSON in `raw` with every key kept in order (repeated ones too), numbers as floats
    (the loader reads an integer in a float field as that float), less the writer's version
    and less the fields added within a version at their "not recorded" value (`LATER_FIELDS`:
    a file without one reads as that value, so dropping it changes nothing read)."""
    pairs = json.loads(raw, object_pairs_hook=list, parse_int=float)
    return _without_unrecorded([(k, v) for k, v in pairs if k != "wandb_modprof_version"])


_UNRECORDED = {(n, json.dumps(v)) for later in LATER_FIELDS.values() for n, v in later.items()}


def _without_unrecorded(value: Any) -> Any:
    if isinstance(value, list) and value and all(isinstance(e, tuple) for e in value):
        return [
            (k, _without_unrecorded(v)) for k, v in value if (k, json.dumps(v)) not in _UNRECORDED
        ]
    if isinstance(value, list):
        return [_without_unrecorded(v) for v in value]
    return value


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


_MUTATIONS: list[Callable[[random.Random, bytes], bytes]] = [
    _flip,
    _truncate,
    _duplicate_key,
    _nesting_bomb,
    _huge_number,
    _wrong_value,
    _drop_or_add_field,
]


@pytest.mark.parametrize("version", [7, VERSION])
def test_the_loader_only_loads_or_raises_mod_prof_error(
    profile: wandb_modprof.Profile, version: int, tmp_path: Path
) -> None:
    saved = _save(profile, tmp_path / "p.modprof.json", version)
    rng = random.Random(SEED)
    path = tmp_path / "fuzz.modprof.json"
    outcomes = {"loaded": 0, "refused": 0}
    failures: list[str] = []
    started = time.perf_counter()
    for case in range(CASES):
        mutate = _MUTATIONS[case % len(_MUTATIONS)]
        raw = mutate(rng, saved)
        path.write_bytes(raw)
        try:
            back = _save(wandb_modprof.load(path), tmp_path / "back.modprof.json", version)
            # nothing read was dropped (a repeated key) or changed: saved again, it is the same
            assert _content(back) == _content(raw), "saved back differently"
            outcomes["loaded"] += 1
        except ModProfError:
            outcomes["refused"] += 1
        except Exception as error:  # AssertionError too: listed with the others
            where = traceback.extract_tb(error.__traceback__)[-1]
            failures.append(
                f"seed {SEED} case {case} ({mutate.__name__}): {type(error).__name__}: "
                f"{str(error)[:200]} at {where.filename}:{where.lineno}; input starts "
                f"{raw[:120]!r}"
            )
    seconds = time.perf_counter() - started
    assert not failures, f"{len(failures)} of {CASES} cases:\n" + "\n".join(failures[:20])
    assert outcomes["refused"] > CASES // 2 and sum(outcomes.values()) == CASES
    print(f"fuzz: {CASES} cases in {seconds:.1f} s: {outcomes}")
