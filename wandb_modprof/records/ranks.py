"""Per-rank statistics of a distributed run: what each rank publishes (`RankStats`, as JSON)
and what rank 0 folds them into (`RankData`, read by the table)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

PAYLOAD_VERSION = 1
COMPACT_METRICS = ("fwd_ms", "bwd_ms", "fwd_self_ms", "bwd_self_ms")


@dataclass(frozen=True)
class RankStats:
    """One rank's compact statistics: per call key the running means of `COMPACT_METRICS`
    (None: not measured) and its sample count."""

    rank: int
    step: int
    samples: int
    means: dict[str, tuple[float | None, ...]]
    counts: dict[str, int]


def encode(stats: RankStats) -> bytes:
    keys = list(stats.means)
    payload = {
        "v": PAYLOAD_VERSION,
        "rank": stats.rank,
        "step": stats.step,
        "samples": stats.samples,
        "keys": keys,
        "counts": [stats.counts.get(k, 0) for k in keys],
        **{m: [stats.means[k][i] for k in keys] for i, m in enumerate(COMPACT_METRICS)},
    }
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


def decode(data: bytes) -> RankStats:
    payload = json.loads(data)
    if payload.get("v") != PAYLOAD_VERSION:
        raise ValueError(f"per-rank statistics of version {payload.get('v')!r}")
    keys = [str(k) for k in payload["keys"]]
    columns = [payload[m] for m in COMPACT_METRICS]
    means = {
        k: tuple(None if c[i] is None else float(c[i]) for c in columns) for i, k in enumerate(keys)
    }
    counts = {k: int(n) for k, n in zip(keys, payload["counts"], strict=True)}
    return RankStats(
        int(payload["rank"]), int(payload["step"]), int(payload["samples"]), means, counts
    )


@dataclass(frozen=True)
class RankData:
    """What rank 0's table shows about all ranks (`ProfileData.ranks`).

    `fwd_bwd[key][rank]` is that rank's mean fwd_ms + bwd_ms of call `key`, `self_ms[key][rank]`
    its mean fwd_self_ms + bwd_self_ms; `steps[rank]` the step of the rank's newest sample
    folded in."""

    world_size: int
    steps: Mapping[int, int]
    fwd_bwd: Mapping[str, Mapping[int, float]]
    self_ms: Mapping[str, Mapping[int, float]]

    @property
    def reported(self) -> tuple[int, ...]:
        return tuple(sorted(self.steps))

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.world_size) if r not in self.steps)


def fold(world_size: int, ranks: list[RankStats]) -> RankData:
    fwd_bwd: dict[str, dict[int, float]] = {}
    self_ms: dict[str, dict[int, float]] = {}
    for stats in sorted(ranks, key=lambda s: s.rank):
        for key, (fwd, bwd, fwd_self, bwd_self) in stats.means.items():
            if fwd is not None and bwd is not None:
                fwd_bwd.setdefault(key, {})[stats.rank] = fwd + bwd
            if fwd_self is not None and bwd_self is not None:
                self_ms.setdefault(key, {})[stats.rank] = fwd_self + bwd_self
    return RankData(world_size, {s.rank: s.step for s in ranks}, fwd_bwd, self_ms)
