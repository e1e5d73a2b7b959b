"""One worker process of `watch` (`api.sample_worker`), the two pipe threads that talk to it,
its signs of life, and its checkpoint file: what both sides of `api.sample_handoff` share.

Signs of life: the worker sends `BEAT` every `BEAT_S` from a thread of its own, whatever its
main thread is doing; on Linux its CPU time (`/proc/<pid>/stat`) is read as well. A worker
whose process exists but that shows neither a message, a beat nor CPU progress for `STUCK_S`
is stuck: stopped (SIGSTOP, a debugger, a frozen container) or waiting on something that
does not come (swap). The CPU reading keeps a worker alive that holds the GIL in C code
for a while (importing torch on a loaded machine); the beat keeps one alive that waits for
work. Where `/proc` is missing, beats alone decide, with `START_TIMEOUT_S` before the first.

Why no Python thread or process pool: the worker is started as `python -m
wandb_modprof.api.sample_worker` on a socket pair, never with `multiprocessing`'s spawn,
which would run the user's script again.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from wandb_modprof.stats.quiet_gc import paused_gc

BEAT = b"\x00modprof-beat"  # never a pickle (one starts with b"\x80")
BEAT_S = 0.5
STUCK_S = 6.0  # no beat, message or CPU progress for this long: stuck
START_TIMEOUT_S = 120.0  # without /proc, before the first beat (importing torch when cold)
DEAD = b""  # what the receiver queues when the worker's end closed


class WorkerProcess:
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
        self.started = time.monotonic()
        self.last_seen: float | None = None  # a message or beat arrived (monotonic seconds)
        self._cpu: tuple[int, float] | None = None  # (ticks, when they last grew)
        self.last_cpu_s = 0.0  # its CPU seconds when last read (`cpu_s`)
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
                raw = self.conn.recv_bytes()
                self.last_seen = time.monotonic()
                if raw != BEAT:
                    self.inbox.put(raw)
        except (EOFError, OSError):
            self.inbox.put(DEAD)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: tuple[Any, ...]) -> None:
        with paused_gc():
            self.outbox.put(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def stuck(self) -> str | None:
        """Why the live worker counts as stuck (see the module docstring), or None."""
        now = time.monotonic()
        last = self.last_seen if self.last_seen is not None else self.started
        ticks = _cpu_ticks(self.pid)
        if ticks is not None:
            if self._cpu is None or ticks != self._cpu[0]:
                self._cpu = (ticks, now)
            last = max(last, self._cpu[1])
        elif self.last_seen is None:
            if now - self.started <= START_TIMEOUT_S:
                return None
            return f"it did not start within {START_TIMEOUT_S:.0f} s"
        if now - last <= STUCK_S:
            return None
        state = " (stopped)" if _stopped(self.pid) else ""
        return f"it showed no sign of life for {now - last:.0f} s{state}"

    def cpu_s(self) -> float:
        """The process's CPU seconds so far (0 where `/proc` is missing or it was reaped)."""
        ticks = _cpu_ticks(self.pid) if self.proc.returncode is None else None
        if ticks is not None:
            self.last_cpu_s = ticks / _TICKS_PER_S
        return self.last_cpu_s

    def ended(self) -> str:
        """How the process ended, in words."""
        code = self.proc.poll()
        if code is None:
            return "its connection closed"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def stop(self, wait_s: float) -> None:
        """Ask it to stop; killed after `wait_s` (a stuck one at once: `wait_s=0`)."""
        self.outbox.put(pickle.dumps(("stop",)))
        self.outbox.put(None)
        try:
            self.proc.wait(wait_s) if wait_s > 0 else self.proc.kill()
        except subprocess.TimeoutExpired:
            self.proc.kill()
        # SIGKILL ends a stopped process too; the wait reaps it (no zombie left behind)
        self.proc.wait()
        self.conn.close()


_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (None: no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def _cpu_ticks(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[11]) + int(fields[12]) if fields is not None and len(fields) > 12 else None


def _stopped(pid: int) -> bool:
    fields = _proc_stat(pid)
    return fields is not None and fields[0] in ("T", "t")


# ---- the checkpoint: the worker's statistics, saved after every batch of samples ------------
def write_checkpoint(path: str, count: int, state: Any) -> None:
    """`state` (the accumulator's saved state holding `count` samples) to `path`: written
    aside, then renamed, so never half written. The count comes first: `checkpoint_count`
    reads it without loading the statistics."""
    aside = f"{path}.part"
    with paused_gc(), open(aside, "wb") as file:
        pickle.dump(count, file, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.dump(state, file, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(aside, path)


def read_checkpoint(path: str) -> tuple[int, Any] | None:
    """(samples, saved state) from `path`, or None where there is none."""
    try:
        with paused_gc(), open(path, "rb") as file:
            return pickle.load(file), pickle.load(file)
    except FileNotFoundError:
        return None


def checkpoint_count(path: str) -> int:
    """The samples in the checkpoint at `path` (0: none)."""
    try:
        with open(path, "rb") as file:
            return int(pickle.load(file))
    except FileNotFoundError:
        return 0
