"""`wandb_modprof.integrations.lightning.ModProfCallback` in a real Lightning `Trainer` on CPU,
logging through a real offline `WandbLogger` run (the hermetic environment of conftest.py)."""

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
from models import TinyGPT
from torch import nn
from torch.nn import functional as F  # noqa: N812  (the PyTorch convention)
from torch.utils.data import DataLoader, TensorDataset

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.records.phases import PHASES
from wandb_modprof.sinks.wandb import wandb_names as _wandb_names

L = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.loggers import WandbLogger  # noqa: E402  (after the importorskip)

from wandb_modprof.integrations import MissingFrameworkError, start_at_step  # noqa: E402
from wandb_modprof.integrations.lightning import ModProfCallback  # noqa: E402

ACCUMULATE = 2
# Lightning 2.6 with torch 2.13 says this on every fit; unrelated to the callback
pytestmark = pytest.mark.filterwarnings("ignore:`isinstance.treespec, LeafSpec.` is deprecated")


class LitGPT(L.LightningModule):
    """TinyGPT trained on random tokens; `training_step` calls `self(x)` (the watched root)
    or, with `call_submodule`, `self.model(x)`. Each training forward records whether its
    micro-batch was measured: wandb_modprof's hooks are on the submodules only then."""

    def __init__(self, call_submodule: bool = False) -> None:
        super().__init__()
        self.model = TinyGPT()
        self.call_submodule = call_submodule
        self.hooked: list[bool] = []

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.hooked.append(sum(hook_counts(self.model.head).values()) > 0)
        return self.model(idx)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (idx,) = batch
        logits = self.model(idx) if self.call_submodule else self(idx)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _loader(batches: int = 32) -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.randint(0, 128, (2 * batches, 32))), batch_size=2)


def _trainer(logger: Any, callback: ModProfCallback, max_steps: int = 6, **kwargs: Any) -> Any:
    return L.Trainer(
        max_steps=max_steps,
        accumulate_grad_batches=ACCUMULATE,
        log_every_n_steps=1,
        logger=logger,
        callbacks=[callback],
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def _measured_steps(hooked: list[bool]) -> list[tuple[int, int]]:
    """(optimizer step, micro-batch in it), 1-based steps, for every hooked training forward."""
    return [(i // ACCUMULATE + 1, i % ACCUMULATE) for i, on in enumerate(hooked) if on]


@pytest.fixture(autouse=True)
def _no_run_left() -> Any:
    yield
    wandb.finish()


def test_fit_logs_every_log_freq_th_optimizer_step_to_the_wandb_logger_run(tmp_path):
    lit = LitGPT()
    logger = WandbLogger(project="modprof-test", save_dir=str(tmp_path), offline=True)
    callback = ModProfCallback(log_freq=2)
    trainer = _trainer(logger, callback)
    trainer.fit(lit, _loader())
    handle = callback.handle
    assert handle is not None and handle.run is logger.experiment
    assert handle.key == "modprof/LitGPT"

    # steps are optimizer steps, as trainer.global_step counts them (2 micro-batches each):
    # step 1's first micro-batch is the structure pass; 2, 4, 6 are sampled, first micro-batch
    assert trainer.global_step == handle.steps == 6
    assert _measured_steps(lit.hooked) == [(1, 0), (2, 0), (4, 0), (6, 0)]
    prof = handle.profile()
    assert prof.num_samples == 3 and prof.last_sample is not None
    assert prof.last_sample.step == 6
    assert {"<root>#0", "model#0", "model.head#0"} <= {r.key for r in prof.invocations()}
    # the step's phases, through the framework's own training loop: with gradient accumulation
    # the sampled micro-batch's next forward is the next micro-batch, and the optimizer step
    # that applies its gradients comes after it; the callback passes the optimizer, so the
    # sample waits for that step
    phases = prof.snapshot().phases
    assert phases is not None and set(phases.median_ms) == set(PHASES)
    assert phases.unmeasured == {} and phases.median_ms["optimizer"] > 0

    # unwatched at the end of training: no hooks left on any module or on the optimizer
    assert not handle.active
    assert set(hook_counts(lit).values()) == {0}
    assert trainer.optimizers[0]._optimizer_step_post_hooks == {}

    run_dir = Path(logger.experiment.dir).parent
    logger.experiment.finish()
    tables = sorted((run_dir / "files/media/table/modprof").glob("LitGPT_table_*.table.json"))
    assert len(tables) == 3  # one per sample; the last one logged by unwatch at train end
    table = prof.table()
    check_logged_tables(tables, table.columns)
    newest = max(tables, key=lambda path: int(path.name.split("_")[2]))
    # equal but for the run's measured overhead, which went on after that sample was logged
    logged = strict_json(newest.read_text())["data"]
    assert without_overhead(logged) == without_overhead(logged_cells(table.columns, table.rows)[1])
    assert len(logged) - len(without_overhead(logged)) == 2  # (the share, and at log_freq=100)
    (report,) = (run_dir / "files/media/html/modprof/LitGPT").glob("report_*.html")
    assert "LitGPT" in report.read_text()  # the final report, logged at unwatch


def test_options_pass_through_and_run_overrides_the_logger():
    run = disabled_run()
    lit = LitGPT()
    callback = ModProfCallback(
        log_freq=1,
        run=run,
        structure=False,
        settings=wandb_modprof.Settings(default_mode="bwd", default_scale="log"),
    )
    trainer = _trainer(False, callback, max_steps=2)
    trainer.fit(lit, _loader())
    assert callback.handle is not None and callback.handle.run is run
    assert callback.handle.profile().num_samples == 2  # no structure pass: steps 1 and 2
    chart = run.summary["modprof/LitGPT"]
    assert chart.spec.string_fields == {"mode": "bwd", "scale": "log"}


def test_a_training_step_that_calls_a_submodule_warns_and_module_names_it():
    run = disabled_run()
    lit = LitGPT(call_submodule=True)
    with (
        # the first step is the structure pass, the second's backward is the LightningModule's
        pytest.warns(UserWarning, match=r"2 optimizer step\(s\) .* no sample completed"),
        pytest.warns(UserWarning, match=r"ModProfCallback\(module='model'\)"),
    ):
        _trainer(False, ModProfCallback(log_freq=1, run=run), max_steps=2).fit(lit, _loader())

    lit = LitGPT(call_submodule=True)
    callback = ModProfCallback(log_freq=2, run=run, module="model")
    _trainer(False, callback, max_steps=4).fit(lit, _loader())
    assert callback.handle is not None and callback.handle.key == "modprof/TinyGPT"
    assert callback.handle.steps == 4 and callback.handle.profile().num_samples == 2
    with pytest.raises(ModProfError, match=r"submodule of LitGPT \(children: model\); got 'mdl'"):
        _trainer(False, ModProfCallback(run=run, module="mdl"), max_steps=1).fit(lit, _loader())
    assert set(hook_counts(lit).values()) == {0}


@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before the epoch")
def test_a_resumed_fit_counts_on_from_the_checkpoint_global_step(tmp_path):
    run = disabled_run()
    lit = LitGPT()
    first = _trainer(False, ModProfCallback(log_freq=4, run=run), max_steps=3)
    with pytest.warns(UserWarning, match=r"3 optimizer step\(s\) with log_freq=4"):
        first.fit(lit, _loader())
    first.save_checkpoint(tmp_path / "step3.ckpt")

    lit = LitGPT()
    callback = ModProfCallback(log_freq=4, run=run)
    second = _trainer(False, callback, max_steps=8)
    second.fit(lit, _loader(), ckpt_path=tmp_path / "step3.ckpt")
    assert second.global_step == callback.handle.steps == 8  # type: ignore[union-attr]
    # step 4, the first after resuming, is sampled before any graph: it is timed and derives
    # the graph; step 5 is the structure pass; step 8 the next sample
    assert callback.handle.profile().last_sample.step == 8  # type: ignore[union-attr]
    assert callback.handle.profile().num_samples == 2  # type: ignore[union-attr]


def test_start_at_step_offsets_the_optimizer_step_count():
    model = TinyGPT()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = wandb_modprof.watch(model, log_freq=3, run=disabled_run(), optimizer=opt)
    start_at_step(handle, 4)
    for _ in range(2):  # steps 5 (structure pass) and 6 (sampled)
        model(torch.randint(0, 128, (2, 32))).float().pow(2).mean().backward()
        opt.step()
    assert handle.steps == 6
    assert handle.unwatch().last_sample.step == 6  # type: ignore[union-attr]


def test_a_short_offline_fit_says_at_the_fit_line_what_it_logged_and_what_to_change(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(_wandb_names, "_NOTICES", set())  # the offline notice is once per process
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    logger = WandbLogger(project="modprof-test", save_dir=str(tmp_path), offline=True)
    callback = ModProfCallback(log_freq=100)  # the README's value, in a 4-step fit
    with recorded_warnings() as caught:
        _trainer(logger, callback, max_steps=4).fit(LitGPT(), _loader())
    entity, empty = ours(caught)
    # both at the user's fit() line, not at the callback's or Lightning's own lines
    assert entity.filename == empty.filename == __file__
    assert str(entity.message).splitlines()[1] == (
        "For the panel: WandbLogger(entity=E) or WANDB_ENTITY=E, then register the preset "
        "once: `wandb-modprof register-chart --entity E`."
    )
    assert str(empty.message) == (
        "wandb_modprof: LitGPT was watched for 4 optimizer step(s) with log_freq=100: steps "
        "100, 200, ... are sampled, so none was, nothing logged.\n"
        "To measure a run this short, pass a log_freq below its length, e.g. "
        "ModProfCallback(log_freq=1)."
    )
    assert callback.handle is not None and callback.handle.profile().num_samples == 0


def test_no_wandb_run_is_a_clear_error_before_training(monkeypatch):
    monkeypatch.setattr(wandb, "run", None)
    lit = LitGPT()
    trainer = _trainer(False, ModProfCallback(log_freq=2), max_steps=2)
    with pytest.raises(ModProfError) as raised:
        trainer.fit(lit, _loader())
    assert str(raised.value) == (
        "ModProfCallback logs to Weights & Biases and found no run: expected a WandbLogger "
        "among the Trainer's loggers (Trainer(logger=WandbLogger(...))), ModProfCallback(run=...)"
        ", or wandb.init() before fit(); got loggers []"
    )
    assert lit.hooked == [] and set(hook_counts(lit).values()) == {0}


def test_only_global_rank_zero_watches():
    lit = LitGPT()
    callback = ModProfCallback(log_freq=1)
    trainer = SimpleNamespace(is_global_zero=False, loggers=[], optimizers=[], global_step=0)
    callback.setup(trainer, lit, "fit")  # no run needed off rank zero: nothing is logged there
    callback.on_train_start(trainer, lit)
    assert callback.handle is None and set(hook_counts(lit).values()) == {0}
    callback.on_train_end(trainer, lit)


def test_bad_options_fail_when_the_callback_is_built():
    with pytest.raises(ModProfError, match=r"got 'optimizer' \(set by the callback\)"):
        ModProfCallback(optimizer=torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1.0))
    with pytest.raises(ModProfError, match=r"expected options of wandb_modprof.watch \(run, "):
        ModProfCallback(log_frequency=3)
    with pytest.raises(ModProfError, match="log_freq"):
        ModProfCallback(log_freq=0)


def test_a_missing_lightning_is_an_import_error_with_the_install_hint():
    code = (
        "import sys\n"
        "for name in ('lightning', 'lightning.pytorch', 'pytorch_lightning'):\n"
        "    sys.modules[name] = None\n"
        "from wandb_modprof import ModProfError\n"
        "try:\n"
        "    import wandb_modprof.integrations.lightning\n"
        "except ImportError as error:\n"
        "    assert isinstance(error, ModProfError), type(error)\n"
        "    print(error)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    assert out.startswith("wandb_modprof.integrations.lightning needs PyTorch Lightning")
    assert out.rstrip().endswith("pip install 'wandb-modprof[lightning]'")
    assert issubclass(MissingFrameworkError, ImportError)


def test_importing_wandb_modprof_imports_no_framework():
    code = (
        "import sys, wandb_modprof, wandb_modprof.integrations\n"
        "loaded = {'lightning', 'pytorch_lightning', 'transformers'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
