"""The worker process of `watch`: resolves, folds and tables samples off the training thread.

Started by `api.sample_handoff` as `python -m wandb_modprof.api.sample_worker FD CHECKPOINT`,
with one end of a socket pair as FD. It holds the profile's running statistics (a
`ProfileAccumulator`), receives finished step sessions as plain records
(`capture.session_record`) with their optimizer bytes and gradient readings, and answers log
requests with what the training process needs to log: the sample count, the newest sample's
totals, the table's columns and packed rows (`sinks.wandb.packed`), on request the HTML report page
and the whole profile. Given the run's `AttachTarget`, it logs the rows and the page to the
user's W&B run itself (`sinks.wandb.wandb_attach`) and answers without them; if it cannot attach,
it answers with them and says why, once. It saves its statistics to CHECKPOINT (written
aside, then renamed) with every table it builds, at least every `CHECKPOINT_S` seconds and
whenever the training process asks for the profile, so that a worker started after this one
crashed continues from there: only the samples since that save are lost, and counted. (A save
costs about what resolving a sample does, so saving after every sample doubled the worker's
work in a fast loop.)

Messages are pickled tuples (see `handle`). A failure while handling one is answered with
("error", serial, text) and the worker carries on; it exits when the socket closes (the
training process ended) or on ("stop",). A thread of its own sends a beat every
`worker_process.BEAT_S`, so the training process can tell a busy worker from a stuck one.
It ignores SIGINT: Ctrl-C in a terminal reaches the whole process group, and the training
process decides what happens to its samples (`api.sample_handoff`).
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from wandb_modprof.api.worker_process import BEAT, BEAT_S, read_checkpoint, write_checkpoint
from wandb_modprof.capture.memory.gradient_readings import GradientReading, GradientState
from wandb_modprof.capture.memory.static_memory import Members, StaticReadings, StaticTable
from wandb_modprof.capture.session_record import SessionRecord
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.sinks.wandb.wandb_attach import AttachedRun, AttachTarget
from wandb_modprof.stats.accumulator import ProfileAccumulator
from wandb_modprof.stats.quiet_gc import paused_gc

CHECKPOINT_S = 30.0  # the longest stretch of samples a crashed worker can lose


class _Given:
    """Gradient readings already resolved in the training process (`PendingGradientState`)."""

    def __init__(self, state: GradientState) -> None:
        self.state = state

    def resolve(self) -> GradientState:
        return self.state


class Worker:
    """The statistics of one watched model and the answers to its log requests."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self.acc: ProfileAccumulator | None = None
        self.max_rows = 10_000
        self.full_detail = ""
        self.mode, self.scale = "fwd", "linear"
        self.saved = 0  # samples in the last checkpoint written
        self.saved_at = -math.inf  # when (`time.monotonic`)
        self.files = 0  # profile files written
        self.target: AttachTarget | None = None  # the user's run, to log into
        self.attached: AttachedRun | None = None
        self.note: str | None = None  # why it could not attach, told once
        self.tables: tuple[Members, StaticTable] = ({}, {})  # the model index's, as sent

    def start(
        self,
        model_name: str,
        max_rows: int,
        full_detail: str,
        mode: str,
        scale: str,
        target: AttachTarget | None = None,
    ) -> None:
        self.acc = ProfileAccumulator(model_name)
        self.max_rows, self.full_detail, self.mode, self.scale = max_rows, full_detail, mode, scale
        self.target = target
        saved = read_checkpoint(self.checkpoint)
        if saved is not None:
            self.acc.restore_state(saved[1])
            self.saved = self.acc.num_samples

    def add_reading(
        self, record: SessionRecord, optim: list[int] | None, reading: GradientReading | None
    ) -> None:
        """A sample with per-parameter readings, resolved per module against the newest
        index tables (`sample_handoff.sample_message`)."""
        assert self.acc is not None
        members, static = self.tables
        names = {inv.name for inv in record.invocations}
        given = _Given(reading.resolve(members, names)) if reading is not None else None
        # (`_Given` answers `resolve` as `PendingGradientState` does: the reading is done)
        self.acc.add(record, given, StaticReadings(members, static, optim))  # type: ignore[arg-type]

    def save(self) -> None:
        """The statistics to the checkpoint file (aside, then renamed: never half written)."""
        assert self.acc is not None
        self.acc.resolve_pending(force=True)
        if self.acc.num_samples == self.saved:
            return
        write_checkpoint(self.checkpoint, self.acc.num_samples, self.acc.saved_state())
        self.saved = self.acc.num_samples
        self.saved_at = time.monotonic()

    def save_due(self, table_due: bool) -> bool:
        """Whether a log request saves the checkpoint first: with a table, or once
        `CHECKPOINT_S` have passed since the last save."""
        return table_due or time.monotonic() - self.saved_at >= CHECKPOINT_S

    def _attach(self) -> AttachedRun | None:
        """The user's run, attached at the first log (None: no target, or it failed)."""
        if self.attached is None and self.target is not None:
            target, self.target = self.target, None  # tried once
            try:
                self.attached = AttachedRun(target)
            except Exception as error:
                text = str(error).strip().splitlines()[0] if str(error).strip() else ""
                self.note = f"could not attach to the W&B run ({type(error).__name__}: {text})"
        return self.attached

    def log(
        self, final: bool, want_file: bool, report: bool, table_due: bool = True
    ) -> tuple[Any, ...]:
        """What the training process logs: (count, totals, columns, rows, report page, profile
        file, model name), when final the profile itself, pickled (for `unwatch()`'s result),
        and a note to tell once (or None). Attached to the run, the worker logs the rows and
        the page itself and answers None for them. `table_due` False (a sample between scheduled
        tables, `sinks.wandb.table_schedule`): no table is built, columns and rows are None."""
        from wandb_modprof.sinks.wandb import packed
        from wandb_modprof.view.table import build_table

        assert self.acc is not None
        self.acc.resolve_pending(force=True)
        data = self.acc.snapshot()
        columns: list[str] | None = None
        rows: list[list[object]] | None = None
        page = None
        with paused_gc():
            if table_due or final:
                table = build_table(data, self.max_rows, self.full_detail)
                columns, rows = packed.logged(table.columns, table.rows)
            if report and data.num_samples and columns is not None:
                from wandb_modprof.sinks.report.html import tables_html

                page = tables_html(
                    [(data.model_name, data.model_name, table)], self.mode, self.scale
                )
        path = None
        if want_file and data.num_samples:
            from wandb_modprof.sinks.file.profile_file import save_profile

            self.files += 1  # a new name each time: the training process may still read one
            path = str(save_profile(data, f"{self.checkpoint}.{self.files}.modprof.json"))
        totals = data.last.totals if data.last is not None else None
        count, name = data.num_samples, data.model_name
        note, self.note = self.note, None
        attached = self._attach() if columns is not None else None
        if attached is not None and columns is not None and rows is not None:
            try:
                attached.log(count, columns, rows, page)
            except Exception as error:  # the training process logs this one and the rest
                self.attached = None
                note = f"logging from the worker failed ({type(error).__name__}: {error})"
            else:
                columns, rows, page = None, None, None
        note = note or self.note
        self.note = None
        # final: the whole profile, pickled here so that the training process keeps it as
        # bytes and decodes it when first read (`ProfileAccumulator.load_pickled`)
        profile = None
        if final:
            with paused_gc():
                profile = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
        return (count, totals, columns, rows, page, path, name, profile, note)

    def snapshot(self) -> ProfileData:
        assert self.acc is not None
        self.acc.resolve_pending(force=True)
        return self.acc.snapshot()


def serve(conn: Connection, worker: Worker, lock: threading.Lock | None = None) -> None:
    """Answer messages until the socket closes or ("stop",) arrives (`lock`: held while
    sending, shared with the beat)."""
    lock = lock if lock is not None else threading.Lock()
    while True:
        try:
            batch = [conn.recv_bytes()]
            while conn.poll(0):
                batch.append(conn.recv_bytes())
        except (EOFError, OSError):
            return
        with paused_gc():
            messages = [pickle.loads(raw) for raw in batch]
        # Only the newest plain log request of a batch is answered with a table: an older one
        # would be outdated before the training process read it.
        outdated = [i for i, m in enumerate(messages) if m[0] == "log" and not (m[2] or m[3])][:-1]
        if outdated and any(len(messages[i]) > 6 and messages[i][6] for i in outdated):
            # a skipped request's scheduled table goes with the newest one
            newest = max(i for i, m in enumerate(messages) if m[0] == "log" and not (m[2] or m[3]))
            messages[newest] = (*messages[newest][:6], True)
        for i, message in enumerate(messages):
            if message[0] == "stop":
                return
            serial = message[1] if len(message) > 1 and isinstance(message[1], int) else -1
            try:
                reply = handle(worker, message, skip=i in outdated)
            except Exception:
                text = traceback.format_exc(limit=8)
                reply = ("error", serial, text, message[0], worker.saved)
            if reply is not None:
                with paused_gc():
                    raw = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
                with lock:
                    conn.send_bytes(raw)


def _beat(conn: Connection, lock: threading.Lock, done: threading.Event) -> None:
    """A sign of life every `BEAT_S`, until the connection closes."""
    while not done.wait(BEAT_S):
        try:
            with lock:
                conn.send_bytes(BEAT)
        except OSError:
            return


def _set_tables(worker: Worker, members: Members, static: StaticTable) -> None:
    worker.tables = (members, static)


def _add_structure(worker: Worker, structure: Any) -> None:
    assert worker.acc is not None
    worker.acc.add_structure(structure)


# the messages taken without an answer, after "start"
_TAKEN: dict[str, Callable[..., None]] = {
    "index": _set_tables,
    "reading": Worker.add_reading,
    "structure": _add_structure,
}


def handle(worker: Worker, message: tuple[Any, ...], skip: bool) -> tuple[Any, ...] | None:
    """One message: ("start", model, max_rows, full_detail, mode, scale, attach target);
    ("index", members, static table); ("reading", record, optimizer bytes, gradient reading);
    ("structure", structure); ("log", serial, final, want_file, report, overhead);
    ("snapshot", serial) (a log's want_file: write the profile file for the artifact; a final
    log also sends the profile). Log and snapshot requests are answered (a skipped log with its
    sample's totals and count only), the others not."""
    kind = message[0]
    if kind == "start":
        worker.start(*message[1:])
        return None
    assert worker.acc is not None, "the first message is start"
    taken = _TAKEN.get(kind)
    if taken is not None:
        taken(worker, *message[1:])
        return None
    serial = message[1]
    if kind == "log":
        final, want_file, report, worker.acc.overhead = message[2:6]
        table_due = bool(message[6]) if len(message) > 6 else True
        # Saved with a table or after `CHECKPOINT_S`, at a batch's newest log (the final log
        # ends the worker: its statistics go back in the reply).
        if not (final or skip) and worker.save_due(table_due):
            worker.save()
        if skip:
            # its sample's scalars still go back: the trend is per sample (resolving now is
            # work the next answer would do anyway)
            worker.acc.resolve_pending(force=True)
            last = worker.acc.last
            totals = last.totals if last is not None else None
            return ("skipped", serial, worker.acc.num_samples, worker.saved, totals)
        logged = worker.log(final, want_file, report, table_due)
        return ("logged", serial, *logged, worker.saved)
    if kind == "snapshot":
        worker.save()
        return ("data", serial, worker.snapshot(), worker.saved)
    raise ValueError(f"unknown message {kind!r}")


def main(argv: list[str]) -> int:
    fd, checkpoint = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the training process decides (docstring)
    with contextlib.suppress(OSError):
        os.nice(10)  # the training process comes first when the cores are busy
    conn, lock, done = Connection(fd), threading.Lock(), threading.Event()
    threading.Thread(target=_beat, args=(conn, lock, done), name="beat", daemon=True).start()
    try:
        serve(conn, Worker(checkpoint), lock)
    finally:
        done.set()
        with lock:
            conn.close()
    return 0


def _exit_now(code: int) -> None:
    """End the process without the interpreter's teardown: freeing a large model's statistics
    object by object and W&B's exit hooks took about 0.8 s on a 10,000-call model, which
    `unwatch()` waited for. Nothing is left to write: every answer was sent (the attached
    run's rows are at W&B's service, `AttachedRun.log`) and the checkpoint is written aside,
    then renamed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main(sys.argv[1:]))
