"""Deep models: what trains unwatched at Python's default recursion limit trains watched."""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import wandb_modprof
from tests.helpers import check_table, crumbs, disabled_run
from wandb_modprof.view.table import ProfileTable
from wandb_modprof.view.timeline import TIMELINE_ROWS

DEFAULT_LIMIT = 1000


class Chain(nn.Module):
    """`depth` levels, each calling its child, then a Linear."""

    def __init__(self, depth: int, dim: int = 4) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.inner = Chain(depth - 1, dim) if depth > 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inner is not None:
            x = self.inner(x)
        out: torch.Tensor = self.fc(x)
        return out


@pytest.fixture(autouse=True)
def default_limit() -> Iterator[None]:
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(DEFAULT_LIMIT)
    yield
    sys.setrecursionlimit(before)


def chain(depth: int) -> Chain:
    sys.setrecursionlimit(10 * DEFAULT_LIMIT)  # building it recurses (our test code, not theirs)
    try:
        torch.manual_seed(0)
        return Chain(depth)
    finally:
        sys.setrecursionlimit(DEFAULT_LIMIT)


def train(model: nn.Module, steps: int = 3) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def trains_unwatched(depth: int) -> bool:
    try:
        train(chain(depth), steps=1)
    except RecursionError:
        return False
    return True


def deepest_unwatched() -> int:
    """The deepest chain (in steps of 10) training unwatched at the default limit here."""
    depth = 200
    while trains_unwatched(depth + 10):
        depth += 10
    return depth


def profile_watched(structure: bool) -> Callable[[nn.Module], tuple[list[torch.Tensor], int]]:
    def run(model: nn.Module) -> tuple[list[torch.Tensor], int]:
        with wandb_modprof.profile(model, structure=structure) as prof:
            losses = train(model)
        records = prof.invocations()
        assert len({r.key for r in records}) == len(records)
        return losses, len(records)

    return run


def watch_watched(model: nn.Module) -> tuple[list[torch.Tensor], int]:
    run = disabled_run()
    handle = wandb_modprof.watch(model, log_freq=1, run=run)
    try:
        losses = train(model)
        records = handle.profile().invocations()
    finally:
        wandb_modprof.unwatch(model)
    return losses, len(records)


@pytest.mark.parametrize("how", ["profile", "profile-no-structure", "watch"])
def test_deep_chain_trains_and_measures_every_level(how: str) -> None:
    depths = [200, deepest_unwatched()]
    for depth in depths:
        expected = train(chain(depth))
        model = chain(depth)
        measure = {
            "profile": profile_watched(True),
            "profile-no-structure": profile_watched(False),
            "watch": watch_watched,
        }[how]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an internal-error warning fails the test
            losses, calls = measure(model)
        assert calls == 2 * depth, depth  # every Chain and every Linear: one record per call
        for got, want in zip(losses, expected, strict=True):
            assert torch.equal(got, want), depth
    assert sys.getrecursionlimit() == DEFAULT_LIMIT  # the raised limit was put back


# ---- the table of a deep model: linear in the calls it shows -----------------------------------
def profiled_chain(depth: int) -> wandb_modprof.Profile:
    return profiled_chain_of(chain(depth))


def stored_bytes(table: ProfileTable) -> int:
    """The table as W&B and the report store it: one list of column names, rows as lists."""
    return len(json.dumps({"columns": list(table.columns), "data": [list(r) for r in table.rows]}))


def chain_keys(depth: int) -> list[str]:
    return ["<root>#0"] + [".".join(["inner"] * d) + "#0" for d in range(1, depth)]


def test_table_size_grows_linearly_with_depth() -> None:
    """Every row used to repeat its ancestors' keys (`view_path`): 1.9 / 10.4 / 70.8 MB of
    `records()` JSON at depth 50 / 100 / 200, depth cubed. Views are rows now, referred to by
    number, with keys relative to their view."""
    sizes = {}
    for depth in (50, 100, 200):
        table = profiled_chain(depth).table()
        check_table(table)
        # every level drawn (the memory curve may be downsampled: the timeline's own budget)
        assert not table.reduced or table.reduced.startswith("timeline: memory curve: ")
        records = table.resolved()
        views = [r for r in records if r["row_kind"] == "view"]
        assert [r["view_key"] for r in views] == chain_keys(depth)  # one view per Chain
        # the deepest view's breadcrumbs, found as the panel finds them, are the whole chain
        assert crumbs(records, chain_keys(depth)[-1]) == chain_keys(depth)
        # The graph's rows (views, nodes, edges, meta) as before issue 18; the timeline's rows
        # (issue 18: spans and the curve, `view/timeline.py`) have their own bound below.
        graph = [r for r in table.records() if r["row_kind"] not in ("span", "mem")]
        timeline = [r for r in table.records() if r["row_kind"] in ("span", "mem")]
        assert len(timeline) <= TIMELINE_ROWS
        sizes[depth] = len(json.dumps(graph))
    # (the checkpoint plan's three columns, `ckpt_*`, added a cell to every row: 4.05 MB; the
    # `rows` metric and the Load mode's four columns five more, and their names in `missing`:
    # 4.26 MB)
    assert sizes[200] < 4_400_000, sizes
    # linear: x2 per doubling (quadratic: x4, cubic: x8; before: x5.4 and x6.8)
    assert sizes[100] / sizes[50] < 2.3 and sizes[200] / sizes[100] < 2.3, sizes


def test_a_500_deep_model_profiles_with_a_table_of_a_few_megabytes(tmp_path: Path) -> None:
    """Before: three ~1 GB table files and a 1 GB report. A 500-deep chain needs a recursion
    limit above Python's default even unwatched; the user's limit is kept, ours added on top."""
    limit = 5 * DEFAULT_LIMIT
    model = chain(500)
    sys.setrecursionlimit(limit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prof = profiled_chain_of(model)
    assert sys.getrecursionlimit() == limit
    assert len(prof.invocations()) == 1000  # every Chain and every Linear
    table = prof.table()
    check_table(table)
    # every view drawn; only the memory curve is downsampled (its own budget, noted)
    assert table.reduced.startswith("timeline: memory curve: ") and ";" not in table.reduced
    assert sum(1 for r in table.records() if r["row_kind"] == "view") == 500
    # 3.75 MB when measured; the median's `_mean` and the GC columns (issue 15) added ~7 cells
    # a row since. The growth with depth is checked above; this is the "few MB" of issue 17.
    # the graph's rows, as before issue 18; the timeline's rows are bounded by their budget
    graph = [r for r in table.rows if r[0] not in ("span", "mem")]
    assert len(table.rows) - len(graph) <= TIMELINE_ROWS
    assert stored_bytes(dataclasses.replace(table, rows=tuple(graph))) < 5_000_000
    report = tmp_path / "deep.html"
    prof.to_html(report)
    # the report embeds the table: the graph's part as before issue 18, plus the timeline's rows
    timeline = [r for r in table.rows if r[0] in ("span", "mem")]
    timeline_bytes = stored_bytes(dataclasses.replace(table, rows=tuple(timeline)))
    # (+0.05 MB since: the `rows` and Load columns, 6.27 MB with 1.22 MB of timeline)
    assert report.stat().st_size < 5_200_000 + timeline_bytes


def profiled_chain_of(model: nn.Module) -> wandb_modprof.Profile:
    with wandb_modprof.profile(model) as prof:
        train(model, steps=2)
    return prof
