"""`wandb_modprof.integrations.huggingface.ModProfCallback` in a real `transformers.Trainer`
on CPU: GPT-2 built from a config, `report_to=["wandb"]` with an offline run (the hermetic
environment of conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import wandb
from helpers import (
    check_logged_tables,
    disabled_run,
    hook_counts,
    logged_cells,
    ours,
    recorded_warnings,
    strict_json,
    without_overhead,
)
from models import gpt2_from_config

from wandb_modprof import ModProfError, Settings
from wandb_modprof.records.phases import PHASES
from wandb_modprof.sinks.wandb import wandb_names as _wandb_names

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it

from wandb_modprof.integrations.huggingface import ModProfCallback  # noqa: E402

ACCUMULATE = 2
VOCAB = 512


def _dataset(rows: int = 64) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (rows, 16))
    return [{"input_ids": row, "labels": row} for row in ids]


def _args(tmp_path: Path, **kwargs: Any) -> Any:
    options: dict[str, Any] = {
        "max_steps": 6,
        "gradient_accumulation_steps": ACCUMULATE,
        "per_device_train_batch_size": 2,
        "report_to": ["wandb"],
        "logging_steps": 1,
        "use_cpu": True,
        "save_strategy": "no",
        "disable_tqdm": True,
    }
    options.update(kwargs)
    return transformers.TrainingArguments(output_dir=str(tmp_path / "out"), **options)


class RecordRun(transformers.TrainerCallback):  # type: ignore[misc]
    """Keeps the run that `WandbCallback` started (the ModProfCallback must have used it)."""

    run: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run = wandb.run


def _record_measured(model: torch.nn.Module) -> list[bool]:
    """Whether each training forward was measured: wandb_modprof's hooks are on the
    submodules (here `lm_head`) only then. A forward hook of the user's own, on the root."""
    hooked: list[bool] = []

    def after_forward(module: torch.nn.Module, args: Any, output: Any) -> None:
        if module.training and torch.is_grad_enabled():
            hooked.append(sum(hook_counts(model.lm_head).values()) > 0)  # type: ignore[arg-type]

    model.register_forward_hook(after_forward)
    return hooked


@pytest.fixture(autouse=True)
def _no_run_left() -> Any:
    yield
    wandb.finish()


def test_trainer_logs_every_log_freq_th_optimizer_step_to_the_report_to_wandb_run(
    tmp_path, monkeypatch
):
    model = gpt2_from_config()
    hooked = _record_measured(model)
    callback, record = ModProfCallback(log_freq=2), RecordRun()
    trainer = transformers.Trainer(
        model=model, args=_args(tmp_path), train_dataset=_dataset(), callbacks=[callback, record]
    )
    monkeypatch.setattr(_wandb_names, "_NOTICES", set())  # the offline notice is once per process
    with pytest.warns(UserWarning, match="is offline and has no W&B entity"):
        trainer.train()
    handle = callback.handle
    assert handle is not None and record.run is not None and handle.run is record.run
    assert handle.key == "modprof/GPT2LMHeadModel"

    # steps are optimizer steps, as state.global_step counts them (2 micro-batches each):
    # step 1's first micro-batch is the structure pass; 2, 4, 6 are sampled, first micro-batch
    assert trainer.state.global_step == handle.steps == 6
    measured = [(i // ACCUMULATE + 1, i % ACCUMULATE) for i, on in enumerate(hooked) if on]
    assert measured == [(1, 0), (2, 0), (4, 0), (6, 0)]
    prof = handle.profile()
    assert prof.num_samples == 3 and prof.last_sample is not None
    assert prof.last_sample.step == 6
    assert "transformer.h.1.mlp.c_fc#0" in {r.key for r in prof.invocations()}
    # the step's phases, through the framework's own training loop: with gradient accumulation
    # the sampled micro-batch's next forward is the next micro-batch, and the optimizer step
    # that applies its gradients comes after it; the callback passes the optimizer, so the
    # sample waits for that step
    phases = prof.snapshot().phases
    assert phases is not None and set(phases.median_ms) == set(PHASES)
    assert phases.unmeasured == {} and phases.median_ms["optimizer"] > 0

    # unwatched at the end of training: only the test's own root hook is left
    assert not handle.active
    counts = hook_counts(model)
    assert counts.pop("<root>") == 1 and set(counts.values()) == {0}
    assert trainer.optimizer.optimizer._optimizer_step_post_hooks == {}

    run_dir = Path(record.run.dir).parent
    assert wandb.run is record.run  # transformers does not finish the run at train end
    wandb.finish()
    tables = sorted(
        (run_dir / "files/media/table/modprof").glob("GPT2LMHeadModel_table_*.table.json")
    )
    assert len(tables) == 3  # one per sample
    table = prof.table()
    check_logged_tables(tables, table.columns)
    newest = max(tables, key=lambda path: int(path.name.split("_")[2]))
    # equal but for the run's measured overhead, which went on after that sample was logged
    logged = strict_json(newest.read_text())["data"]
    assert without_overhead(logged) == without_overhead(logged_cells(table.columns, table.rows)[1])
    assert len(logged) - len(without_overhead(logged)) == 2  # (the share, and at log_freq=100)
    (report,) = (run_dir / "files/media/html/modprof/GPT2LMHeadModel").glob("report_*.html")
    assert "GPT2LMHeadModel" in report.read_text()  # the final report, logged at unwatch


def test_options_pass_through_and_run_overrides_wandb_run(tmp_path):
    run = disabled_run()
    model = gpt2_from_config()
    callback = ModProfCallback(
        log_freq=1, run=run, structure=False, settings=Settings(default_mode="bwd")
    )
    args = _args(tmp_path, report_to="none", max_steps=2, gradient_accumulation_steps=1)
    transformers.Trainer(
        model=model, args=args, train_dataset=_dataset(), callbacks=[callback]
    ).train()
    assert callback.handle is not None and callback.handle.run is run
    assert callback.handle.profile().num_samples == 2  # no structure pass: steps 1 and 2
    chart = run.summary["modprof/GPT2LMHeadModel"]
    assert chart.spec.string_fields == {"mode": "bwd", "scale": "linear"}


def test_a_short_offline_train_says_at_the_train_line_what_it_logged_and_what_to_change(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(_wandb_names, "_NOTICES", set())  # the offline notice is once per process
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    model = gpt2_from_config()
    callback = ModProfCallback(log_freq=100)  # the README's value, in a 3-step run
    args = _args(tmp_path, max_steps=3, gradient_accumulation_steps=1)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_dataset(), callbacks=[callback]
    )
    with recorded_warnings() as caught:
        trainer.train()
    entity, empty = ours(caught)
    # both at the user's train() line, not at the callback's or transformers' own lines
    assert entity.filename == empty.filename == __file__
    assert str(entity.message).splitlines()[1] == (
        "For the panel: WANDB_ENTITY=E in the environment (report_to='wandb' reads it), then "
        "register the preset once: `wandb-modprof register-chart --entity E`."
    )
    assert str(empty.message) == (
        "wandb_modprof: GPT2LMHeadModel was watched for 3 optimizer step(s) with log_freq=100: "
        "steps 100, 200, ... are sampled, so none was, nothing logged.\n"
        "To measure a run this short, pass a log_freq below its length, e.g. "
        "ModProfCallback(log_freq=1)."
    )


def test_no_wandb_run_is_a_clear_error_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(wandb, "run", None)
    model = gpt2_from_config()
    hooked = _record_measured(model)
    args = _args(tmp_path, report_to="none")
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_dataset(), callbacks=[ModProfCallback()]
    )
    with pytest.raises(ModProfError) as raised:
        trainer.train()
    assert str(raised.value) == (
        "ModProfCallback logs to Weights & Biases and found no run: expected "
        "TrainingArguments(report_to='wandb') (or wandb.init() before train()); got "
        "report_to=[]"
    )
    assert hooked == []


def test_only_world_process_zero_watches():
    model = gpt2_from_config()
    callback = ModProfCallback(log_freq=1)
    state = SimpleNamespace(is_world_process_zero=False, global_step=0)
    callback.on_train_begin(SimpleNamespace(), state, None, model=model, optimizer=None)
    assert callback.handle is None and set(hook_counts(model).values()) == {0}
    callback.on_train_end(SimpleNamespace(), state, None, model=model)


def test_other_processes_of_a_process_group_watch_without_a_run(monkeypatch):
    """Under torch.distributed every process measures (for rank 0's rank columns); only
    process zero has the W&B run. The process group is simulated: rank 1 of 2, no store."""
    import wandb_modprof.api.watch as watch_module
    import wandb_modprof.integrations.huggingface as hf
    from wandb_modprof.api.distributed import RankInfo

    monkeypatch.setattr(hf, "other_rank_watches", lambda: True)
    monkeypatch.setattr(watch_module, "rank_info", lambda: RankInfo(1, 2))
    monkeypatch.setattr(watch_module, "open_channel", lambda info, name: None)
    model = gpt2_from_config()
    callback = ModProfCallback(log_freq=1, structure=False)
    state = SimpleNamespace(is_world_process_zero=False, global_step=0)
    callback.on_train_begin(SimpleNamespace(), state, None, model=model, optimizer=None)
    handle = callback.handle
    assert handle is not None and handle.active and handle.run is None
    assert handle._wandb_log is None  # measures, never logs
    with pytest.warns(UserWarning, match=r"0 training step\(s\)"):
        callback.on_train_end(SimpleNamespace(), state, None, model=model)
    assert not handle.active and set(hook_counts(model).values()) == {0}


def test_a_raised_train_is_unwatched_by_the_next_one(tmp_path):
    run = disabled_run()
    model = gpt2_from_config()
    callback = ModProfCallback(log_freq=1, run=run, structure=False)
    state = SimpleNamespace(is_world_process_zero=True, global_step=0)
    callback.on_train_begin(SimpleNamespace(), state, None, model=model, optimizer=None)
    first = callback.handle
    assert first is not None and first.active  # train() raised: on_train_end never came
    with pytest.warns(UserWarning, match=r"0 training step\(s\)"):  # the first, unwatched
        callback.on_train_begin(SimpleNamespace(), state, None, model=model, optimizer=None)
    assert not first.active and callback.handle is not first and callback.handle.active
    with pytest.warns(UserWarning, match=r"0 training step\(s\)"):
        callback.on_train_end(SimpleNamespace(), state, None, model=model)
    assert set(hook_counts(model).values()) == {0}


def test_bad_options_fail_when_the_callback_is_built():
    with pytest.raises(ModProfError, match=r"got 'model' \(set by the callback\)"):
        ModProfCallback(model=gpt2_from_config())
    with pytest.raises(ModProfError, match="log_freq"):
        ModProfCallback(log_freq=-1)


def test_a_missing_transformers_is_an_import_error_with_the_install_hint():
    code = (
        "import sys\n"
        "sys.modules['transformers'] = None\n"
        "from wandb_modprof import ModProfError\n"
        "try:\n"
        "    import wandb_modprof.integrations.huggingface\n"
        "except ImportError as error:\n"
        "    assert isinstance(error, ModProfError), type(error)\n"
        "    print(error)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    assert out.startswith("wandb_modprof.integrations.huggingface needs Hugging Face transformers")
    assert out.rstrip().endswith("pip install 'wandb-modprof[huggingface]'")
