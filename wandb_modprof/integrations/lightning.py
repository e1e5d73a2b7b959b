"""A PyTorch Lightning callback that profiles the trained module into the `WandbLogger`'s run.

>>> import lightning as L                                                 # doctest: +SKIP
>>> from lightning.pytorch.loggers import WandbLogger
>>> from wandb_modprof.integrations.lightning import ModProfCallback
>>> trainer = L.Trainer(logger=WandbLogger(project="my-project"),
...                     callbacks=[ModProfCallback(log_freq=100)], accumulate_grad_batches=4)
>>> trainer.fit(lit_module, train_loader)   # every 100th optimizer step is measured and logged

What it does, hook by hook (on global rank zero; other ranks watch too under a process group,
see below):

- `setup` (fit): finds the run, so a fit without one fails before any work: the
  `experiment` of the first `WandbLogger` among `trainer.loggers`, else `run=` if given, else
  an active `wandb.run`, else `ModProfError` naming the ways to get one.
- `on_train_start` (after the sanity check, with the optimizers set up and a checkpoint's
  global step restored): `watch(module, log_freq, run, optimizer)`, where `module` is the
  LightningModule (or its submodule `module="..."`) and `optimizer` is `trainer.optimizers[0]`,
  so steps are optimizer steps exactly as `trainer.global_step` counts them: with
  `accumulate_grad_batches=N` the first micro-batch of every `log_freq`-th optimizer step is
  sampled. A resumed fit counts on from its global step. With several optimizers, the steps
  (and optimizer-state bytes) are those of the first one.
- `on_train_batch_end` of the first batch: warns if no training forward of the watched module
  was seen, as happens when `training_step` calls `self.model(x)` rather than `self(x)`
  (watch the submodule that is called: `ModProfCallback(module="model")`).
- `on_train_end` (or `on_exception`, or `teardown` as a last resort): `unwatch()`, which logs
  the last sample and the HTML report. This runs before Lightning finalizes its loggers;
  `WandbLogger` never finishes the run itself, so the run is still open.

Distributed training (a torch.distributed process group of more than one rank): every rank
watches its replica; only global rank zero (`trainer.is_global_zero`) logs, and its table gains
the other ranks' statistics (`rank_*` columns, the panel's rank imbalance mode). Without a
process group only global rank zero watches.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from wandb_modprof._errors import ModProfError
from wandb_modprof._warn import warn_at_user
from wandb_modprof.api.watch import watch
from wandb_modprof.api.watch_handle import WatchHandle
from wandb_modprof.integrations import (
    check_watch_options,
    import_framework,
    other_rank_watches,
    start_at_step,
    training_forwards,
    unwrap_optimizer,
)
from wandb_modprof.sinks.wandb.wandb_run import current_run

# Both distributions exist (`lightning` bundles `lightning.pytorch`; `pytorch_lightning` is the
# standalone one) and their Callback classes are distinct. Subclass the one the user imported
# (both when both are), so either Trainer takes this callback.
_FRAMEWORKS = import_framework(
    ("lightning.pytorch", "pytorch_lightning"), "PyTorch Lightning", "lightning"
)
if TYPE_CHECKING:
    _Callback = object
else:
    _BASES = tuple(framework.Callback for framework in _FRAMEWORKS)
    _Callback = _BASES[0] if len(_BASES) == 1 else type("Callback", _BASES, {})


def _wandb_loggers() -> tuple[type, ...]:
    """The `WandbLogger` classes of the Lightning distributions imported so far (a logger
    object's class is from one of them, so nothing needs importing here)."""
    classes = []
    for name in ("lightning.pytorch.loggers", "pytorch_lightning.loggers"):
        cls = getattr(sys.modules.get(name), "WandbLogger", None)
        if isinstance(cls, type):
            classes.append(cls)
    return tuple(classes)


class ModProfCallback(_Callback):
    """Profile the LightningModule on every `log_freq`-th optimizer step into the
    `WandbLogger`'s W&B run, and unwatch when training ends (see the module docstring).

    A Lightning `Callback`: of `lightning.pytorch`, of `pytorch_lightning`, or of both when
    both are imported, so either distribution's `Trainer` takes it.

    Args:
        log_freq: sample every `log_freq`-th optimizer step (`trainer.global_step`).
        module: dotted name of the submodule of the LightningModule to watch (default: the
            LightningModule itself, which needs `training_step` to call `self(...)`).

    Keyword Args:
        **watch_options: passed to `wandb_modprof.watch` (`run`, `timing`, `activations`,
            `norms`, `structure`, `nvtx`, `default_mode`, `default_scale`, `chart`); `run`
            overrides the logger's run.

    After training, `handle` is the `WatchHandle` of the last fit (None before, and on ranks
    other than zero): `callback.handle.profile().summary()`.

    Examples:
        >>> trainer = L.Trainer(                                              # doctest: +SKIP
        ...     logger=WandbLogger(), callbacks=[ModProfCallback(log_freq=50)]
        ... )
    """

    def __init__(self, log_freq: int = 100, module: str = "", **watch_options: Any) -> None:
        super().__init__()
        self.log_freq = check_watch_options("ModProfCallback", log_freq, watch_options)
        if not isinstance(module, str):
            raise ModProfError(
                f"ModProfCallback module expected the dotted name of a submodule of the "
                f"LightningModule ('' for itself); got {type(module).__qualname__}"
            )
        self.module = module
        self.watch_options = watch_options
        self.handle: WatchHandle | None = None
        self._run: Any = None
        self._checked_forward = False

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            self._run = self._find_run(trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        zero = trainer.is_global_zero
        if not zero and not other_rank_watches():
            return
        self._unwatch()  # a previous fit that ended without on_train_end
        if zero and self._run is None:  # `setup` ran for another stage, or was overridden
            self._run = self._find_run(trainer)
        optimizers = list(trainer.optimizers)
        optimizer = unwrap_optimizer(optimizers[0]) if optimizers else None
        # Every rank measures; only global zero logs (and needs the run): the others publish
        # their statistics to its table (`watch` under torch.distributed).
        options = {**self.watch_options, "run": self._run if zero else None}
        self.handle = watch(self._target(pl_module), self.log_freq, optimizer=optimizer, **options)
        if optimizer is not None:
            start_at_step(self.handle, int(trainer.global_step))
        self._checked_forward = False

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        handle = self.handle
        if handle is None or self._checked_forward:
            return
        self._checked_forward = True
        if training_forwards(handle) == 0:
            warn_at_user(
                f"wandb_modprof: ModProfCallback watches {type(handle.model).__name__}, but the "
                "first training batch never called it in training mode, so no step is counted "
                "or measured. If training_step calls a submodule (self.model(x)) rather than "
                "self(x), watch that one: ModProfCallback(module='model').",
                UserWarning,
            )

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._unwatch()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._unwatch()  # log what was measured; the loggers are finalized after this

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._unwatch()
        self._run = None

    def _unwatch(self) -> None:
        if self.handle is not None and self.handle.active:
            self.handle.unwatch()

    def _target(self, pl_module: nn.Module) -> nn.Module:
        if not self.module:
            return pl_module
        try:
            return pl_module.get_submodule(self.module)
        except AttributeError:
            names = [name for name, _ in pl_module.named_children()]
            raise ModProfError(
                f"ModProfCallback module expected the name of a submodule of "
                f"{type(pl_module).__name__} (children: {', '.join(names) or 'none'}); "
                f"got {self.module!r}"
            ) from None

    def _find_run(self, trainer: Any) -> Any:
        if self.watch_options.get("run") is not None:
            return self.watch_options["run"]
        classes = _wandb_loggers()
        for logger in trainer.loggers:
            if classes and isinstance(logger, classes):
                return cast(Any, logger).experiment  # creates the run if not yet created
        try:
            return current_run(None)
        except ModProfError:
            raise ModProfError(
                "ModProfCallback logs to Weights & Biases and found no run: expected a "
                "WandbLogger among the Trainer's loggers (Trainer(logger=WandbLogger(...))), "
                "ModProfCallback(run=...), or wandb.init() before fit(); got loggers "
                f"[{', '.join(type(logger).__name__ for logger in trainer.loggers)}]"
            ) from None
