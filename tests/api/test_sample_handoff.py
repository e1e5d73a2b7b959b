"""`watch`'s worker process (`api.sample_handoff`, `api.sample_worker`): what it logs equals
what the training process would have, a dead worker costs only the samples since its last
checkpoint, and `run.finish()` waits for it."""

from __future__ import annotations

import copy
import os
import signal
import time
from pathlib import Path

import pytest
import torch
import wandb
from helpers import check_logged_tables, strict_json, train_step
from models import TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof._errors import ModProfError
from wandb_modprof.api import sample_worker
from wandb_modprof.api.sample_message import index_message, sample_message
from wandb_modprof.api.worker_supervision import ANSWER_TIMEOUT_S
from wandb_modprof.capture.backward import checkpoint_cost
from wandb_modprof.records.phases import PHASES
from wandb_modprof.sinks.wandb.packed import unpacked
from wandb_modprof.stats.accumulator import ProfileAccumulator


def _table_files(root: Path, model: str) -> list[Path]:
    (run_dir,) = (root / "wandb").glob("offline-run-*")
    return sorted((run_dir / "files" / "media" / "table" / "modprof").glob(f"{model}_table_*"))


def _offline_run(tmp_path: Path) -> wandb.Run:
    return wandb.init(mode="offline", project="modprof-test", dir=str(tmp_path), entity="me")


def test_a_session_resolves_in_the_worker_to_the_same_profile():
    """The plain-data record of a session and its per-parameter readings (optimizer bytes,
    gradient bytes and norms), pickled as they travel with the model index's tables sent once,
    resolve and fold in the worker to the statistics and last sample the training process
    computes itself."""
    captured = []

    class Keeping(ProfileAccumulator):
        def add(self, record, gradients, static):  # type: ignore[no-untyped-def]
            captured.append((record, gradients, static))
            super().add(record, gradients, static)

    model, x = TinyGPT(), gpt_input()
    optimizer = torch.optim.Adam(model.parameters())
    acc = Keeping("TinyGPT")
    handle = wandb_modprof.watch(
        model,
        log_freq=1,
        run=wandb.init(mode="disabled"),
        structure=False,
        settings=wandb_modprof.Settings(offload=False),
        optimizer=optimizer,
    )
    handle._acc.add = acc.add  # type: ignore[method-assign]
    for _ in range(3):
        train_step(model, x)
        optimizer.step()
        model.zero_grad(set_to_none=True)
    handle.unwatch()
    assert len(captured) == 3
    worker = sample_worker.Worker("/nonexistent/checkpoint")
    sample_worker.handle(worker, ("start", "TinyGPT", 10_000, "", "fwd", "linear"), skip=False)
    indexes = set()
    for record, gradients, static in captured:
        if id(static.static) not in indexes:
            indexes.add(id(static.static))
            sample_worker.handle(worker, _travelled(index_message(static)), skip=False)
        message = sample_message(record, gradients, static)
        assert message is not None and message[0] == "reading"
        sample_worker.handle(worker, _travelled(message), skip=False)
    assert len(indexes) == 1  # the model did not change: its tables went once
    acc.resolve_pending(force=True)
    mine, theirs = acc.snapshot(), worker.snapshot()
    assert theirs.num_samples == mine.num_samples == 3
    assert theirs.stats == mine.stats
    assert theirs.last == mine.last
    optim = [r.optim_bytes for r in theirs.last.invocations if r.module_name == "<root>"]
    assert optim == [2 * sum(p.nbytes for p in model.parameters())]  # Adam: two moments
    assert all(r.grad_norm is not None for r in theirs.last.invocations if r.param_bytes)


def test_every_sample_logs_its_scalars_through_the_worker() -> None:
    """With the worker a step or more behind, every sample's step totals still reach the run
    (the trend is per sample): the answers to outdated requests carry their sample's scalars,
    and they are logged one a step, in order."""
    model, x = TinyGPT(), gpt_input()
    run = wandb.init(mode="disabled")
    logged: list[dict[str, object]] = []
    log = run.log

    def spy(data: dict[str, object], *args: object, **kwargs: object) -> object:
        if kwargs.get("commit") is False and "modprof/TinyGPT/samples" in data:
            logged.append(data)
        return log(data, *args, **kwargs)

    run.log = spy
    handle = wandb_modprof.watch(
        model, log_freq=1, run=run, settings=wandb_modprof.Settings(offload=True)
    )
    steps = 12
    for _ in range(steps):
        train_step(model, x)
    handoff = handle._handoff
    assert handoff is not None and handoff.decided is True
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (handoff._outstanding is not None or handoff._answers):
        time.sleep(0.05)
        handle._log_samples()  # what the next steps' root forwards do
    counts = [int(entry["modprof/TinyGPT/samples"]) for entry in logged]  # type: ignore[call-overload]
    handle.unwatch()
    samples = handle.profile().num_samples
    assert counts == sorted(set(counts))  # in order, each once
    # every sample but the ones the final log supersedes (none once the worker caught up)
    assert len(counts) >= samples - 1, (counts, samples)
    assert all(entry["modprof/TinyGPT/fwd_ms"] for entry in logged)


def _travelled(message: tuple[object, ...]) -> tuple[object, ...]:
    return sample_worker.pickle.loads(sample_worker.pickle.dumps(message))  # type: ignore[no-any-return]


def test_the_worker_logs_every_sample_and_the_final_profile(tmp_path):
    """offload=True on an offline run: each sample is logged (a step or two later), the
    final table is the returned profile's, the report and the artifact are logged, no
    calibration was taken for the tables' plan (it says it is not priced), and training is
    bitwise identical to an unwatched twin."""
    checkpoint_cost.checkpoint_call_ms.cache_clear()
    model, x = TinyGPT(), gpt_input()
    twin = copy.deepcopy(model)
    run = _offline_run(tmp_path)
    handle = wandb_modprof.watch(
        model, log_freq=2, run=run, settings=wandb_modprof.Settings(offload=True)
    )
    opt, opt_twin = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    for _ in range(9):  # 1: structure pass; 2, 4, 6, 8 sampled
        assert torch.equal(train_step(model, x), train_step(twin, x))
        opt.step(), opt_twin.step()
        opt.zero_grad(), opt_twin.zero_grad()
        run.log({"loss": 1.0})
        time.sleep(0.05)
    assert handle._handoff is not None and handle._handoff.decided is True
    worker = handle._handoff.supervisor.worker
    assert worker is not None and worker.alive()
    prof = handle.unwatch()
    assert worker.proc.poll() is not None  # stopped
    assert checkpoint_cost.checkpoint_call_ms.cache_info().currsize == 0  # none here
    artifact = handle._wandb_log.artifact if handle._wandb_log else None
    run.finish()
    assert prof.num_samples == 4
    files = _table_files(tmp_path, "TinyGPT")
    assert 1 <= len(files) <= 4  # tables of samples that arrived together are logged once
    table = prof.table()
    check_logged_tables(files, table.columns)
    last = strict_json(files[-1].read_text())
    assert len(last["data"]) == len(table.rows)
    # the structure pass's graph came again once its backward was counted: the worker has it
    columns, rows = unpacked(last["columns"], last["data"])
    logged = sorted(r[columns.index("bwd_bytes")] for r in rows if r[columns.index("bwd_bytes")])
    mine = table.columns.index("bwd_bytes")
    assert logged == sorted(r[mine] for r in table.rows if r[mine]) and len(logged) > 10
    (plan,) = [
        r[columns.index("meta_value")]
        for r in rows
        if r[columns.index("row_kind")] == "meta" and r[columns.index("meta_key")] == "ckpt_plan"
    ]
    assert plan.split("\n")[2].endswith(", checkpointing not priced"), plan
    assert artifact is not None and artifact.type == "modprof-profile"
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    (report,) = (run_dir / "files/media/html/modprof/TinyGPT").glob("report_*.html")
    assert "TinyGPT" in report.read_text()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_killed_worker_loses_only_the_samples_since_its_checkpoint(tmp_path):
    model, x = TinyGPT(), gpt_input()
    run = wandb.init(mode="disabled")
    handle = wandb_modprof.watch(
        model, log_freq=1, run=run, structure=False, settings=wandb_modprof.Settings(offload=True)
    )
    for _ in range(3):
        train_step(model, x)
    assert handle.profile().num_samples == 3  # waits: the worker has saved 3 samples
    handoff = handle._handoff
    assert handoff is not None and handoff.supervisor.worker is not None
    first = handoff.supervisor.worker.proc
    train_step(model, x)  # sample 4: handed over at the next forward
    train_step(model, x)  # sample 5
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    with pytest.warns(RuntimeWarning, match=r"ended \(killed by SIGKILL\); \d+ sample") as caught:
        for _ in range(3):
            train_step(model, x)
        prof = handle.unwatch()
    assert len([w for w in caught if "wandb_modprof" in str(w.message)]) == 1
    assert handoff.supervisor.worker is None or handoff.supervisor.worker.proc is not first
    # samples 1-3 were saved; 4 and 5 were handed over or still pending when it died: each
    # either kept or counted lost, and the warning named the count
    overhead = handle.overhead
    assert overhead.samples == 8 and prof.num_samples + overhead.lost == 8
    assert f"; {overhead.lost} sample(s) handed" in str(caught[0].message)
    assert 6 <= prof.num_samples <= 8


def test_run_finish_waits_for_the_worker_and_unwatches(tmp_path):
    model, x = TinyGPT(), gpt_input()
    run = _offline_run(tmp_path)
    handle = wandb_modprof.watch(
        model, log_freq=1, run=run, structure=False, settings=wandb_modprof.Settings(offload=True)
    )
    for _ in range(3):
        train_step(model, x)
    run.finish()  # no unwatch(): the run's teardown unwatches first
    assert not handle.active
    assert handle.profile().num_samples == 3
    assert _table_files(tmp_path, "TinyGPT")


def test_auto_keeps_a_small_model_in_process():
    model, x = TinyGPT(), gpt_input()
    handle = wandb_modprof.watch(model, log_freq=1, run=wandb.init(mode="disabled"))
    for _ in range(3):
        train_step(model, x)
    handoff = handle._handoff
    assert handoff is not None and handoff.decided is False and handoff.supervisor.worker is None
    assert handle.unwatch().num_samples == 2  # step 1 is the structure pass


@pytest.mark.parametrize("offload", ["yes", 1, None, "process"])
def test_offload_must_be_auto_true_or_false(offload):
    with pytest.raises(ModProfError, match=r"offload expected 'auto', True or False; got"):
        wandb_modprof.watch(
            TinyGPT(),
            run=wandb.init(mode="disabled"),
            settings=wandb_modprof.Settings(offload=offload),
        )


def test_the_worker_logs_the_rows_into_the_users_next_row(tmp_path):
    """Attached to the offline run, the worker logs every table and the report itself: the
    training process logs only each sample's scalars (`sinks.wandb.table_schedule`), a sample's
    row joins one of the user's own rows (the run's steps are the user's logs), and the table
    files are in the run, one per scheduled sample."""
    from wandb_history import history

    model, x = TinyGPT(), gpt_input()
    run = _offline_run(tmp_path)
    ours = []
    user_log = run.log

    def log(data, *args, **kwargs):  # what the training process logs
        ours.extend(k for k in data if k.startswith("modprof/"))
        return user_log(data, *args, **kwargs)

    run.log = log
    handle = wandb_modprof.watch(
        model, log_freq=2, run=run, settings=wandb_modprof.Settings(offload=True)
    )
    assert handle._wandb_log is not None
    steps = 0
    # until a sample was logged during training: the worker starts (imports torch and W&B, at
    # nice 10: 1-2 s on a quiet machine, tens of s on a loaded one) and answers; a worker that
    # shows signs of life has ANSWER_TIMEOUT_S to answer
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while steps < 10 or (handle._wandb_log.logged_samples == 0 and time.monotonic() < deadline):
        train_step(model, x)
        run.log({"loss": float(steps)})
        steps += 1
        time.sleep(0.05)
    assert handle._wandb_log.logged_samples > 0, f"no sample logged during {steps} steps"
    assert handle._handoff is not None and handle._handoff.decided is True
    prof = handle.unwatch()
    run.finish()
    scalars = {f"modprof/TinyGPT/{k}" for k in ("fwd_ms", "bwd_ms", "act_bytes", "samples")}
    scalars |= {f"modprof/TinyGPT/phase/{p}_ms" for p in PHASES}  # the sample's step phases
    assert set(ours) <= scalars | {"modprof/TinyGPT/overhead_pct"}, ours
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    wandb.teardown()  # the service writes the run's log out when it ends
    rows = history(run_dir)
    # The user's logs are steps 0, 1, ... as unwatched; what unwatch() logs after the last of
    # them joins the row that run.finish() commits (as when the training thread logs).
    assert [row.get("loss") for row in rows[:steps]] == [float(s) for s in range(steps)]
    assert [row["_step"] for row in rows] == list(range(len(rows))) and len(rows) <= steps + 1
    assert all(k.startswith(("modprof/", "_")) for row in rows[steps:] for k in row)
    logged = [row for row in rows if "modprof/TinyGPT/fwd_ms" in row]
    assert 2 <= len(logged) <= prof.num_samples
    assert any("loss" in row for row in logged)  # joined a row of the user's
    tables = [r for r in rows if any(k.startswith("modprof/TinyGPT_table/") for k in r)]
    # the 1st, 2nd, 4th, ... sample's table, and the last at unwatch() (two logged between the
    # same two rows of the user's join one row)
    assert 1 <= len(tables) <= handle._wandb_log.schedule.tables
    assert len([row for row in rows if "modprof/TinyGPT/report/path" in row]) == 1
    check_logged_tables(_table_files(tmp_path, "TinyGPT"), prof.table().columns)


def test_without_a_service_to_attach_to_the_training_thread_logs_and_says_so(tmp_path, monkeypatch):
    model, x = TinyGPT(), gpt_input()
    run = _offline_run(tmp_path)
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    handle = wandb_modprof.watch(
        model, log_freq=1, run=run, structure=False, settings=wandb_modprof.Settings(offload=True)
    )
    with pytest.warns(RuntimeWarning, match="cannot log .* itself .*no W&B service") as caught:
        for _ in range(3):
            train_step(model, x)
        prof = handle.unwatch()
    assert len([w for w in caught if "W&B run itself" in str(w.message)]) == 1
    run.finish()
    assert prof.num_samples == 3
    check_logged_tables(_table_files(tmp_path, "TinyGPT"), prof.table().columns)
