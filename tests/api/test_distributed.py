"""Distributed training: per-rank statistics gathered to rank 0 through the process group's
store (never a collective), DDP / FSDP2 module names, and no hang when ranks disagree.

The multi-process tests start one `tests/dist_worker.py` process per rank (gloo on CPU), each
under a hard timeout, so a hang fails the test instead of hanging CI."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers import check_table
from torch import nn

import wandb_modprof
from wandb_modprof.api import distributed as _distributed
from wandb_modprof.api.distributed import RankChannel, RankInfo, compact_stats
from wandb_modprof.records import modes as _modes
from wandb_modprof.records.ranks import decode, encode, fold
from wandb_modprof.sinks.wandb.packed import unpacked
from wandb_modprof.view.table import RANK_COLUMNS, ProfileTable

WORKER = Path(__file__).resolve().parents[1] / "dist_worker.py"
HARD_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _launch(scenario: str, out: Path, world: int = 2) -> list[subprocess.CompletedProcess[str]]:
    """Start `world` ranks of `scenario`; kill them all if any runs past HARD_TIMEOUT_S."""
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)  # the hermetic WANDB_* of conftest.py
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            OMP_NUM_THREADS="1",
            WANDB_DIR=str(out / f"wandb_dir_rank{rank}"),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), scenario, str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + HARD_TIMEOUT_S
    done = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"{scenario}: a rank ran past {HARD_TIMEOUT_S} s (a hang)")
    return done


def _result(out: Path, rank: int) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((out / f"rank{rank}.json").read_text())
    return result


def _last_table(out: Path) -> list[dict[str, Any]]:
    """Rank 0's last logged table, as W&B wrote it (`files/media/table/modprof/`)."""
    (run_dir,) = (out / "rank0" / "wandb").glob("offline-run-*")
    files = list((run_dir / "files" / "media" / "table" / "modprof").glob("*.table.json"))
    assert files

    def step(path: Path) -> int:
        match = re.search(r"_table_(\d+)_", path.name)
        assert match
        return int(match.group(1))

    data = json.loads(max(files, key=step).read_text())
    # its numbers unpacked and read back with full keys, as the panel does
    columns, rows = unpacked(data["columns"], data["data"])
    table = ProfileTable(tuple(columns), tuple(map(tuple, rows)), "")
    return table.resolved()


def _meta(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["meta_key"]: r for r in records if r["row_kind"] == "meta"}


def _check(procs: list[subprocess.CompletedProcess[str]], ranks: range) -> None:
    for rank in ranks:
        assert procs[rank].returncode == 0, procs[rank].stderr[-3000:]


# ---- two processes -------------------------------------------------------------------------
def test_ddp_straggler_is_the_top_module_by_imbalance_and_only_rank_0_logs(tmp_path):
    procs = _launch("straggler", tmp_path)
    _check(procs, range(2))
    for rank in range(2):
        result = _result(tmp_path, rank)
        # names as in the user's model: no `module.` prefix; the root is the inner class
        assert result["names"] == ["<root>#0", "act#0", "fc1#0", "fc2#0", "slow#0"]
        assert result["model_name"] == "Net" and result["key"] == "modprof/Net"
        assert result["samples"] == 3
    records = _last_table(tmp_path)
    meta = _meta(records)
    assert meta["ranks"]["meta_number"] == 2
    assert meta["ranks_reported"]["meta_number"] == 2
    assert meta["ranks_reported"]["meta_value"] == "0@6,1@6"  # both ranks' newest sample
    assert meta["ranks_missing"]["meta_number"] == 0
    modules = [r for r in records if r["row_kind"] == "node" and r["node_kind"] == "module"]
    assert {r["node_key"] for r in modules} == {"fc1#0", "act#0", "slow#0", "fc2#0"}
    for row in modules:
        assert row["rank_count"] == 2
        assert not set(RANK_COLUMNS) & set(row["missing"].split(","))
        assert row["rank_fwd_bwd_max_ms"] >= row["rank_fwd_bwd_mean_ms"] > 0
    top = max(modules, key=lambda r: r["rank_imbalance"])
    assert top["node_key"] == "slow#0" and top["rank_slowest"] == 1
    assert top["rank_imbalance"] > 1.9  # 20 ms on rank 1 against ~0 on rank 0: max / mean ~ 2
    assert top["rank_fwd_bwd_max_ms"] >= 20.0
    if "imbalance" in _modes.MODE_KEYS:  # the panel's analysis mode, where it exists
        imbalance = _modes.mode("imbalance")
        assert max(modules, key=lambda r: imbalance.value(r) or 0.0)["node_key"] == "slow#0"
    # rank 1 never logged to W&B: no run directory anywhere outside rank 0's
    runs = [p for p in tmp_path.rglob("offline-run-*") if "rank0" not in p.parts]
    assert runs == []
    assert not (tmp_path / "wandb_dir_rank1").exists()


def test_a_rank_raising_in_forward_does_not_hang_rank_0(tmp_path):
    """Rank 1 raises at its first sampled step and exits; rank 0 (no DDP: the only cross-rank
    wait could be ours) trains on, unwatches in bounded time and notes the missing rank."""
    procs = _launch("raise", tmp_path)
    assert procs[1].returncode != 0 and "rank 1 fails inside forward" in procs[1].stderr
    _check(procs, range(1))
    result = _result(tmp_path, 0)
    assert result["samples"] == 4
    # 8 steps, a structure pass, 4 logs and the HTML report: ~2 s; the gather waits at most
    # GATHER_WAIT_S once for the rank that fell behind
    assert result["elapsed_s"] < 20
    meta = _meta(_last_table(tmp_path))
    assert meta["ranks"]["meta_number"] == 2
    assert meta["ranks_reported"]["meta_number"] == 1
    assert meta["ranks_missing"]["meta_value"] == "1"


def test_fsdp2_names_types_and_local_shard_bytes(tmp_path):
    procs = _launch("fsdp2", tmp_path)
    _check(procs, range(2))
    for rank in range(2):
        result = _result(tmp_path, rank)
        assert result["samples"] == 2
        assert result["names"] == [
            "<root>#0",
            "act#0",
            "fc1#0",
            "fc2#0",
            "slow#0",
            "slow.0#0",
            "slow.1#0",
        ]
        # `fully_shard` turns Net into FSDPNet: the original class names are shown
        assert result["types"]["<root>#0"] == "Net" and result["types"]["slow#0"] == "Sequential"
        # bytes of this rank's shard: fc1's 64x32 weight and 64 biases, split over 2 ranks
        assert result["param_bytes"]["fc1#0"] == (32 * 32 + 32) * 4
        assert result["param_bytes"]["slow.0#0"] == (32 * 64 + 32) * 4
        assert all(v > 0 for v in result["bwd_ms"].values() if v is not None)
        assert not [w for w in result["warnings"] if "offline" not in w]


# ---- in one process --------------------------------------------------------------------------
@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A gloo process group of world size 1 in this process."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_watch_ddp_names_modules_as_the_user_knows_them(one_rank_group):
    from helpers import disabled_run

    ddp = nn.parallel.DistributedDataParallel(_Net())
    handle = wandb_modprof.watch(ddp, log_freq=1, run=disabled_run())
    x = torch.randn(4, 8)
    for _ in range(3):
        ddp(x).sum().backward()
    prof = handle.unwatch()
    assert handle.key == "modprof/_Net" and prof.model_name == "_Net"
    stats = prof.stats()
    assert list(stats) == ["<root>#0", "fc1#0", "fc2#0"]
    assert stats["<root>#0"].module_type == "_Net"
    assert stats["<root>#0"].mean("param_bytes") == (8 * 16 + 16 + 16 * 4 + 4) * 4
    table = prof.table()
    check_table(table)
    meta = _meta(table.resolved())
    assert meta["ranks"]["missing"] == "meta_number"  # world size 1: no per-rank data


def test_table_without_distributed_data_lists_rank_columns_as_missing():
    model = _Net()
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
    records = prof.table().resolved()
    for row in records:
        if row["row_kind"] == "node" and row["node_kind"] == "module":
            assert set(RANK_COLUMNS) <= set(row["missing"].split(","))
            assert all(row[c] == 0 for c in RANK_COLUMNS)
    meta = _meta(records)
    for key in ("ranks", "ranks_reported", "ranks_missing"):
        assert meta[key]["meta_number"] == 0.0 and meta[key]["missing"] == "meta_number"


def _profile() -> wandb_modprof.Profile:
    model = _Net()
    with wandb_modprof.profile(model, structure=False) as prof:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
    return prof


def test_compact_stats_round_trip_and_fold_into_the_table():
    prof = _profile()
    mine = compact_stats(prof.accumulator, 0, 3)
    assert decode(encode(mine)) == mine
    assert len(encode(mine)) < 1000  # compact: a few numbers per call
    slow = _distributed.RankStats(
        1,
        3,
        3,
        {
            k: tuple(None if v is None else v * (10 if k == "fc2#0" else 1) for v in means)
            for k, means in mine.means.items()
        },
        mine.counts,
    )
    prof.accumulator.set_ranks(fold(3, [mine, slow]))
    table = prof.table()
    check_table(table)
    records = table.resolved()
    rows = {r["node_key"]: r for r in records if r["node_kind"] == "module"}
    assert rows["fc2#0"]["rank_slowest"] == 1 and rows["fc2#0"]["rank_count"] == 2
    assert rows["fc2#0"]["rank_imbalance"] == pytest.approx(10 / 5.5)
    assert rows["fc1#0"]["rank_imbalance"] == pytest.approx(1.0)
    assert rows["fc1#0"]["rank_slowest"] == 0  # a tie goes to the lowest rank
    meta = _meta(records)
    assert meta["ranks"]["meta_number"] == 3
    assert meta["ranks_reported"]["meta_value"] == "0@3,1@3"
    assert meta["ranks_missing"]["meta_value"] == "2"


class _PollClock:
    """`api.distributed`'s `time` module, counting the pauses between its polls of the store:
    whether a collect waited, whatever the load on the machine (a collect that does not wait
    still takes a while when the scheduler pauses the test)."""

    monotonic = staticmethod(time.monotonic)

    def __init__(self) -> None:
        self.pauses = 0

    def sleep(self, seconds: float) -> None:
        self.pauses += 1
        time.sleep(seconds)


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> _PollClock:
    clock = _PollClock()
    monkeypatch.setattr(_distributed, "time", clock)
    return clock


def test_rank_0_waits_at_most_once_for_a_rank_that_fell_behind(polls: _PollClock) -> None:
    store = dist.HashStore()
    prof = _profile()
    rank1 = RankChannel(RankInfo(1, 3), "M", store=store)
    rank0 = RankChannel(RankInfo(0, 3), "M", store=store)
    rank0.wait_s = 0.3
    rank1.publish(prof.accumulator)  # rank 2 never publishes (it died, or samples other steps)
    t0 = time.monotonic()
    rank0.collect(prof.accumulator)
    first = time.monotonic() - t0
    assert 0.3 <= first < 2.0 and polls.pauses > 0
    polls.pauses = 0
    rank0.collect(prof.accumulator)
    assert polls.pauses == 0  # rank 2 is behind: not waited for again
    assert prof.accumulator.ranks is not None and prof.accumulator.ranks.reported == (0, 1)
    assert prof.accumulator.ranks.missing == (2,)


def test_a_store_that_fails_switches_publishing_off_with_one_warning():
    class Broken:
        def set(self, key: str, value: bytes) -> None:
            raise RuntimeError("Broken pipe")

    prof = _profile()
    channel = RankChannel(RankInfo(1, 2), "M", store=Broken())
    with pytest.warns(RuntimeWarning, match="could not publish"):
        channel.publish(prof.accumulator)
    assert not channel.enabled
    channel.publish(prof.accumulator)  # no second warning, no error


def test_only_the_final_log_waits_for_rank_0s_newest_step(polls: _PollClock) -> None:
    store = dist.HashStore()
    prof = _profile()
    acc = prof.accumulator
    assert prof.last_sample is not None
    step = prof.last_sample.step
    store.set("1/stats", encode(compact_stats(acc, 1, step - 1)))  # rank 1: a sample older
    rank0 = RankChannel(RankInfo(0, 2), "F", store=store)
    rank0.wait_s = 0.3
    rank0.collect(acc)  # a log between samples: any sample of rank 1 will do
    assert polls.pauses == 0
    assert acc.ranks is not None and dict(acc.ranks.steps) == {0: step, 1: step - 1}
    t0 = time.monotonic()
    rank0.collect(acc, final=True)  # unwatch: waits (bounded) for rank 1's step `step`
    assert 0.3 <= time.monotonic() - t0 < 2.0
    # what it had: noted as such
    assert dict(acc.ranks.steps) == {0: step, 1: step - 1}
