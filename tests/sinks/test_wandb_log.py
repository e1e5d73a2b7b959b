"""`watch` logs every sample to W&B: the panel (a custom chart over the profile table) and the
step totals, with `commit=False`, outside the autograd engine. Real W&B SDK, offline or
disabled runs (the hermetic environment of conftest.py)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import wandb
from conftest import requires_cuda
from helpers import (
    RecordingRun,
    check_logged_tables,
    disabled_run,
    logged_cells,
    profiled,
    run_double,
    strict_json,
    train_step,
)
from models import ResNet, TinyGPT, gpt_input, resnet_input

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.records.modes import MODE_KEYS
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.wandb import packed as _packed
from wandb_modprof.sinks.wandb import wandb_log as _wandb_log
from wandb_modprof.sinks.wandb import wandb_names as _wandb_names
from wandb_modprof.sinks.wandb import wandb_table as wandb_table_module

CHART = f"me/{_spec.CHART_NAME}"


@pytest.fixture(autouse=True)
def _fresh_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_wandb_names, "_NOTICES", set())  # the offline notice is once per process


def _table_files(root: Path, model: str) -> list[Path]:
    (run_dir,) = (root / "wandb").glob("offline-run-*")
    return sorted((run_dir / "files" / "media" / "table" / "modprof").glob(f"{model}_table_*"))


def _step_of(path: Path) -> int:
    match = re.search(r"_table_(\d+)_[0-9a-f]+\.table\.json$", path.name)
    assert match, path.name
    return int(match.group(1))


# ---- the end-to-end path: an offline run, files on disk ---------------------------------------
# W&B reads WANDB_* variables once per process (`wandb.setup`), so runs get their entity from
# `wandb.init(entity=...)` here; the WANDB_ENTITY fallback is tested with a run stand-in.
def test_offline_run_writes_one_table_per_sample(tmp_path):
    model = TinyGPT()
    x = gpt_input()
    run = wandb.init(mode="offline", project="modprof-test", dir=str(tmp_path), entity="me")
    with pytest.warns(UserWarning, match="is offline") as offline_notice:
        handle = wandb_modprof.watch(model, log_freq=2, run=run)
    assert handle.key == "modprof/TinyGPT" and handle.chart == CHART
    assert len(offline_notice) == 1
    for step in range(6):  # 1: structure pass; 2, 4, 6 sampled
        loss = train_step(model, x)
        run.log({"loss": float(loss)})
        assert run.step == step + 1  # modprof's logs never advance the user's step
    prof = handle.unwatch()  # logs the sample of step 6
    run.finish()

    assert prof.num_samples == 3
    files = _table_files(tmp_path, "TinyGPT")
    # logged at the forwards of steps 3 and 5 (run.step 2, 4) and at unwatch (run.step 6)
    assert sorted(_step_of(f) for f in files) == [2, 4, 6]
    table = prof.table()
    last = strict_json(max(files, key=_step_of).read_text())
    columns, rows = logged_cells(table.columns, table.rows)
    assert last["columns"] == columns
    assert len(last["data"]) == len(table.rows) <= 10_000
    assert last["data"] == rows  # the aggregated profile
    kinds = {row[last["columns"].index("row_kind")] for row in last["data"]}
    assert {"node", "edge", "meta"} <= kinds
    check_logged_tables(files, table.columns)


def test_the_profile_file_artifact_round_trips_through_an_offline_run(tmp_path):
    """At unwatch() the full profile is logged as a `modprof-profile` artifact: the file W&B
    stages for upload loads back to the profile, and a reduced table's note names it."""
    model = TinyGPT()
    x = gpt_input()
    run = wandb.init(mode="offline", project="modprof-test", dir=str(tmp_path), entity="me")
    with pytest.warns(UserWarning, match="is offline"):
        handle = wandb_modprof.watch(model, log_freq=2, run=run)
    for _ in range(4):
        train_step(model, x)
    log = handle._wandb_log
    assert log is not None and log.artifact is None  # not before unwatch by default
    prof = handle.unwatch()
    artifact = log.artifact
    run.finish()
    assert artifact is not None and artifact.type == "modprof-profile"
    assert artifact.name.startswith(f"modprof-{run.id}-TinyGPT")
    entry = artifact.manifest.entries[_wandb_names.PROFILE_FILE]
    staged = Path(entry.local_path)
    assert staged.is_file()
    loaded = wandb_modprof.load(staged)
    assert loaded.to_dict() == prof.to_dict() and loaded.num_samples == prof.num_samples == 2
    prof.save(tmp_path / "direct.modprof.json")
    assert staged.read_bytes() == (tmp_path / "direct.modprof.json").read_bytes()
    # a reduced table says where the full profile is
    table = _wandb_log.build_table_for(log, prof.snapshot(), max_rows=100)
    assert (
        f"statistics are in the saved profile. The full profile is "
        f"logged to this run as the W&B artifact {_wandb_names.artifact_name(run, handle.key)} "
        "(type modprof-profile) at unwatch()." in table.reduced
    )


def test_artifact_freq_logs_every_nth_logged_sample_and_none_can_turn_it_off():
    logged = []
    for freq in (2, None):
        run = RecordingRun()
        model = TinyGPT()
        x = gpt_input()
        handle = wandb_modprof.watch(model, log_freq=1, run=run, artifact_freq=freq)
        for _ in range(6):  # step 1: the structure pass; 2..6 sampled, logged at 3..6, unwatch
            train_step(model, x)
        handle.unwatch()
        logged.append([a.metadata["samples"] for a in run.artifacts])
    assert logged == [[2, 4, 5], []]
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ModProfError, match="artifact_freq must be None"):
            wandb_modprof.watch(TinyGPT(), run=RecordingRun(), artifact_freq=bad)


def test_wandb_infers_the_declared_column_types():
    """The W&B table is built column by column (`Table.add_column`): W&B's reading of each
    column's type is the one `view.columns` declares (the packed cell is text), and the cells
    are `packed.logged`'s."""
    prof = profiled(TinyGPT(), gpt_input())
    table = prof.table()
    cells = _wandb_log.wandb_table(table)
    columns, rows = _packed.logged(table.columns, table.rows)
    expected = wandb.Table(
        columns=columns, data=rows, dtype=wandb_table_module.column_types(columns), optional=False
    )
    assert cells.columns == columns == [*_packed.UNPACKED, _packed.PACKED]
    assert cells.data == expected.data == rows
    assert cells._column_types == expected._column_types


def test_the_wandb_table_holds_the_columns_the_panel_reads():
    """Only columns the spec names (the rest cost W&B per-cell work and draw nothing), packed
    in one cell per row but the three an older panel reads; every column left out is named
    nowhere in the spec, and the ones the panel needs are in."""
    prof = profiled(TinyGPT(), gpt_input())
    table = prof.table()
    numbers, texts = _packed.packed_columns()
    text = _spec.spec_text()
    read = _spec.read_columns(tuple(table.columns))
    assert sorted(read) == sorted([*_packed.UNPACKED, *numbers, *texts])
    left_out = [c for c in table.columns if c not in read]
    assert len(left_out) >= 20, left_out
    for name in left_out:
        assert not re.search(rf"\b{name}\b", text), name
    for name in ("fwd_ms", "bwd_ms", "fwd_ms_mean", "x_px", "has_view", "view_id"):
        assert name in numbers
    for name in ("view_key", "missing", "label", "group_members", "edge_path"):
        assert name in texts
    cells = _wandb_log.wandb_table(table)
    assert len(cells.columns) * len(cells.data) == 7 * len(table.rows)  # 57 a row before


def test_the_packed_cell_gives_back_every_cell_exactly():
    """`packed.unpacked` (what the spec's first transforms do) returns the read columns of the
    table cell for cell: floats by `repr` (exact), ints, bools, texts; and a column the table
    lacks (a file of an older version) as an empty field, None."""
    prof = profiled(ResNet(), resnet_input())
    table = prof.table()
    read = list(_spec.read_columns(tuple(table.columns)))
    columns, rows = _packed.unpacked(*_packed.logged(table.columns, table.rows))
    assert sorted(columns) == sorted(read)
    at = {c: table.columns.index(c) for c in read}
    for logged_row, row in zip(rows, table.rows, strict=True):
        for name, value in zip(columns, logged_row, strict=True):
            original = row[at[name]]
            assert value == original and type(value) is type(original), (name, value, original)
    fractions = [r[columns.index("fwd_ms")] for r in rows if r[columns.index("fwd_ms")] % 1]
    assert fractions  # real fractional numbers went through
    lacking = [c for c in table.columns if c != "fwd_ms_std"]
    short = [
        [v for c, v in zip(table.columns, r, strict=True) if c != "fwd_ms_std"] for r in table.rows
    ]
    columns, rows = _packed.unpacked(*_packed.logged(lacking, short))
    assert {r[columns.index("fwd_ms_std")] for r in rows} == {None}


HOSTILE = (
    "a\x1fb",  # the separator
    "c\x1ed",  # the escape
    "\x1e1\x1e0\x1e\x1f\x1f\x1e",  # escape sequences written literally
    'q,"x"\n|\\u001f',  # commas, quotes, a newline, a written-out escape
    "ünï😀",
)


def test_hostile_module_names_survive_the_packing():
    """Module names are the user's and may hold the packing's own control characters: each
    comes back from `logged` / `unpacked` exactly, in every text column that names it."""
    model = torch.nn.Sequential()
    for name in HOSTILE:
        model.add_module(name, torch.nn.Linear(4, 4))
    prof = profiled(model, torch.randn(2, 4, requires_grad=True))
    table = prof.table()
    columns, rows = _packed.logged(table.columns, table.rows)
    _, texts = _packed.packed_columns()
    assert {len(str(r[-1]).split(_packed.SEP)) for r in rows} == {1 + len(texts)}  # escaped
    back_columns, back = _packed.unpacked(columns, rows)
    at = {c: table.columns.index(c) for c in back_columns}
    assert [[r[at[c]] for c in back_columns] for r in table.rows] == back
    labels = {r[back_columns.index("label")] for r in back}
    assert set(HOSTILE) <= labels


def test_offline_run_without_entity_logs_tables_and_says_how_to_get_the_panel(tmp_path):
    model = ResNet()
    x = resnet_input()
    run = wandb.init(mode="offline", project="modprof-test", dir=str(tmp_path))
    with pytest.warns(UserWarning) as caught:
        handle = wandb_modprof.watch(model, log_freq=1, run=run, structure=False)
    (notice,) = [w for w in caught if "wandb_modprof" in str(w.message)]
    text = str(notice.message)
    assert notice.filename == __file__  # at the user's watch() line, not ours
    assert text == (
        f"wandb_modprof: run {run.id} is offline and has no W&B entity, so modprof/ResNet is "
        "logged as its table alone (modprof/ResNet_table), without the panel.\n"
        "For the panel: wandb.init(entity=E) or WANDB_ENTITY=E, then register the preset once: "
        "`wandb-modprof register-chart --entity E`."
    )
    assert handle.chart is None
    for _ in range(2):
        train_step(model, x)
        run.log({"loss": 1.0})
    handle.unwatch()
    run.finish()
    files = _table_files(tmp_path, "ResNet")
    assert len(files) == 2
    columns = tuple(handle.profile().table().columns)
    assert strict_json(files[0].read_text())["columns"] == logged_cells(columns, [])[0]


def test_offline_notice_is_emitted_once_per_process_with_the_command(tmp_path):
    run = wandb.init(mode="offline", project="modprof-test", dir=str(tmp_path), entity="my-team")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = wandb_modprof.watch(TinyGPT(), run=run, structure=False)
        second = wandb_modprof.watch(ResNet(), run=run, structure=False)
        first.unwatch(), second.unwatch()
        third = wandb_modprof.watch(
            TinyGPT(), run=run, structure=False, settings=wandb_modprof.Settings(chart="x/other-v2")
        )
        third.unwatch()
    run.finish()
    records = [w for w in caught if "is offline" in str(w.message)]
    notices = [str(w.message) for w in records]
    assert notices == [
        f"wandb_modprof: run {run.id} is offline; its modprof panels use the W&B chart preset "
        f"'my-team/{_spec.CHART_NAME}'.\n"
        "Before `wandb sync`, register it once: `wandb-modprof register-chart --entity my-team`."
    ]
    assert records[0].filename == __file__  # points at the watch() call


# ---- logic on disabled runs (no disk) ---------------------------------------------------------
def test_disabled_run_holds_the_chart_and_the_totals_and_warns_nothing():
    run = disabled_run()
    model = TinyGPT()
    x = gpt_input()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle = wandb_modprof.watch(
            model,
            log_freq=1,
            run=run,
            settings=wandb_modprof.Settings(default_mode="bwd", default_scale="log", chart=CHART),
        )
        for _ in range(3):  # 1: structure pass; 2, 3 sampled
            train_step(model, x)
        prof = handle.unwatch()
    chart = run.summary["modprof/TinyGPT"]
    assert isinstance(chart, wandb.plot.CustomChart)
    assert chart.spec.spec_name == CHART
    assert chart.spec.fields == {}
    assert chart.spec.string_fields == {"mode": "bwd", "scale": "log"}
    table = prof.table()
    columns, rows = logged_cells(table.columns, table.rows)
    assert chart.table.columns == columns
    assert chart.table.data == rows
    assert len(chart.table.data) <= 10_000
    totals = prof.last_sample.totals
    assert run.summary["modprof/TinyGPT/fwd_ms"] == totals.fwd_ms > 0
    assert run.summary["modprof/TinyGPT/bwd_ms"] == totals.bwd_ms > 0
    assert run.summary["modprof/TinyGPT/act_bytes"] == totals.act_bytes > 0


def test_default_chart_and_mode():
    run = disabled_run()
    model = TinyGPT()
    handle = wandb_modprof.watch(model, log_freq=1, run=run, structure=False)
    assert handle.chart == f"{run.entity}/{_spec.CHART_NAME}"  # "dummy" for disabled runs
    train_step(model, gpt_input())
    handle.unwatch()
    spec = run.summary["modprof/TinyGPT"].spec
    assert spec.string_fields == {"mode": "fwd_bwd", "scale": "linear"}


def test_entity_falls_back_to_wandb_entity(monkeypatch):
    run = RecordingRun()
    run.entity = ""
    monkeypatch.setenv("WANDB_ENTITY", "env-team")
    assert wandb_modprof.watch(TinyGPT(), run=run).chart == f"env-team/{_spec.CHART_NAME}"
    monkeypatch.delenv("WANDB_ENTITY")
    assert wandb_modprof.watch(ResNet(), run=run).chart is None  # tables only


def test_samples_are_logged_at_the_next_forward_outside_the_engine_with_commit_false():
    run = RecordingRun(disabled_run())
    model = TinyGPT()
    x = gpt_input()
    handle = wandb_modprof.watch(model, log_freq=2, run=run, structure=False)
    train_step(model, x)
    train_step(model, x)  # sampled
    assert run.calls == []  # the backward ended; nothing is logged inside the engine
    with torch.no_grad():
        model.eval()
        model(x)  # any forward of the model logs it (eval ones too)
        model.train()
    assert len(run.calls) == 1
    data, commit, in_backward = run.calls[0]
    assert commit is False and not in_backward
    assert set(data) == {
        "modprof/TinyGPT",
        "modprof/TinyGPT/fwd_ms",
        "modprof/TinyGPT/bwd_ms",
        "modprof/TinyGPT/act_bytes",
        "modprof/TinyGPT/overhead_pct",  # the run's measured cost of sampling so far
        "modprof/TinyGPT/samples",  # the samples folded into the profile so far
        # the sample's step phases (no optimizer here: no optimizer phase)
        *(f"modprof/TinyGPT/phase/{p}_ms" for p in ("between", "forward", "loss", "backward")),
    }
    assert 0 <= data["modprof/TinyGPT/overhead_pct"] <= 100
    train_step(model, x)
    train_step(model, x)  # sampled: logged by unwatch
    assert len(run.calls) == 1
    handle.unwatch()
    assert len(run.calls) == 2 and run.calls[1][1] is False
    handle.unwatch()  # a second unwatch logs nothing more
    assert len(run.calls) == 2


def test_unsampled_steps_log_nothing():
    run = RecordingRun()
    model = TinyGPT()
    x = gpt_input()
    handle = wandb_modprof.watch(model, log_freq=1000, run=run, structure=False)
    for _ in range(5):
        train_step(model, x)
    with pytest.warns(UserWarning, match=r"log_freq=1000: steps 1000, 2000, \.\.\. are sampled"):
        handle.unwatch()
    assert run.calls == []


def test_samples_wait_for_their_device_events(monkeypatch):
    """On accelerators a sample resolves only once its events completed: until then each root
    forward asks again (simulated on CPU by a clock that is not ready)."""
    from wandb_modprof.capture.session_record import SessionRecord

    ready = {"now": False}
    monkeypatch.setattr(SessionRecord, "ready", lambda record: ready["now"])
    run = RecordingRun()
    model = TinyGPT()
    x = gpt_input()
    handle = wandb_modprof.watch(model, log_freq=2, run=run, structure=False)
    for _ in range(3):
        train_step(model, x)
    assert run.calls == []  # step 2's sample is not ready at step 3's forward
    ready["now"] = True
    train_step(model, x)  # step 4's forward: ready now
    assert len(run.calls) == 1
    ready["now"] = False
    train_step(model, x)
    train_step(model, x)
    assert len(run.calls) == 1
    handle.unwatch()  # forced: waits for the device
    assert len(run.calls) == 2


def test_two_models_of_one_class_get_distinct_keys():
    run = disabled_run()
    a, b, c = TinyGPT(), TinyGPT(), ResNet()
    ha = wandb_modprof.watch(a, log_freq=1, run=run, structure=False)
    hb = wandb_modprof.watch(b, log_freq=1, run=run, structure=False)
    hc = wandb_modprof.watch(c, log_freq=1, run=run, structure=False)
    assert (ha.key, hb.key, hc.key) == ("modprof/TinyGPT", "modprof/TinyGPT_1", "modprof/ResNet")
    train_step(a, gpt_input())
    train_step(b, gpt_input())
    train_step(c, resnet_input())
    wandb_modprof.unwatch()
    for key in ("modprof/TinyGPT", "modprof/TinyGPT_1", "modprof/ResNet"):
        assert isinstance(run.summary[key], wandb.plot.CustomChart)
    # re-watching keeps the model's key; a new model never takes an unwatched one's
    assert wandb_modprof.watch(a, run=run, structure=False).key == "modprof/TinyGPT"
    assert wandb_modprof.watch(TinyGPT(), run=run, structure=False).key == "modprof/TinyGPT_2"
    other = disabled_run()
    assert wandb_modprof.watch(TinyGPT(), run=other, structure=False).key == "modprof/TinyGPT"


def test_a_failing_log_warns_once_and_training_is_unchanged():
    torch.manual_seed(0)
    plain = TinyGPT()
    watched = copy.deepcopy(plain)
    x = gpt_input()
    run = RecordingRun(fail=True)
    handle = wandb_modprof.watch(watched, log_freq=1, run=run, structure=False)
    opt_a = torch.optim.SGD(plain.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(watched.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            la, lb = train_step(plain, x), train_step(watched, x)
            assert torch.equal(la, lb)
            opt_a.step(), opt_b.step()
            opt_a.zero_grad(), opt_b.zero_grad()
        handle.unwatch()
    assert len(run.calls) == 4  # every sample was tried
    messages = [str(w.message) for w in caught if "wandb_modprof" in str(w.message)]
    assert messages == [
        "wandb_modprof: could not log modprof/TinyGPT to W&B (OSError: disk full). This log is "
        "dropped; training continues and later samples are still logged (no further warning). "
        "If the run was finished: call unwatch() before run.finish()."
    ]
    for pa, pb in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert handle.profile().num_samples == 4


# ---- arguments ---------------------------------------------------------------------------------
def test_watch_without_a_run_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(wandb, "run", None)
    with pytest.raises(ModProfError) as raised:
        wandb_modprof.watch(TinyGPT())
    assert str(raised.value) == (
        "watch() needs a W&B run: call wandb.init() before watch(), or pass run=...; for "
        "profiling without W&B use wandb_modprof.profile(model)"
    )
    assert wandb_modprof.unwatch() is None  # nothing was hooked


def test_watch_uses_wandb_run_by_default():
    run = disabled_run()
    assert wandb.run is run
    handle = wandb_modprof.watch(TinyGPT(), run=None, structure=False)
    assert handle.run is run


def test_bad_mode_scale_and_chart_are_clear_errors():
    run = disabled_run()
    model = TinyGPT()
    modes = ", ".join(repr(m) for m in MODE_KEYS)
    with pytest.raises(ModProfError, match=re.escape(f"expected one of {modes}; got 'time'")):
        wandb_modprof.watch(model, run=run, settings=wandb_modprof.Settings(default_mode="time"))
    with pytest.raises(
        ModProfError, match=re.escape("default_scale expected one of 'linear', 'log'; got 'sqrt'")
    ):
        wandb_modprof.watch(model, run=run, settings=wandb_modprof.Settings(default_scale="sqrt"))
    for bad in ("wandb-modprof-v1", "a/b/c", "me/", "me/has space", 3):
        with pytest.raises(ModProfError, match=r"chart expected a W&B chart preset name"):
            wandb_modprof.watch(model, run=run, settings=wandb_modprof.Settings(chart=bad))  # type: ignore[arg-type]
    handle = wandb_modprof.watch(
        model, run=run, settings=wandb_modprof.Settings(chart="team_1/my.chart-v2"), structure=False
    )
    assert handle.chart == "team_1/my.chart-v2"


def test_importing_the_package_does_not_import_wandb():
    code = "import sys, wandb_modprof; assert 'wandb' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_root_compiled_in_place_logs_during_training():
    """`model.compile()` runs the root's hooks inside compiled code; the log runs eagerly
    there (a graph break), so samples are still logged at the next forward."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    model = TinyGPT()
    model.compile(backend=counter)
    x = gpt_input()
    run = RecordingRun()
    handle = wandb_modprof.watch(model, log_freq=2, run=run, structure=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's notes on the graph breaks in our hooks
        for _ in range(5):
            train_step(model, x)
        assert len(run.calls) == 2  # steps 2 and 4, logged at the forwards of 3 and 5
        frames = counter.frame_count
        for _ in range(4):
            train_step(model, x)
    assert counter.frame_count == frames  # logging caused no recompiles
    assert len(run.calls) == 4
    handle.unwatch()
    torch._dynamo.reset()
    assert all(commit is False and not in_backward for _, commit, in_backward in run.calls)


@requires_cuda
def test_cuda_samples_are_logged_once_their_events_completed():
    run = RecordingRun()
    model = TinyGPT().cuda()
    x = gpt_input().cuda()
    handle = wandb_modprof.watch(model, log_freq=2, run=run, structure=False)
    for _ in range(7):
        train_step(model, x)
        torch.cuda.synchronize()  # the sample's events are complete by the next forward
    assert len(run.calls) == 3  # steps 2, 4, 6, at the forwards of 3, 5, 7
    train_step(model, x)  # step 8, sampled; unwatch waits for it
    handle.unwatch()
    assert len(run.calls) == 4
    data = run.calls[-1][0]
    assert data["modprof/TinyGPT/fwd_ms"] > 0 and data["modprof/TinyGPT/bwd_ms"] > 0


def test_the_run_double_has_the_real_runs_interface_and_no_other():
    run = run_double()
    assert callable(run.log_artifact) and callable(run.log) and callable(run.finish)
    with pytest.raises(AttributeError):
        run.log_artifacts  # noqa: B018 (no such method on wandb.Run)
    with pytest.raises(TypeError):
        run.log({"a": 1}, comit=False)  # a keyword Run.log does not take
    recording = RecordingRun()
    recording.log({"a": 1}, commit=False)
    assert recording.calls == [({"a": 1}, False, False)]


def test_a_name_with_a_lone_surrogate_still_gets_its_report_logged(tmp_path):
    """A module name decoded from bytes that are not UTF-8 (a lone surrogate) reaches W&B's
    `wandb.Html`, which writes the page as UTF-8: written with U+FFFD, not dropped."""
    model = torch.nn.Sequential()
    model.add_module("bad\udcffname", torch.nn.Linear(4, 4))
    run = wandb.init(mode="offline", project="modprof-test", dir=str(tmp_path), entity="me")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the offline notice
        handle = wandb_modprof.watch(model, log_freq=1, run=run, structure=False)
    x = torch.randn(2, 4)
    for _ in range(2):
        model(x).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not log" warning
        handle.unwatch()
    run.finish()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    (page,) = (run_dir / "files" / "media" / "html").rglob("*.html")
    text = page.read_text(encoding="utf-8")
    assert "bad\ufffdname" in text and "<html" in text.lower()
