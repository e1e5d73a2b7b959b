"""Handing `watch`'s samples to a worker process, so that the work after a sample (resolve,
fold, table, packing the W&B rows, the report page) stays off the training thread.

Why a process: that work is pure Python. In a thread it holds the GIL and slows the training
step it overlaps by about its own length; in a process the training thread pays only the
hand-off (the sample as plain data, `capture.session_record`, pickled here: ~5 us per module
call). The worker logs the W&B rows into the user's run itself (`sinks.wandb_attach`); where
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

Failure: a worker that dies (killed, out of memory) is replaced by a new one that continues
from the worker's checkpoint (its statistics, saved after every batch of samples): the samples
handed over since are lost, with one warning. After `MAX_RESTARTS` the samples are resolved
in-process again, from the same checkpoint. Training never sees an error.
"""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wandb_modprof._warn import warn_safely
from wandb_modprof.api.sample_message import index_message, sample_message
from wandb_modprof.capture.memory.static_memory import StaticReader
from wandb_modprof.capture.session_record import session_record
from wandb_modprof.stats.accumulator import ProfileAccumulator
from wandb_modprof.stats.quiet_gc import paused_gc

if TYPE_CHECKING:
    from wandb_modprof.capture.memory.static_memory import ModelIndex
    from wandb_modprof.records.calls import Structure
    from wandb_modprof.records.snapshot import Overhead
    from wandb_modprof.sinks.wandb_log import WandbLog

OFFLOAD_MIN_CALLS = 1_000
MAX_RESTARTS = 2
START_TIMEOUT_S = 120.0  # importing torch in a cold process can take tens of seconds
_DEAD = b""  # what the receiver queues when the worker's end closed


class _Worker:
    """One worker process and its two pipe threads."""

    def __init__(self, checkpoint: str, log_path: str) -> None:
        ours, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")  # it runs no tensor work
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "wandb_modprof.api.sample_worker",
                 str(theirs.fileno()), checkpoint],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=log, env=env,
            )  # fmt: skip
        theirs.close()
        self.conn = Connection(ours.detach())
        self.outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.broken = False
        self._threads = [
            threading.Thread(target=self._send, name="modprof-send", daemon=True),
            threading.Thread(target=self._receive, name="modprof-receive", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _send(self) -> None:
        while (raw := self.outbox.get()) is not None:
            try:
                self.conn.send_bytes(raw)
            except OSError:
                self.broken = True
                return

    def _receive(self) -> None:
        try:
            while True:
                self.inbox.put(self.conn.recv_bytes())
        except (EOFError, OSError):
            self.inbox.put(_DEAD)

    def send(self, message: tuple[Any, ...]) -> None:
        with paused_gc():
            self.outbox.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def stop(self, wait_s: float) -> None:
        self.outbox.put(pickle.dumps(("stop",)))
        self.outbox.put(None)
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


def _shutdown(worker: _Worker | None, folder: str) -> None:
    if worker is not None and worker.proc.poll() is None:
        worker.stop(wait_s=5.0)
    shutil.rmtree(folder, ignore_errors=True)


class SampleHandoff:
    """The `Remote` of one watched model's accumulator (see the module docstring)."""

    def __init__(self, key: str, setting: str, start: tuple[Any, ...]) -> None:
        self.key = key
        self.setting = setting  # "auto", "process" or "off"
        self._start = start  # ("start", model, max_rows, full_detail, mode, scale, target)
        self.decided: bool | None = None if setting != "off" else False
        self._worker: _Worker | None = None
        self._folder = ""
        self._serial = 0
        self._outstanding: int | None = None  # the newest log request not answered yet
        self._newest: tuple[Any, ...] | None = None  # the newest table received, not logged
        self._shipped = 0  # samples handed over
        self._requested = 0  # samples covered by the newest log request
        self._saved = 0  # samples in the worker's newest checkpoint
        # the structures handed over, by signature: a pass's structure comes again once its
        # backward is counted (`capture.structure.backward_work`) and is handed over again
        self._structures: dict[str, Structure] = {}
        # the model index whose tables the worker holds (`index_message`): sent again only
        # when the model changed
        self._sent_index: weakref.ref[ModelIndex] | None = None
        self._restarts = 0
        self._warned = False
        # Why the worker cannot log to the run itself ("" where it can; `watch` sets it): told
        # once, when a worker first starts.
        self.attach_note = ""
        self._finalizer: weakref.finalize[Any, Any] | None = None
        # Set by `unwatch()` before it detaches: the final log loads the profile, so a forced
        # resolve (the detach's) only hands over what is pending.
        self.closing = False

    # ---- the Remote protocol -------------------------------------------------------------
    def resolve(self, acc: ProfileAccumulator, force: bool) -> None:
        """Hand over the finished sessions; when forced, wait for the worker and install its
        profile in `acc` (the in-process accumulator then reads as the worker's)."""
        if not self._decide(acc):
            acc.remote = None
            acc.resolve_pending(force)
            return
        self._ship(acc)
        if force and self._shipped and self._worker is not None and not self.closing:
            reply = self._ask(("snapshot",), acc)
            if reply is not None:
                acc.load(reply[2])  # (its overhead is this process's: `load` keeps it)

    # ---- delivery to W&B -------------------------------------------------------------------
    def deliver(self, acc: ProfileAccumulator, log: WandbLog, final: bool) -> bool:
        """`WatchHandle`'s logging while this hand-off is `acc`'s remote (it hands over what
        is pending, asks for a table when there are new samples and logs the newest table
        received); False: a table is still awaited (asked again at the next root forward).
        The final log waits for the worker."""
        self._ship(acc)
        if acc.remote is not self:  # fell back: the caller logs in-process
            return log.deliver(lambda: _resolved(acc), acc.snapshot, final=final)
        if final:
            ask = ("log", True, log.artifact_freq is not None, log.wants_report(), acc.overhead)
            reply = self._ask(ask, acc) if self._shipped else None
            if reply is None:  # nothing handed over, or fell back to in-process
                return log.deliver(lambda: _resolved(acc), acc.snapshot, final=final)
            self._newest = None
            acc.load(reply[9])
            self._log_reply(log, reply, True, acc.overhead)
            return True
        if self._shipped > self._requested:
            self._requested = self._shipped
            ask = ("log", False, log.artifact_due_next(), False, acc.overhead)
            self._outstanding = self._request(ask)
        self._drain(acc)
        newest, self._newest = self._newest, None
        if newest is not None:
            self._log_reply(log, newest, False, acc.overhead)
        return self._outstanding is None

    def _log_reply(
        self, log: WandbLog, reply: tuple[Any, ...], final: bool, overhead: Overhead | None
    ) -> None:
        """Log a ("logged", serial, count, totals, columns, rows, page, file, name, profile,
        note, saved) answer: columns None when the worker logged the rows to the run itself;
        a note (it could not, and why) is told once."""
        count, totals, columns, rows, page, path, name = reply[2:9]
        if reply[10] is not None:
            self._warn_once(f"{reply[10]}; the training thread logs {self.key}'s tables")
        log.log_packed(count, totals, columns, rows, page, path, name, final, overhead)

    def close(self, acc: ProfileAccumulator) -> None:
        """Stop the worker; `acc` keeps the profile it holds (the final log loaded it)."""
        if acc.remote is self:
            acc.remote = None
        if self._finalizer is not None:
            self._finalizer()

    # ---- the worker ------------------------------------------------------------------------
    def _decide(self, acc: ProfileAccumulator) -> bool:
        if self.decided is None:
            first = acc.first_pending()
            if first is None:
                return True  # nothing to decide on yet (nothing to hand over either)
            calls = len(first.invocations)
            movable = session_record(first) is not None
            self.decided = movable and (self.setting == "process" or calls >= OFFLOAD_MIN_CALLS)
        return self.decided

    def _ensure_worker(self, acc: ProfileAccumulator) -> _Worker | None:
        if self._worker is not None and self._worker.alive():
            return self._worker
        if self._worker is not None:
            self._replace(acc, f"exit code {self._worker.proc.poll()}")
            return self._worker
        try:
            self._folder = tempfile.mkdtemp(prefix="modprof-worker-")
            self._worker = _Worker(self._checkpoint, self._log_path)
        except Exception as error:
            self._fall_back(acc, f"could not start it ({type(error).__name__}: {error})")
            return None
        self._finalizer = weakref.finalize(self, _shutdown, self._worker, self._folder)
        self._worker.send(self._start)
        if self.attach_note:
            note, self.attach_note = self.attach_note, ""
            warn_safely(
                f"wandb_modprof: the worker process cannot log {self.key} to the W&B run itself "
                f"({note}): the training thread logs the tables. Training is not affected.",
                RuntimeWarning,
            )
        return self._worker

    @property
    def _checkpoint(self) -> str:
        return os.path.join(self._folder, "state.pickle")

    @property
    def _log_path(self) -> str:
        return os.path.join(self._folder, "worker.log")

    def _ship(self, acc: ProfileAccumulator) -> None:
        pending = acc.take_pending()
        structures = [s for s in acc.structures() if self._structures.get(s.signature) is not s]
        if not pending and not structures:
            return
        worker = self._ensure_worker(acc)
        if worker is None:  # fell back: resolve these in-process
            for item in pending:
                acc.add(*item)
            return
        for structure in structures:
            worker.send(("structure", structure))
        self._structures.update((s.signature, s) for s in structures)
        for session, gradients, static_fn in pending:
            with paused_gc():
                if isinstance(static_fn, StaticReader):
                    sent = self._sent_index() if self._sent_index is not None else None
                    if static_fn.index is not sent:
                        worker.send(index_message(static_fn))
                        self._sent_index = weakref.ref(static_fn.index)
                message = sample_message(session, gradients, static_fn)
            if message is None:
                continue  # cannot happen once decided (the clock is fixed per capture)
            worker.send(message)
            self._shipped += 1

    def _request(self, message: tuple[Any, ...]) -> int:
        self._serial += 1
        assert self._worker is not None
        self._worker.send((message[0], self._serial, *message[1:]))
        return self._serial

    def _drain(self, acc: ProfileAccumulator, until: int | None = None) -> tuple[Any, ...] | None:
        """Read the worker's answers without waiting (or until the answer to `until`)."""
        worker = self._worker
        deadline = time.monotonic() + START_TIMEOUT_S
        while worker is not None:
            try:
                raw = (
                    worker.inbox.get(timeout=1.0)
                    if until is not None
                    else worker.inbox.get_nowait()
                )
            except queue.Empty:
                if until is None:
                    if not worker.alive():
                        self._replace(acc, f"exit code {worker.proc.poll()}")
                    return None
                if worker.alive() and time.monotonic() < deadline:
                    continue
                raw = _DEAD
            if raw == _DEAD:
                self._replace(acc, f"exit code {worker.proc.poll()}")
                return None
            with paused_gc():
                reply = pickle.loads(raw)
            kind, serial = reply[0], reply[1]
            self._saved = max(self._saved, reply[-1])
            if kind == "logged" and serial == self._outstanding:
                self._outstanding = None
                self._newest = reply
            elif kind == "skipped" and serial == self._outstanding:
                self._outstanding = None
            elif kind == "error":
                self._warn_once(f"the worker failed: {reply[2].strip().splitlines()[-1]}")
                if serial == self._outstanding:
                    self._outstanding = None
            if until is not None and serial == until:
                return reply if kind != "error" else None
        return None

    def _ask(self, message: tuple[Any, ...], acc: ProfileAccumulator) -> tuple[Any, ...] | None:
        """Send `message` and wait for its answer (None: the worker is gone, see `_replace`)."""
        if self._ensure_worker(acc) is None:
            return None
        return self._drain(acc, until=self._request(message))

    def _replace(self, acc: ProfileAccumulator, why: str) -> None:
        """The worker is gone: one warning; a new worker from the checkpoint, or (after
        `MAX_RESTARTS`) the checkpoint resolved in-process from now on."""
        lost = self._shipped - self._saved
        old = self._worker
        if old is not None:
            old.stop(wait_s=1.0)
        self._worker, self._outstanding, self._requested = None, None, 0
        self._shipped = self._saved
        self._structures = {}  # the new worker needs them again
        self._sent_index = None
        self._warn_once(
            f"the worker process building {self.key}'s tables ended ({why}); {lost} sample(s) "
            "handed to it since its last checkpoint are lost, later samples are kept"
        )
        if self._restarts >= MAX_RESTARTS:
            self._fall_back(acc, "it ended too often")
            return
        self._restarts += 1
        try:
            self._worker = _Worker(self._checkpoint, self._log_path)
        except Exception as error:
            self._fall_back(acc, f"could not restart it ({type(error).__name__}: {error})")
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shutdown, self._worker, self._folder)
        self._worker.send(self._start)

    def _fall_back(self, acc: ProfileAccumulator, why: str) -> None:
        """Resolve in-process from now on, from the worker's checkpoint if there is one."""
        self._warn_once(f"samples of {self.key} are resolved on the training thread: {why}")
        acc.remote = None
        self.decided = False
        if self._folder and os.path.exists(self._checkpoint):
            with open(self._checkpoint, "rb") as file:
                acc.restore_state(pickle.load(file))
        if self._finalizer is not None:
            self._finalizer()
        self._worker = None

    def _warn_once(self, text: str) -> None:
        if self._warned:
            return
        self._warned = True
        warn_safely(f"wandb_modprof: {text}. Training is not affected.", RuntimeWarning)


def _resolved(acc: ProfileAccumulator) -> int | None:
    acc.resolve_pending(force=True)
    return None if acc.pending_count else acc.num_samples
