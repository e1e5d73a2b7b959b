"""The rank columns of node rows and the rank meta rows, for distributed runs (rank 0 of a
`watch` under `torch.distributed`). Takes the `RankData` rank 0 gathered (or None); gives
`{column: float}` for a node row and `(key, text, number)` meta rows. Without per-rank data a
node gets no rank values, so the row writer lists its rank columns in `missing`.

>>> rank_values({0: 2.0, 1: 6.0, 2: 6.0})["rank_slowest"]  # the lowest rank on a tie
1.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from wandb_modprof.view.values import as_float

if TYPE_CHECKING:
    from wandb_modprof.records.ranks import RankData


def rank_values(per_rank: Mapping[int, float] | None) -> dict[str, float]:
    """The rank columns of one node from each rank's mean fwd + bwd time (ms)."""
    finite = {r: v for r, v in (per_rank or {}).items() if math.isfinite(as_float(v))}
    if not finite:
        return {}
    mean = sum(finite.values()) / len(finite)
    slowest = max(sorted(finite), key=lambda r: finite[r])  # the lowest rank on a tie
    out = {
        "rank_count": float(len(finite)),
        "rank_fwd_bwd_mean_ms": mean,
        "rank_fwd_bwd_max_ms": finite[slowest],
        "rank_slowest": float(slowest),
    }
    if mean > 0:
        out["rank_imbalance"] = finite[slowest] / mean
    return out


def group_rank_values(members: list[str], ranks: RankData | None) -> dict[str, float]:
    """A group node's rank columns: each rank's sum over the merged modules it measured."""
    if ranks is None:
        return {}
    sums: dict[int, float] = {}
    for key in members:
        for rank, value in ranks.fwd_bwd.get(key, {}).items():
            sums[rank] = sums.get(rank, 0.0) + value
    return rank_values(sums)


def rank_meta(ranks: RankData | None) -> list[tuple[str, str, float | None]]:
    """`ranks` (world size), `ranks_reported` (how many; text `rank@step` of each rank's newest
    sample folded in) and `ranks_missing` (how many; text: which ranks sent nothing)."""
    if ranks is None:
        return [("ranks", "", None), ("ranks_reported", "", None), ("ranks_missing", "", None)]
    reported = ",".join(f"{r}@{ranks.steps[r]}" for r in ranks.reported)
    missing = ",".join(str(r) for r in ranks.missing)
    return [
        ("ranks", "", float(ranks.world_size)),
        ("ranks_reported", reported, float(len(ranks.reported))),
        ("ranks_missing", missing, float(len(ranks.missing))),
    ]
