"""The life of `watch`'s worker process, seen from the training process: started at the first
hand-off, replaced when it ended or is stuck, given up after `MAX_RESTARTS` (the samples are
then resolved in-process, from its checkpoint), and what each of those cost in samples.

`SampleHandoff` (`api.sample_handoff`) holds one `WorkerSupervisor`: the hand-off builds the
messages, hands them over and asks for the tables; the supervisor owns the worker process,
decides when it is gone and keeps the counts honest. It knows nothing of the hand-off, which
follows its answers: `ensure` and `replace` give the worker, or None once it gave up (the
checkpoint is then in the accumulator); `retired` counts the workers that ended, each taking
along what it was told. A sample handed to a worker is in the profile once a checkpoint holds
it; a worker that ends before that loses it, and `lost` counts it (the checkpoint file says how
many it holds, `worker_process.checkpoint_count`). A worker is gone when its process ended,
when it is stuck (`WorkerProcess.stuck`), or when it does not answer within `ANSWER_TIMEOUT_S`
while still showing signs of life. Each kind of warning is given once; `end` says the total
lost when it grew after the first warning.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from typing import Any

from wandb_modprof._warn import warn_safely
from wandb_modprof.api.worker_process import WorkerProcess, checkpoint_count, read_checkpoint
from wandb_modprof.stats.accumulator import ProfileAccumulator

MAX_RESTARTS = 2
# The longest wait for one answer of a worker that keeps showing signs of life: the final
# log of a model with 100,000 calls takes about 10 s; past this the worker counts as hung.
ANSWER_TIMEOUT_S = 120.0
WAIT_SLICE_S = 0.25  # how often a wait looks at the worker's signs of life


def _shutdown(worker: WorkerProcess | None, folder: str, owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        return  # a forked child's exit: the worker and its folder are its parent's
    if worker is not None and worker.proc.poll() is None:
        worker.stop(wait_s=5.0)
    shutil.rmtree(folder, ignore_errors=True)


class WorkerSupervisor:
    """One watched model's worker process over a run (see the module docstring)."""

    def __init__(self, key: str, start: tuple[Any, ...]) -> None:
        self.key = key
        self._start = start  # ("start", model, max_rows, full_detail, mode, scale, target)
        self._worker: WorkerProcess | None = None
        self._folder = ""
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._restarts = 0
        self._retired = 0  # workers killed or found ended (what they were told is gone)
        self._shipped = 0  # samples handed over (and in the checkpoint a new worker reads)
        self.lost = 0  # samples handed to a worker that ended before it saved them
        self._ended_cpu_s = 0.0  # the CPU seconds of the workers that ended
        self._lost_told = 0  # the lost samples a warning named
        self._told: set[str] = set()  # the kinds of warning given (each once)

    @property
    def worker(self) -> WorkerProcess | None:
        """The worker process now (None: not started yet, given up, or forked away from)."""
        return self._worker

    @property
    def folder(self) -> str:
        """The folder of the workers' checkpoint and log ("" before the first start)."""
        return self._folder

    @property
    def restarts(self) -> int:
        """Workers started in place of one that ended (at most `MAX_RESTARTS`)."""
        return self._restarts

    @property
    def retired(self) -> int:
        """Workers killed or found ended so far: each took along what it was told."""
        return self._retired

    @property
    def shipped(self) -> int:
        """Samples a worker holds: in its checkpoint, or handed over since (`hand`)."""
        return self._shipped

    def hand(self, message: tuple[Any, ...]) -> None:
        """Send one sample to the worker; it counts as lost if the worker ends before its
        checkpoint holds it."""
        assert self._worker is not None
        self._worker.send(message)
        self._shipped += 1

    def cpu_s(self) -> float:
        """The CPU seconds of every worker of this run so far (`api.overhead`)."""
        worker = self._worker
        return self._ended_cpu_s + (worker.cpu_s() if worker is not None else 0.0)

    def end(self, kept: int) -> None:
        """Stop the worker (the run's profile holds `kept` samples); say once more how many
        samples were lost where more were than the first warning named."""
        if self._worker is not None:
            self._worker.cpu_s()  # (read before it is reaped)
        if self._finalizer is not None:
            self._finalizer()
        if self.lost > self._lost_told:
            warn_safely(
                f"wandb_modprof: in all, {self.lost} sample(s) of {self.key} were lost when its "
                f"worker process ended ({self._restarts} restart(s)); the profile holds "
                f"{kept}. Training is not affected.",
                RuntimeWarning,
            )
            self._lost_told = self.lost

    def forked(self) -> None:
        """In a child forked from this process: forget the worker without touching it (its
        process, pipes and folder are the parent's)."""
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = None
        self._worker = None

    def ensure(self, acc: ProfileAccumulator) -> WorkerProcess | None:
        """The live worker: started at the first call, replaced when it ended (`replace`);
        None where the supervisor gave up (`acc` then holds the checkpoint's samples)."""
        if self._worker is not None and self._worker.alive():
            return self._worker
        if self._worker is not None:
            return self.replace(acc, self._worker.ended())
        try:
            self._folder = tempfile.mkdtemp(prefix="modprof-worker-")
            self._worker = WorkerProcess(self._checkpoint, self._log_path)
        except Exception as error:
            self._fall_back(acc, f"could not start it ({type(error).__name__}: {error})")
            return None
        self._finalizer = weakref.finalize(self, _shutdown, self._worker, self._folder, os.getpid())
        self._worker.send(self._start)
        return self._worker

    @property
    def _checkpoint(self) -> str:
        return os.path.join(self._folder, "state.pickle")

    @property
    def _log_path(self) -> str:
        return os.path.join(self._folder, "worker.log")

    @staticmethod
    def gone_why(worker: WorkerProcess, deadline: float | None) -> str | None:
        """Why `worker` is to be replaced now (ended, stuck, or past `deadline`), or None."""
        if not worker.alive():
            return worker.ended()
        stuck = worker.stuck()
        if stuck is not None:
            return stuck
        if deadline is not None and time.monotonic() > deadline:
            return f"it did not answer within {ANSWER_TIMEOUT_S:.0f} s"
        return None

    def replace(self, acc: ProfileAccumulator, why: str) -> WorkerProcess | None:
        """The worker is gone (or stuck: killed): its lost samples counted and said; a new
        worker from the checkpoint, or (after `MAX_RESTARTS`: None) the checkpoint resolved
        in-process from now on."""
        lost = self._retire()
        self._warn_lost(f"ended ({why})", lost)
        if self._restarts >= MAX_RESTARTS:
            self._fall_back(acc, f"its worker process ended {self._restarts + 1} times")
            return None
        self._restarts += 1
        try:
            self._worker = WorkerProcess(self._checkpoint, self._log_path)
        except Exception as error:
            self._fall_back(acc, f"could not restart it ({type(error).__name__}: {error})")
            return None
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shutdown, self._worker, self._folder, os.getpid())
        self._worker.send(self._start)
        return self._worker

    def _retire(self) -> int:
        """Kill the worker (a live one is stuck or abandoned); the samples handed to it and
        not in its checkpoint are lost: counted, and returned."""
        old = self._worker
        if old is not None:
            self._ended_cpu_s += old.cpu_s()  # (read before it is reaped)
            old.stop(wait_s=0.0 if old.alive() else 1.0)
        saved = checkpoint_count(self._checkpoint) if self._folder else 0
        lost = max(0, self._shipped - saved)
        self.lost += lost
        self._worker = None
        self._retired += 1
        self._shipped = saved
        return lost

    def abandon(self, acc: ProfileAccumulator) -> None:
        """Ctrl-C while `unwatch()` waits: the worker killed, its checkpoint kept in `acc`."""
        lost = self._retire()
        what = "was stopped: unwatch() was interrupted (KeyboardInterrupt)"
        self._warn_lost(what, lost, kind="interrupted")
        self._fall_back(acc, "", quiet=True)

    def _warn_lost(self, what: str, lost: int, kind: str = "lost") -> None:
        if kind in self._told:
            return
        self._told.add(kind)
        self._lost_told = self.lost
        warn_safely(
            f"wandb_modprof: the worker process building {self.key}'s tables {what}; {lost} "
            "sample(s) handed to it since its last checkpoint are lost, the others are kept "
            "(the count of lost samples is in the summary). Training is not affected.",
            RuntimeWarning,
        )

    def _fall_back(self, acc: ProfileAccumulator, why: str, quiet: bool = False) -> None:
        """Give up on workers: `acc` resolves in-process from now on, from the worker's
        checkpoint if there is one (the caller takes it back from its remote)."""
        if not quiet:
            self.tell_once("fall back", f"samples of {self.key} are resolved on the training "
                           f"thread from now on: {why}")  # fmt: skip
        saved = read_checkpoint(self._checkpoint) if self._folder else None
        if saved is not None:
            acc.restore_state(saved[1])
        if self._worker is not None:
            self._ended_cpu_s += self._worker.cpu_s()
        if self._finalizer is not None:
            self._finalizer()
        self._worker = None

    def tell_once(self, kind: str, text: str) -> None:
        """A warning about this run's workers, given once per `kind`."""
        if kind in self._told:
            return
        self._told.add(kind)
        warn_safely(f"wandb_modprof: {text}. Training is not affected.", RuntimeWarning)
