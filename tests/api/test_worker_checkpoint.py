"""When `watch`'s worker process saves its checkpoint (`api.sample_worker`): with each table, at
least every `CHECKPOINT_S`, never for a sample between tables before that time; what a save
holds is what a worker started after a crash continues from."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import wandb
from helpers import train_step
from models import TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof.api import sample_worker
from wandb_modprof.api.sample_message import index_message, sample_message
from wandb_modprof.api.worker_process import read_checkpoint
from wandb_modprof.stats.accumulator import ProfileAccumulator


def _messages() -> list[tuple[Any, ...]]:
    """The index and sample messages of 4 sampled steps of a TinyGPT, as they travel."""
    captured: list[tuple[Any, Any, Any]] = []

    class Keeping(ProfileAccumulator):
        def add(self, record, gradients, static):  # type: ignore[no-untyped-def]
            captured.append((record, gradients, static))

    model, x = TinyGPT(), gpt_input()
    handle = wandb_modprof.watch(
        model,
        log_freq=1,
        run=wandb.init(mode="disabled"),
        structure=False,
        settings=wandb_modprof.Settings(offload=False),
    )
    handle._acc.add = Keeping("TinyGPT").add  # type: ignore[method-assign]
    for _ in range(4):
        train_step(model, x)
        model.zero_grad(set_to_none=True)
    handle.unwatch()
    out: list[tuple[Any, ...]] = [index_message(captured[0][2])]
    for record, gradients, static in captured:
        message = sample_message(record, gradients, static)
        assert message is not None
        out.append(message)
    return [pickle.loads(pickle.dumps(m)) for m in out]


def _log(worker: sample_worker.Worker, serial: int, table_due: bool) -> tuple[Any, ...] | None:
    return sample_worker.handle(
        worker, ("log", serial, False, False, False, None, table_due), skip=False
    )


def test_a_sample_between_tables_is_saved_only_when_its_time_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, *samples = _messages()
    path = str(tmp_path / "worker.ckpt")
    worker = sample_worker.Worker(path)
    sample_worker.handle(worker, ("start", "TinyGPT", 10_000, "", "fwd", "linear"), skip=False)
    sample_worker.handle(worker, index, skip=False)
    saved = []
    for serial, message in enumerate(samples):
        sample_worker.handle(worker, message, skip=False)
        if serial == 3:
            monkeypatch.setattr(sample_worker, "CHECKPOINT_S", 0.0)  # its time has come
        reply = _log(worker, serial, table_due=serial == 1)
        assert reply is not None and reply[0] == "logged" and reply[2] == serial + 1
        saved.append(reply[-1])  # the samples its checkpoint holds, as the reply says
    # the 1st: the first save; the 2nd: with its table; the 3rd: neither; the 4th: time
    assert saved == [1, 2, 2, 4]
    on_disk = read_checkpoint(path)
    assert on_disk is not None and on_disk[0] == 4
    restored = ProfileAccumulator("TinyGPT")
    restored.restore_state(on_disk[1])
    assert restored.snapshot().stats == worker.snapshot().stats
