"""The table goes to W&B on a schedule (`sinks.wandb.table_schedule`); every sample still logs
its scalars. The bound the docs state holds; the last table logged is the profile at
`unwatch()` (W&B's custom chart reads the newest table logged under the key); an offline run
of many samples holds the scheduled tables' files only."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest
import wandb
from helpers import RecordingRun, train_step
from models import TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof._errors import ModProfError
from wandb_modprof.sinks.wandb import packed
from wandb_modprof.sinks.wandb.table_schedule import TableSchedule


def test_the_table_doubles_its_gap_and_the_interval_caps_the_wait() -> None:
    s = TableSchedule(None)
    assert [n for n in range(1, 200) if s.take(n, now=0.0)] == [1, 2, 4, 8, 16, 32, 64, 128]
    timed = TableSchedule(10.0)
    taken = [n for n in range(1, 200) if timed.take(n, now=float(n))]  # a sample a second
    assert taken[:4] == [1, 2, 4, 8]
    assert all(b - a <= 10 for a, b in itertools.pairwise(taken))  # never > 10 s apart
    assert not timed.behind(taken[-1]) and timed.behind(taken[-1] + 1)


@pytest.mark.parametrize("interval", [None, 5.0, 60.0])
def test_no_run_logs_more_tables_than_the_stated_bound(interval: float | None) -> None:
    picks = random.Random(str(interval))
    for _ in range(50):
        s = TableSchedule(interval)
        count, now = 0, 0.0
        for _ in range(picks.randrange(1, 3000)):
            count += picks.choice((1, 1, 1, 2, 5))  # (answers that hold several samples)
            now += picks.expovariate(1.0)
            s.take(count, now)
        s.logged(count + 1, now)  # the final table
        assert s.tables <= TableSchedule.bound(count + 1, now, interval)
    # the docs' figures: a week-long run of 10,000 samples, and no interval at all
    assert TableSchedule.bound(10_000, 7 * 86400, 3600.0) == 2 + 13 + 168
    assert TableSchedule.bound(10_000, 7 * 86400, None) == 2 + 13
    assert TableSchedule.bound(10_000, 7 * 86400, None) == 1 + 1 + math.floor(math.log2(10_000))


def _tables(run: object, key: str) -> list[tuple[int, object]]:
    """(samples so far, table) of every log that carried the table, in order."""
    out = []
    samples = 0
    for data, _commit, _in_engine in run.calls:  # type: ignore[attr-defined]
        samples = data.get(f"{key}/samples", samples)
        if key in data or f"{key}_table" in data:
            out.append((samples, data.get(key, data.get(f"{key}_table"))))
    return out


def test_every_sample_logs_its_scalars_and_the_scheduled_ones_the_table() -> None:
    run = RecordingRun()
    model, x = TinyGPT(), gpt_input()
    handle = wandb_modprof.watch(model, log_freq=1, run=run, table_interval=None)
    for _ in range(21):  # step 1: the structure pass, then 20 samples
        train_step(model, x)
    prof = handle.unwatch()
    key = handle.key
    scalars = [d[f"{key}/samples"] for d, _, _ in run.calls if f"{key}/samples" in d]
    assert scalars == list(range(1, prof.num_samples + 1))  # every sample, in order
    assert all(f"{key}/fwd_ms" in d for d, _, _ in run.calls if f"{key}/samples" in d)
    tables = _tables(run, key)
    at = [n for n, _ in tables]
    # the 1st, 2nd, 4th, 8th and 16th sample's tables, then the last one at unwatch()
    assert at == [1, 2, 4, 8, 16, prof.num_samples], at
    assert handle._wandb_log.schedule.tables == len(tables)


def test_the_last_table_logged_is_the_profile_at_unwatch() -> None:
    """W&B's panel reads `summaryTable`, the newest table logged under the key: that one
    equals the final profile's table (the disabled run's summary holds the last object)."""
    run = wandb.init(mode="disabled")
    recording = RecordingRun(inner=run)
    model, x = TinyGPT(), gpt_input()
    handle = wandb_modprof.watch(model, log_freq=1, run=recording, table_interval=None)
    for _ in range(7):  # 6 samples: tables at 1, 2, 4, then the last at unwatch (6)
        train_step(model, x)
    prof = handle.unwatch()
    key = handle.key
    (n, last), *_ = reversed(_tables(recording, key))
    assert n == prof.num_samples == 6
    cells = getattr(last, "table", last)  # (plot_table wraps the wandb.Table)
    table = prof.table()
    columns, rows = packed.logged(table.columns, table.rows)
    assert cells.columns == columns
    assert cells.data == rows


def test_bad_table_intervals_are_refused() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1h"):
        with pytest.raises(ModProfError, match="table_interval must be None"):
            wandb_modprof.watch(TinyGPT(), run=RecordingRun(), table_interval=bad)


def test_an_offline_run_of_many_samples_holds_only_the_scheduled_tables(tmp_path: Path) -> None:
    run = wandb.init(mode="offline", project="modprof-test", dir=str(tmp_path), entity="me")
    model, x = TinyGPT(layers=1), gpt_input(batch=1, t=8)
    handle = wandb_modprof.watch(
        model, log_freq=1, run=run, settings=wandb_modprof.Settings(offload=False)
    )
    for step in range(101):  # 100 samples
        train_step(model, x)
        run.log({"loss": float(step)})
    prof = handle.unwatch()
    run.finish()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    files = sorted((run_dir / "files" / "media" / "table" / "modprof").glob("TinyGPT_table_*"))
    # 1, 2, 4, ..., 64, then the last (the default interval, an hour, never passes here)
    assert prof.num_samples == 100
    assert len(files) == 8, [f.name for f in files]
