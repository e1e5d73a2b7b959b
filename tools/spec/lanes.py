"""The detail strip's lanes (`strip.py`): one per node drawn, or, where more nodes than fit
share a name up to its numbers (an MoE layer's experts), one lane for all of them."""

from __future__ import annotations

from typing import Any

LANE_MIN_STEP = 11  # a lane's height (band and padding) for a readable name (9 px, `MIN_TEXT_PX`)
FOLDED = "'lanes:'"  # a folded lane's key: this, then its name's pattern (node keys never start so)


def _pattern(name: str) -> str:
    """The name with every number as `#`: "experts.12" -> "experts.#" (siblings of a ModuleList
    differ only there)."""
    return f"replace({name}, regexp('[0-9]+', 'g'), '#')"


def span_lane(d: str) -> str:
    """The lane key of the span `d`: its folded lane's where `lanes_data` folded it, else its
    node's."""
    key = f"{FOLDED} + {_pattern(f'{d}.lane')}"
    return f"(indata('lanes', 'lane_key', {key}) ? {key} : {d}.node_key)"


def lanes_data() -> dict[str, Any]:
    """One row per node drawn in the strip (the first span of each), with its lane: its own,
    or, where the view has more nodes than lanes fit (each `LANE_MIN_STEP` high: an MoE
    layer's 128 experts), the lane of every node whose name differs from its own only by
    numbers ("experts.0" ... "experts.127": one lane named "experts" and their count, each
    call's spans still drawn in it and named by its card on hover). `lane_i` 1: the row
    naming its lane."""
    folds = (
        f"datum.n_nodes * {LANE_MIN_STEP} > lane_h && datum.n_like > 1 && "
        "test(regexp('[0-9]'), datum.lane)"
    )
    # "experts.#" -> "experts", "layer#" -> "layer*"
    shown = "replace(replace(datum.like, regexp('[.]#$'), ''), regexp('#', 'g'), '*')"
    return {
        "name": "lanes",
        "source": "time_spans",
        "transform": [
            {
                "type": "aggregate",
                "groupby": ["node_key", "lane"],
                "fields": ["t0_ms"],
                "ops": ["min"],
                "as": ["t0"],
            },
            {"type": "formula", "as": "like", "expr": _pattern("datum.lane")},
            {"type": "joinaggregate", "groupby": ["like"], "ops": ["count"], "as": ["n_like"]},
            {"type": "joinaggregate", "ops": ["count"], "as": ["n_nodes"]},
            {"type": "formula", "as": "folded", "expr": folds},
            {
                "type": "formula",
                "as": "lane_key",
                "expr": f"datum.folded ? {FOLDED} + datum.like : datum.node_key",
            },
            {
                "type": "formula",
                "as": "lane_text",
                "expr": f"datum.folded ? {shown} + ' \u00d7' + datum.n_like : datum.lane",
            },
            {
                "type": "window",
                "groupby": ["lane_key"],
                "sort": {"field": "t0"},
                "ops": ["row_number"],
                "as": ["lane_i"],
            },
        ],
    }
