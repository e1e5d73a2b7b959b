"""Shared test helpers: hook inspection, training-step drivers and a cheap W&B run."""

from __future__ import annotations

import gc
import json
import math
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn

from wandb_modprof import InvocationRecord
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.view.table import (
    BOOL_COLUMNS,
    COLUMNS,
    INT_COLUMNS,
    MAX_ROWS,
    MISSABLE_COLUMNS,
    NUMBER_COLUMNS,
    TEXT_COLUMNS,
    ProfileTable,
)


def hook_counts(model: nn.Module) -> dict[str, int]:
    """Number of module hooks of every kind on every submodule (root included)."""
    out = {}
    for name, m in model.named_modules():
        out[name or "<root>"] = (
            len(m._forward_pre_hooks)
            + len(m._forward_hooks)
            + len(m._backward_hooks)
            + len(m._backward_pre_hooks)
        )
    return out


def by_key(records: list[InvocationRecord]) -> dict[str, InvocationRecord]:
    return {r.key: r for r in records}


def children(records: list[InvocationRecord], key: str) -> list[InvocationRecord]:
    return [r for r in records if r.parent_key == key]


def train_step(
    model: nn.Module, x: torch.Tensor, loss_fn: Callable[[object], torch.Tensor] | None = None
) -> torch.Tensor:
    out = model(x)
    loss = loss_fn(out) if loss_fn else out.float().pow(2).mean()  # type: ignore[union-attr]
    loss.backward()
    return loss.detach()


def disabled_run() -> Any:
    """A no-op W&B run for `watch(run=...)` (~4 ms): it logs nowhere, and `run.summary[key]`
    holds the last object logged under `key`."""
    import wandb

    return wandb.init(mode="disabled")


def strict_json(text: str) -> Any:
    """`json.loads` that rejects NaN / Infinity (W&B writes them bare; browsers refuse them)."""

    def reject(constant: str) -> Any:
        raise ValueError(f"non-JSON constant {constant} in a table file")

    return json.loads(text, parse_constant=reject)


def logged_cells(
    columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> tuple[list[str], list[list[Any]]]:
    """The columns and rows of a profile table as W&B gets them (`sinks.wandb.packed.logged`): the
    cells the panel's spec reads, packed into one cell per row but `packed.UNPACKED`."""
    from wandb_modprof.sinks.wandb.packed import logged

    return logged(columns, rows)


def without_overhead(rows: Sequence[Sequence[Any]]) -> list[Sequence[Any]]:
    """Logged (packed) or full rows without the `overhead_pct` / `overhead_long_pct` meta
    rows: a watched run's measured overhead goes on after a table is logged, the rest of a
    table does not."""
    keys = ("overhead_pct", "overhead_long_pct")
    return [r for r in rows if not (r[0] == "meta" and any(k in r[:6] for k in keys))]


def check_logged_tables(files: Sequence[Path], columns: Sequence[str]) -> None:
    """Every W&B table file is strict JSON with the columns of a table with these `columns`
    that the panel reads (`logged_cells`), 1 to 10,000 rows and only finite numbers, packed
    ones included."""
    from wandb_modprof.sinks.wandb.packed import unpacked

    for path in files:
        data = strict_json(path.read_text())
        assert data["columns"] == logged_cells(columns, [])[0]
        assert 0 < len(data["data"]) <= 10_000
        _, rows = unpacked(data["columns"], data["data"])
        assert not any(
            isinstance(cell, float) and not math.isfinite(cell) for row in rows for cell in row
        )


def profiled(model: nn.Module, x: torch.Tensor, steps: int = 3) -> Any:
    """A `wandb_modprof.profile` of `steps` forward + backward steps (the first is timed and
    derives the graph, the second is the structure pass)."""
    import wandb_modprof

    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            model(x).sum().backward()
    return prof


def run_double(*, entity: str = "me", offline: bool = False, disabled: bool = False) -> Any:
    """A W&B run stand-in built from the real `wandb.Run` (`mock.create_autospec`): it has
    Run's methods and properties and no others, with Run's signatures. A method Run lacks is an
    AttributeError and a call Run would refuse a TypeError, raised in the test, where a
    hand-written fake missing a method only made wandb_modprof warn ("could not log ...") and
    the test pass. Its properties are set here (a mock is truthy); its methods record their
    calls and return mocks unless a test gives them a `side_effect`."""
    import wandb

    run = mock.create_autospec(wandb.Run, instance=True)
    run.entity, run.offline, run.disabled = entity, offline, disabled
    run.id = run.name = "run-double"
    run._teardown_hooks = []  # (set by Run.__init__, so not in the spec; `finish` runs none)
    return run


def RecordingRun(inner: Any = None, fail: bool = False) -> Any:  # noqa: N802 (was a class)
    """A `run_double` that records what `watch` logs (and where), then passes it on to `inner`:
    `.calls` holds (data, commit, inside the backward engine) per `log`, `.artifacts` every
    `log_artifact` (the profile file); `fail`: each of them raises OSError after recording."""
    run = run_double()
    run.inner, run.fail = inner, fail
    run.calls, run.artifacts = [], []

    def log(data: dict[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        run.calls.append((data, commit, tp.in_backward()))
        if run.fail:
            raise OSError("disk full")
        if run.inner is not None:
            run.inner.log(data, step=step, commit=commit)

    def log_artifact(artifact: Any, *args: Any, **kwargs: Any) -> Any:
        run.artifacts.append(artifact)
        if run.fail:
            raise OSError("disk full")
        return artifact if run.inner is None else run.inner.log_artifact(artifact, *args, **kwargs)

    run.log.side_effect = log
    run.log_artifact.side_effect = log_artifact
    return run


def check_table(table: ProfileTable, max_rows: int = MAX_ROWS) -> None:
    """Every invariant a sink relies on."""
    assert table.columns == COLUMNS
    assert not {"id", "name", "color"} & set(table.columns)  # W&B adds these
    assert len(table.rows) <= max_rows
    kinds = dict.fromkeys(TEXT_COLUMNS, str) | dict.fromkeys(INT_COLUMNS, int)
    kinds |= dict.fromkeys(BOOL_COLUMNS, bool) | dict.fromkeys(NUMBER_COLUMNS, float)
    for row in table.records():
        for column, value in row.items():
            assert type(value) is kinds[column], (column, value)  # no None, no int/float mix
            if isinstance(value, float):
                assert math.isfinite(value), (column, row)
    records = table.resolved()
    meta = {r["meta_key"]: r for r in records if r["row_kind"] == "meta"}
    assert meta["table_format"]["meta_value"] == "wandb_modprof.table"
    assert meta["reduced"]["meta_value"] == table.reduced
    views = {r["view_key"] for r in records if r["row_kind"] not in ("meta", "mem")}
    check_view_rows(records)
    nodes = {(r["view_key"], r["node_key"]): r for r in records if r["row_kind"] == "node"}
    assert len(nodes) == sum(1 for r in records if r["row_kind"] == "node")  # keys unique
    for r in nodes.values():
        assert r["x_px"] >= 0 and r["x_px"] + r["w_px"] <= r["view_w_px"] + 1e-6
        assert r["y_px"] >= 0 and r["y_px"] + r["h_px"] <= r["view_h_px"] + 1e-6
        if r["has_view"]:
            assert r["node_key"] in views  # drill-down always lands on a drawn view
        if r["node_kind"] in ("input", "output") or r["node_key"].endswith(("|inputs", "|outputs")):
            assert r["missing"] == "*"  # no metric applies to inputs and outputs, merged or not
        missing = set(r["missing"].split(",")) if r["missing"] not in ("", "*") else set()
        assert missing <= set(MISSABLE_COLUMNS)
        for column in missing:
            assert r[column] == 0.0
    for r in records:
        if r["row_kind"] == "edge":
            assert (r["view_key"], r["src_key"]) in nodes
            assert (r["view_key"], r["dst_key"]) in nodes
            assert r["edge_path"].startswith("M")
    check_timeline_rows(records, nodes)
    # every drawn view but the top one is reachable from a node of its parent view
    for view in views - {meta["root_view"]["meta_value"]}:
        assert any(key == view for (_, key) in nodes), view


def check_timeline_rows(
    records: list[dict[str, Any]], nodes: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """`span` rows name a node of their view and a window in order; `mem` rows are the curve in
    time order, and the `mem_peak` meta row holds its highest point."""
    meta = {r["meta_key"]: r for r in records if r["row_kind"] == "meta"}
    views = {r["view_id"]: r["view_key"] for r in records if r["row_kind"] == "view"}
    spans = [r for r in records if r["row_kind"] == "span"]
    per_view: dict[int, int] = {}
    for r in spans:
        assert (views[r["view_id"]], r["node_key"]) in nodes, r
        assert r["span_phase"] in ("fwd", "bwd") and r["t0_ms"] <= r["t1_ms"], r
        assert r["group_count"] >= 1 and r["missing"] == "*"
        per_view[r["view_id"]] = per_view.get(r["view_id"], 0) + 1
    # at most 500 per view, or one per node and phase in a view of more nodes than that
    drawn: dict[int, int] = {}
    for r in records:
        if r["row_kind"] == "node" and r["node_kind"] in ("module", "group"):
            drawn[r["view_id"]] = drawn.get(r["view_id"], 0) + 1
    assert all(n <= max(500, 2 * drawn.get(v, 0)) for v, n in per_view.items())
    curve = [r for r in records if r["row_kind"] == "mem"]
    assert len(curve) <= 1000
    times = [r["t0_ms"] for r in curve]
    assert times == sorted(times)
    assert all(r["live_bytes"] >= 0 and r["view_id"] == -1 for r in curve)
    if curve:
        assert meta["mem_peak"]["meta_number"] == max(r["live_bytes"] for r in curve)
        assert meta["timeline"]["meta_value"] in ("device", "saved")


def check_view_rows(records: list[dict[str, Any]]) -> None:
    """One `view` row per drawn view, numbered depth first: its `view_parent` is the view of
    its parent call, its subtree is the interval `[view_id, view_last]` (what the panel's
    breadcrumbs read), and every node and edge row names a view that has a row."""
    views = {r["view_id"]: r for r in records if r["row_kind"] == "view"}
    assert sorted(views) == list(range(len(views)))  # unique, dense
    assert len({r["view_key"] for r in views.values()}) == len(views)
    for vid, r in views.items():
        assert r["view_id"] <= r["view_last"] < len(views)
        parent = r["view_parent"]
        if parent == -1:
            continue
        up = views[parent]
        assert up["view_id"] < vid <= up["view_last"]  # inside its parent's interval
        assert r["view_last"] <= up["view_last"]
        assert r["view_depth"] > up["view_depth"]
    for r in records:
        if r["row_kind"] in ("node", "edge"):
            assert r["view_id"] in views
            assert r["view_key"] == views[r["view_id"]]["view_key"]


def crumbs(records: list[dict[str, Any]], view_key: str) -> list[str]:
    """The breadcrumb keys of `view_key` as the panel finds them (by interval), outermost
    first."""
    views = [r for r in records if r["row_kind"] == "view"]
    now = next(r["view_id"] for r in views if r["view_key"] == view_key)
    inside = [r for r in views if r["view_id"] <= now <= r["view_last"]]
    return [r["view_key"] for r in sorted(inside, key=lambda r: r["view_id"])]


# ---- watching a model's hooks ------------------------------------------------------------
class Probe(nn.Module):
    """Identity that records, at every call, the hook counts of every module of its model."""

    def __init__(self) -> None:
        super().__init__()
        self.root_ref: Callable[[], nn.Module | None] = lambda: None
        self.snapshots: list[dict[str, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        root = self.root_ref()
        assert root is not None
        self.snapshots.append(hook_counts(root))
        return x


class Probed(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.act = nn.ReLU()
        self.probe = Probe()
        self.out = nn.Linear(dim, 1)
        self.probe.root_ref = weakref.ref(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.probe(self.act(self.lin(x))))


def root_only(model: nn.Module) -> dict[str, int]:
    """What `watch` may leave on a model between samples: the root's pre-hook and hook."""
    return {name: (2 if name == "<root>" else 0) for name in hook_counts(model)}


def no_hooks(model: nn.Module) -> dict[str, int]:
    return dict.fromkeys(hook_counts(model), 0)


@contextmanager
def recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def ours(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    """The warnings wandb_modprof raised."""
    return [w for w in caught if "wandb_modprof" in str(w.message)]


def reused_layer_profile() -> Any:
    """A profile of a model that calls one Linear twice (two calls sharing one parameter set)."""

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big = nn.Linear(64, 64)
            self.head = nn.Linear(64, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.big(self.big(x)))

    return profiled(Twice(), torch.randn(4, 64))


def gc_paused_profile(steps: int = 8, paused_step: int = 2) -> tuple[Any, list[Any]]:
    """A profile of `models.PausedStack` where the middle module runs a full garbage collection
    on step `paused_step` only, and every sample as it was resolved (to compare the statistics
    with the clean samples). Live container objects make the collection take tens of ms, far
    above the module's own ~0.1 ms.

    7 samples (the first step is the structure pass): on a loaded machine the scheduler pauses
    a clean sample too now and then (a 0.04 ms call measured 28 ms). With 4 samples the median
    averaged that one with a clean one (14 ms, 300x its peers', 2 runs in 40); of 7 it is the
    4th value, a clean one unless 3 of the 6 clean samples were paused."""
    from models import PausedStack

    import wandb_modprof

    torch.manual_seed(0)
    model = PausedStack()
    x = torch.randn(8, 64)
    junk = [[i] for i in range(400_000)]  # tracked objects a full collection must walk
    samples: list[Any] = []
    # One torch thread: on a loaded machine idle intra-op threads add ms of noise to 0.1 ms ops
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # Start from empty generations: inside the full suite, garbage left by earlier tests made a
    # natural full collection (walking `junk`) land in a second sample now and then.
    gc.collect()
    try:
        model(x).pow(2).mean().backward()  # the model's start-up step, untimed
        with wandb_modprof.profile(model) as prof:
            for step in range(steps):
                model.middle.collect_next = step == paused_step
                model(x).pow(2).mean().backward()
                last = prof.last_sample
                if last is not None and (not samples or samples[-1] is not last):
                    samples.append(last)
    finally:
        torch.set_num_threads(threads)
    del junk
    return prof, samples
