"""Handing `watch`'s samples to a worker process, so that the work after a sample (resolve,
fold, table, packing the W&B rows, the report page) stays off the training thread.

Why a process: that work is pure Python. In a thread it holds the GIL and slows the training
step it overlaps by about its own length; in a process the training thread pays only the
hand-off (the sample's plain record, `capture.session_record`, pickled here: ~5 us per module
call). The worker logs the W&B rows into the user's run itself (`sinks.wandb.wandb_attach`); where
it cannot attach, it answers with the packed rows and the training thread logs them.

When: `watch(offload="auto")` (the default) hands a model's samples over when its first
sample has at least `OFFLOAD_MIN_CALLS` module calls, where the in-process work costs more than
a few tens of milliseconds per sample; `offload=True` always, `False` never. Only host-timed
samples travel (an accelerator's timing events belong to this process); distributed runs
resolve in-process (their ranks publish the statistics in-process, `api.distributed`).

How: the worker (`api.sample_worker`) is started at the first hand-off as
`python -m wandb_modprof.api.sample_worker` on a socket pair (never `multiprocessing`'s spawn,
which would run the user's script again). A sender thread writes what the training thread
pickled and a receiver thread reads the answers, so neither side ever waits on the other's
pipe. A sample is logged at the first root forward after the worker answered (a step or two
after the sample on a large model); `unwatch()`, `run.finish()` and `handle.profile()` wait for
the samples handed over.

Failure: a worker that dies (killed, out of memory) or is stuck (no sign of life for
`worker_process.STUCK_S`: stopped, hung) is killed and replaced by a new one that continues
from the worker's checkpoint (its statistics, saved after every batch of samples): the samples
handed over since are lost and counted (`lost`, in `Overhead.lost` and the summary), with one
warning at the first loss and, at `unwatch()`, one more if more were lost since. After
`MAX_RESTARTS` the samples are resolved in-process again, from the same checkpoint, and that is
said once. Every wait for an answer has a deadline (`ANSWER_TIMEOUT_S`, and the stuck check
every `WAIT_SLICE_S`), so `unwatch()` ends. Ctrl-C while `unwatch()` waits kills the worker,
keeps its checkpoint, says how many samples that lost, and re-raises. A process forked from
this one (`os.fork`: data-loader workers) never touches the worker or its folder (`forked`).
Training never sees an error. The worker's life (started, replaced, given up on, what that
lost) is its `WorkerSupervisor`'s (`api.worker_supervision`), which the hand-off holds.
"""

from __future__ import annotations

import pickle
import queue
import time
from typing import TYPE_CHECKING, Any

from wandb_modprof._warn import warn_safely
from wandb_modprof.api.sample_message import index_message, sample_message
from wandb_modprof.api.worker_process import DEAD, WorkerProcess
from wandb_modprof.api.worker_supervision import (
    ANSWER_TIMEOUT_S,
    MAX_RESTARTS,
    WAIT_SLICE_S,
    WorkerSupervisor,
)
from wandb_modprof.stats.accumulator import ProfileAccumulator
from wandb_modprof.stats.quiet_gc import paused_gc

if TYPE_CHECKING:
    from wandb_modprof.capture.memory.static_memory import StaticTable
    from wandb_modprof.records.calls import Structure
    from wandb_modprof.records.snapshot import Overhead
    from wandb_modprof.sinks.wandb.wandb_log import WandbLog

__all__ = ["MAX_RESTARTS", "OFFLOAD_MIN_CALLS", "SampleHandoff"]

OFFLOAD_MIN_CALLS = 1_000


class SampleHandoff:
    """The `Remote` of one watched model's accumulator (see the module docstring)."""

    def __init__(self, key: str, setting: str, start: tuple[Any, ...]) -> None:
        self.key = key
        self.supervisor = WorkerSupervisor(key, start)  # the worker process and its life
        self.setting = setting  # "auto", "process" or "off"
        # whether samples go to a worker (None: not decided yet)
        self.decided: bool | None = None if setting != "off" else False
        self.dropped = 0  # samples a worker could not add (an error of ours, said once)
        # Why the worker cannot log to the run itself ("" where it can; `watch` sets it): told
        # once, when a worker first starts.
        self.attach_note = ""
        # Set by `unwatch()` before it detaches: the final log loads the profile, so a forced
        # resolve (the detach's) only hands over what is pending.
        self.closing = False
        self._serial = 0
        # The "logged" answers received and not logged yet, oldest first. An answer to an
        # older request counts too: with a worker a step or more behind, every answer arrives
        # after the next request went out, and each carries its sample's scalars.
        self._answers: list[tuple[Any, ...]] = []
        # What the worker now running was told; a worker that ends takes it along
        # (`supervisor.retired` counts them, `_retired` the ones this forgot):
        self._retired = 0
        self._outstanding: int | None = None  # the newest log request not answered yet
        self._requested = 0  # samples covered by the newest log request
        # the structures handed over, by signature: a pass's structure comes again once its
        # backward is counted (`capture.structure.backward_work`) and is handed over again
        self._structures: dict[str, Structure] = {}
        # the model index's static table the worker holds (`index_message`; each index has
        # its own): sent again only when the model changed
        self._sent_table: StaticTable | None = None

    # ---- what `watch` reads of the worker (`api.overhead`), and a fork's child ------------------
    @property
    def lost(self) -> int:
        """Samples handed to a worker that ended before it saved them."""
        return self.supervisor.lost

    def cpu_s(self) -> float:
        """The CPU seconds of every worker of this run so far (`api.overhead`)."""
        return self.supervisor.cpu_s()

    def forked(self) -> None:
        """In a child forked from this process: forget the worker without touching it (its
        process, pipes and folder are the parent's) and resolve in-process from now on."""
        self.supervisor.forked()
        self.decided = False

    # ---- the Remote protocol -------------------------------------------------------------
    def resolve(self, acc: ProfileAccumulator, force: bool) -> None:
        """Hand over the finished sessions' records; when forced, wait for the worker and
        install its profile in `acc` (the in-process accumulator then reads as the worker's)."""
        if not self._decide(acc):
            acc.remote = None
            acc.resolve_pending(force)
            return
        self._ship(acc, force)
        worker = self.supervisor.worker
        if force and self.supervisor.shipped and worker is not None and not self.closing:
            reply = self._ask_surviving(("snapshot",), acc)
            if reply is not None:
                acc.load(reply[2])  # (its overhead is this process's: `load` keeps it)

    # ---- delivery to W&B -------------------------------------------------------------------
    def deliver(self, acc: ProfileAccumulator, log: WandbLog, final: bool) -> bool:
        """`WatchHandle`'s logging while this hand-off is `acc`'s remote (it hands over what
        is pending, asks for a table when there are new samples and logs the newest table
        received); False: a table is still awaited (asked again at the next root forward).
        The final log waits for the worker."""
        self._ship(acc, final)
        if acc.remote is not self:  # fell back: the caller logs in-process
            return log.deliver(lambda: _resolved(acc), acc.snapshot, final=final)
        ask: tuple[object, ...]
        if final:
            ask = ("log", True, log.artifact_freq is not None, log.wants_report(), acc.overhead)
            reply = self._ask_surviving(ask, acc) if self.supervisor.shipped else None
            if reply is None:  # nothing handed over, or fell back to in-process
                return log.deliver(lambda: _resolved(acc), acc.snapshot, final=final)
            self._answers = []
            log.table_due(reply[2], final=True)  # (the final answer carries the table)
            acc.load_pickled(reply[2], reply[9])
            self._log_reply(log, reply, True, acc.overhead)
            return True
        shipped = self.supervisor.shipped
        if shipped > self._requested:
            self._requested = shipped
            table = log.table_due(shipped)  # (`sinks.wandb.table_schedule`)
            ask = ("log", False, log.artifact_due_next(), False, acc.overhead, table)
            self._outstanding = self._request(ask)
        self._drain(acc)
        # One answer a step: a row of the run takes one value per key, so the answers that
        # came together are logged at this step and the next ones (a backlog the size of the
        # worker's batch; the final log supersedes what is left).
        if self._answers:
            self._log_reply(log, self._answers.pop(0), False, acc.overhead)
        return self._outstanding is None and not self._answers

    def _log_reply(
        self, log: WandbLog, reply: tuple[Any, ...], final: bool, overhead: Overhead | None
    ) -> None:
        """Log a ("logged", serial, count, totals, columns, rows, page, file, name, profile,
        note, saved) answer: columns None when the worker logged the rows to the run itself;
        a note (it could not, and why) is told once."""
        if reply[0] == "skipped":  # ("skipped", serial, count, saved, totals): scalars only
            log.log_packed(reply[2], reply[4], None, None, None, None, "", False, overhead)
            return
        count, totals, columns, rows, page, path, name = reply[2:9]
        if reply[10] is not None:
            text = f"{reply[10]}; the training thread logs {self.key}'s tables"
            self.supervisor.tell_once("attach", text)
        log.log_packed(count, totals, columns, rows, page, path, name, final, overhead)

    def close(self, acc: ProfileAccumulator) -> None:
        """Stop the worker; `acc` keeps the profile it holds (the final log loaded it)."""
        if acc.remote is self:
            acc.remote = None
        self.supervisor.end(acc.num_samples)

    # ---- the worker ------------------------------------------------------------------------
    def _live_worker(self, acc: ProfileAccumulator) -> WorkerProcess | None:
        """The supervisor's live worker (`WorkerSupervisor.ensure`), None once it gave up."""
        first = self.supervisor.worker is None
        worker = self._follow(acc, self.supervisor.ensure(acc))
        if worker is not None and first and self.attach_note:
            note, self.attach_note = self.attach_note, ""
            warn_safely(
                f"wandb_modprof: the worker process cannot log {self.key} to the W&B run itself "
                f"({note}): the training thread logs the tables. Training is not affected.",
                RuntimeWarning,
            )
        return worker

    def _follow(
        self, acc: ProfileAccumulator, worker: WorkerProcess | None
    ) -> WorkerProcess | None:
        """After the supervisor ensured, replaced or abandoned the worker (`worker` is the one
        now, None: it gave up): what an ended worker was told is forgotten (a new one needs the
        structures and the index again, and answers no request sent before), and once it gave
        up `acc` resolves in-process."""
        if self.supervisor.retired != self._retired:
            self._retired = self.supervisor.retired
            self._outstanding, self._requested = None, 0
            self._structures, self._sent_table = {}, None
        if worker is None:
            acc.remote = None
            self.decided = False
        return worker

    def _decide(self, acc: ProfileAccumulator) -> bool:
        if self.decided is None:
            first = acc.first_pending()
            if first is None:
                return True  # nothing to decide on yet (nothing to hand over either)
            calls = len(first.invocations)
            wanted = self.setting == "process" or calls >= OFFLOAD_MIN_CALLS
            self.decided = first.movable and wanted
        return self.decided

    def _ship(self, acc: ProfileAccumulator, force: bool) -> None:
        """Hand the worker the new structures and the records ready (forced: every record)."""
        pending = acc.take_pending(force)
        structures = [s for s in acc.structures() if self._structures.get(s.signature) is not s]
        if not pending and not structures:
            return
        worker = self._live_worker(acc)
        if worker is None:  # fell back: resolve these in-process
            for item in pending:
                acc.add(*item)
            return
        for structure in structures:
            worker.send(("structure", structure))
        self._structures.update((s.signature, s) for s in structures)
        for record, gradients, static in pending:
            with paused_gc():
                if static.static is not self._sent_table:
                    worker.send(index_message(static))
                    self._sent_table = static.static
                message = sample_message(record, gradients, static)
            if message is None:
                continue  # cannot happen once decided (the clock is fixed per capture)
            self.supervisor.hand(message)

    def _request(self, message: tuple[Any, ...]) -> int:
        self._serial += 1
        worker = self.supervisor.worker
        assert worker is not None
        worker.send((message[0], self._serial, *message[1:]))
        return self._serial

    def _drain(self, acc: ProfileAccumulator, until: int | None = None) -> tuple[Any, ...] | None:
        """Read the worker's answers without waiting (or until the answer to `until`, with
        the deadlines of the module docstring)."""
        try:
            return self._read(acc, until)
        except KeyboardInterrupt:
            if self.closing:  # Ctrl-C while unwatch() waits: nothing lost silently
                self.supervisor.abandon(acc)
                self._follow(acc, None)
            raise

    def _read(self, acc: ProfileAccumulator, until: int | None) -> tuple[Any, ...] | None:
        worker = self.supervisor.worker
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while worker is not None:
            try:
                raw = (
                    worker.inbox.get(timeout=WAIT_SLICE_S)
                    if until is not None
                    else worker.inbox.get_nowait()
                )
            except queue.Empty:
                why = self.supervisor.gone_why(worker, deadline if until is not None else None)
                if why is not None:
                    self._follow(acc, self.supervisor.replace(acc, why))
                    return None
                if until is None:
                    return None
                continue
            if raw == DEAD:
                self._follow(acc, self.supervisor.replace(acc, worker.ended()))
                return None
            with paused_gc():
                reply = pickle.loads(raw)
            kind, serial = reply[0], reply[1]
            if kind == "logged":
                if serial == self._outstanding:
                    self._outstanding = None
                self._answers.append(reply)
            elif kind == "skipped":
                if serial == self._outstanding:
                    self._outstanding = None
                if len(reply) > 4 and reply[4] is not None:  # its sample's scalars
                    self._answers.append(reply)
            elif kind == "error":
                if reply[3] == "reading":
                    self.dropped += 1
                text = reply[2].strip().splitlines()[-1]
                self.supervisor.tell_once(
                    "error", f"the worker failed ({text}); that sample is dropped"
                )
                if serial == self._outstanding:
                    self._outstanding = None
            if until is not None and serial == until:
                return reply if kind != "error" else None
        return None

    def _ask(self, message: tuple[Any, ...], acc: ProfileAccumulator) -> tuple[Any, ...] | None:
        """Send `message` and wait for its answer (None: the worker is gone, see `replace`)."""
        if self._live_worker(acc) is None:
            return None
        return self._drain(acc, until=self._request(message))

    def _ask_surviving(
        self, message: tuple[Any, ...], acc: ProfileAccumulator
    ) -> tuple[Any, ...] | None:
        """`_ask`, asked again of the worker that replaced one that ended while it waited
        (it holds the checkpoint: what the ended one saved)."""
        for _ in range(MAX_RESTARTS + 1):
            before = self.supervisor.restarts
            reply = self._ask(message, acc)
            if reply is not None or acc.remote is not self or self.supervisor.restarts == before:
                return reply
        return None


def _resolved(acc: ProfileAccumulator) -> int | None:
    acc.resolve_pending(force=True)
    return None if acc.pending_count else acc.num_samples
