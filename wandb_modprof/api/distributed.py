"""Distributed training: every rank measures itself, rank 0 folds all ranks into its table.

>>> # torchrun --nproc-per-node 2 train.py, with in train.py:
>>> dist.init_process_group()                                  # doctest: +SKIP
>>> ddp = DistributedDataParallel(model)                       # doctest: +SKIP
>>> run = wandb.init(project="p") if dist.get_rank() == 0 else None     # doctest: +SKIP
>>> handle = wandb_modprof.watch(ddp, log_freq=100)            # doctest: +SKIP

Transport: the process group's key-value store (`TCPStore` under `torchrun` / `env://`, the
same for gloo and NCCL), never a collective. At each of its samples a rank **sets** one key
under `wandb_modprof/<ModelClass>/<n>/` (`n`: how many times this process watched a model of
that class before, the same on every rank of an SPMD program): `<rank>/stats`, its compact
statistics (per call key the running means of fwd_ms, bwd_ms, fwd_self_ms, bwd_self_ms and the
sample count, and the step of its newest sample, as JSON). A `set` is one
message to the store server that expects no reply, so a rank other than 0 never waits for
anybody. Rank 0, when it logs, reads the keys that exist (`check` first: a `get` of a missing
key would block until the store's timeout, so it is never issued). It waits, at most
`GATHER_WAIT_S`, only for what a rank must have published by then and only for ranks that were
not late before: any sample at its first log, the sample before rank 0's newest at later logs
(in lockstep training that one is always there: no wait at all), and rank 0's newest step at
the final log (`unwatch`). A rank that misses that deadline is "behind": rank 0 uses its latest
statistics (or none) and stops waiting for it until it catches up. So:

- no collective is ever issued: ranks that disagree about which steps are sampled (uneven
  data, a rank that raised or died) cannot block one another in our code;
- rank 0 waits at most `GATHER_WAIT_S` in one log, and that long only in a log where some
  rank falls behind (for the first time, or again after it caught up);
- our store connection is a clone of the default store's (its own socket and a short timeout,
  `STORE_TIMEOUT_S`), so even a store server that stops answering costs rank 0 at most that,
  then the gathering is switched off with a warning, and the process group's own store use
  is never delayed by ours.

The table gains per call the ranks' mean and max of fwd_ms + bwd_ms, the slowest rank and the
imbalance max / mean (`view.table`); meta rows `ranks`, `ranks_reported`, `ranks_missing`.
"""

from __future__ import annotations

import datetime
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from wandb_modprof._warn import warn_safely
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.records.ranks import COMPACT_METRICS, RankStats, decode, encode, fold

if TYPE_CHECKING:
    from wandb_modprof.stats.accumulator import ProfileAccumulator

GATHER_WAIT_S = 1.0  # rank 0's longest wait for ranks whose newest sample is older than its own
STORE_TIMEOUT_S = 10.0  # our store connection's timeout (a store server that stopped answering)
_POLL_S = (0.0002, 0.005)  # first and longest pause between polls (doubling in between)
# Channels opened per model class in this process: the same sequence on every rank.
_OPENED: dict[str, int] = {}


# ---- what the model is: wrappers and sharded modules ---------------------------------------
@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int


def rank_info() -> RankInfo | None:
    """This process's rank and the world size, or None outside a distributed run."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    return RankInfo(torch.distributed.get_rank(), torch.distributed.get_world_size())


def _store(prefix: str) -> Any:
    """A store of our own under `prefix`: a clone (own socket, short timeout) when the store
    type can clone, else the default store itself (whose timeout is then left alone)."""
    from torch.distributed.distributed_c10d import PrefixStore

    base = tp.default_store()
    try:
        own = base.clone()  # (in torch 2.13, not in its stubs)
        own.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_S))
    except (RuntimeError, NotImplementedError, AttributeError):
        own = base  # e.g. a store type without clone(): only non-blocking calls are made
    return PrefixStore(prefix, own)


# ---- what crosses the store ------------------------------------------------------------------
def compact_stats(acc: ProfileAccumulator, rank: int, step: int) -> RankStats:
    acc.resolve_pending(force=True)
    means, counts = acc.means(COMPACT_METRICS)
    return RankStats(rank, step, acc.num_samples, means, counts)


# ---- the channel -----------------------------------------------------------------------------
class RankChannel:
    """One watched model's per-rank statistics: published by every rank but 0, read by 0."""

    def __init__(self, info: RankInfo, model_name: str, store: Any = None) -> None:
        """`store`: for tests, a store to use instead of the process group's."""
        n = _OPENED.get(model_name, 0)
        _OPENED[model_name] = n + 1
        self.info = info
        self.prefix = f"wandb_modprof/{model_name}/{n}/"
        self._store = _store(self.prefix) if store is None else store
        self._published = -1  # samples published
        self._behind: set[int] = set()  # ranks not waited for (they missed a deadline)
        self._previous_step = 0  # rank 0: the step of its newest sample at its previous log
        self._seen: set[int] = set()  # rank 0: ranks whose key exists (never deleted)
        self._warned = False
        self.enabled = True
        self.wait_s = GATHER_WAIT_S

    @property
    def is_logger(self) -> bool:
        return self.info.rank == 0

    def publish(self, acc: ProfileAccumulator) -> None:
        """Every rank but 0: set this rank's newest statistics (never waits)."""
        if not self.enabled or self.is_logger:
            return
        last = acc.last
        if last is None or acc.num_samples == self._published:
            return
        try:
            stats = compact_stats(acc, self.info.rank, last.step)
            self._store.set(f"{self.info.rank}/stats", encode(stats))
            self._published = acc.num_samples
        except Exception as error:  # the store's server is gone (rank 0 / the agent died)
            self._fail("publish", error)

    def collect(self, acc: ProfileAccumulator, final: bool = False) -> bool:
        """Rank 0: fold every rank's newest statistics into `acc.ranks` (bounded wait).

        Rank 0 waits (at most `wait_s`) only for what a rank must have published by now: at a
        log, the sample before rank 0's newest (the other ranks published it at the forward
        of their step that followed it, which came before that step's backward, so in lockstep
        training it is always there and nothing is waited for); at the first log, any sample;
        at the final log (`unwatch`), the same step as rank 0's newest. So a table between
        samples may show another rank's statistics one sample older than rank 0's (the
        `ranks_reported` meta row says `rank@step`). True if a rank's statistics are newer
        than at the previous call (the final log then logs the table again)."""
        if not self.enabled or not self.is_logger:
            return False
        last = acc.last
        own_step = last.step if last is not None else 0
        need = own_step if final else self._previous_step
        try:
            others = self._read(need)
        except Exception as error:
            self._fail("read per-rank statistics", error)
            return False
        self._previous_step = own_step
        mine = compact_stats(acc, 0, own_step)
        before = acc.ranks
        after = fold(self.info.world_size, [mine, *others])
        acc.set_ranks(after)
        return before is None or dict(before.steps) != dict(after.steps)

    def _read(self, need: int) -> list[RankStats]:
        """The newest statistics of every rank that published any; waits for ranks whose
        newest published step is below `need` (0: nothing published yet) and that are not
        behind. Keys are never deleted, so a rank seen once is fetched without a `check`: one
        `multi_get` per log in the usual case."""
        store = self._store
        ranks = range(1, self.info.world_size)
        latest: dict[int, RankStats] = {}

        def late(rank: int) -> bool:
            return rank not in latest or latest[rank].step < need

        deadline = time.monotonic() + self.wait_s
        pause = _POLL_S[0]
        while True:
            for rank in ranks:
                # never a get of a missing key: it would block until the store's timeout
                if rank not in self._seen and store.check([f"{rank}/stats"]):
                    self._seen.add(rank)
            fetch = [r for r in ranks if r in self._seen and late(r)]
            if fetch:
                blobs = store.multi_get([f"{r}/stats" for r in fetch])
                for rank, blob in zip(fetch, blobs, strict=True):
                    try:
                        latest[rank] = decode(blob)
                    except (ValueError, KeyError, TypeError) as error:  # another version's
                        self._fail("decode per-rank statistics", error, disable=False)
            waiting = [r for r in ranks if r not in self._behind and late(r)]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S[1])
        for rank in ranks:
            if late(rank):
                self._behind.add(rank)
            else:
                self._behind.discard(rank)  # caught up: waited for again
        return [latest[r] for r in ranks if r in latest]

    def _fail(self, what: str, error: Exception, disable: bool = True) -> None:
        self.enabled = self.enabled and not disable
        if self._warned:
            return
        self._warned = True
        warn_safely(
            f"wandb_modprof: rank {self.info.rank} could not {what} through the process "
            f"group's store ({type(error).__name__}: {error}). "
            + (
                "Per-rank statistics are switched off for this model; training continues."
                if disable
                else "That rank's statistics are left out; training continues."
            ),
            RuntimeWarning,
            stacklevel=2,
        )


def open_channel(info: RankInfo, model_name: str) -> RankChannel | None:
    """The channel of a watched model, or None (warned) if the process group has no usable
    store: then every rank measures on its own and rank 0 logs only its own statistics."""
    try:
        return RankChannel(info, model_name)
    except Exception as error:  # a process group initialised without a default store
        warnings.warn(
            f"wandb_modprof: rank {info.rank} cannot reach the process group's store "
            f"({type(error).__name__}: {error}); per-rank statistics are not gathered and "
            "rank 0 logs its own only.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
