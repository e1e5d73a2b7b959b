"""A Hugging Face `transformers.TrainerCallback` that profiles the trained model into the run
of `report_to="wandb"`.

>>> from transformers import Trainer, TrainingArguments                  # doctest: +SKIP
>>> from wandb_modprof.integrations.huggingface import ModProfCallback
>>> args = TrainingArguments("out", report_to="wandb", gradient_accumulation_steps=4)
>>> Trainer(model, args, train_dataset=ds, callbacks=[ModProfCallback(log_freq=100)]).train()

What it does (world process zero only, `state.is_world_process_zero`; other processes do
nothing):

- `on_train_begin`: `watch(model, log_freq, run, optimizer)` on the model the Trainer trains
  (its `model`, not the DDP / accelerate wrapper around it), with the run `wandb.run` (or
  `run=`). The Trainer runs its own callbacks, `WandbCallback` among them, before the ones
  passed in `callbacks=`, and `WandbCallback.on_train_begin` is where `wandb.init` happens, so
  the run exists by then; without one (no `report_to="wandb"`, no `wandb.init()`) training
  stops at once with `ModProfError` saying how to get one.
- Steps are optimizer steps as `state.global_step` counts them: the optimizer is accelerate's
  `AcceleratedOptimizer`, whose inner torch optimizer steps once per
  `gradient_accumulation_steps` micro-batches (and not at all on a step the AMP scaler skips),
  so the first micro-batch of every `log_freq`-th optimizer step is sampled. A resumed run
  counts on from its checkpoint's global step.
- `on_train_end`: `unwatch()`, which logs the last sample and the HTML report. transformers
  (5.x) never finishes the W&B run at the end of `train()` (the run ends with the process or
  your `wandb.finish()`), so the run is still open. If `train()` raises, the hooks stay until
  the next `train()` with this callback, `handle.unwatch()` or `wandb_modprof.unwatch()`.

Distributed training (a torch.distributed process group of more than one rank): every process
watches its replica; only world process zero logs, and its table gains the other ranks'
statistics (`rank_*` columns, the panel's rank imbalance mode). Without a process group only
process zero watches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from wandb_modprof._errors import ModProfError
from wandb_modprof.api.watch import watch
from wandb_modprof.api.watch_handle import WatchHandle
from wandb_modprof.integrations import (
    check_watch_options,
    import_framework,
    other_rank_watches,
    start_at_step,
    unwrap_optimizer,
)
from wandb_modprof.sinks.wandb.wandb_run import current_run

(_TRANSFORMERS,) = import_framework(("transformers",), "Hugging Face transformers", "huggingface")
if TYPE_CHECKING:
    _TrainerCallback = object
else:
    _TrainerCallback = _TRANSFORMERS.TrainerCallback


class ModProfCallback(_TrainerCallback):
    """Profile the model on every `log_freq`-th optimizer step into the W&B run of
    `report_to="wandb"`, and unwatch when training ends (see the module docstring).

    A `transformers.TrainerCallback`.

    Args:
        log_freq: sample every `log_freq`-th optimizer step (`state.global_step`).

    Keyword Args:
        **watch_options: passed to `wandb_modprof.watch` (`run`, `timing`, `activations`,
            `norms`, `structure`, `nvtx`, `default_mode`, `default_scale`, `chart`); `run`
            overrides `wandb.run`.

    After training, `handle` is the `WatchHandle` of the last `train()` (None before, and on
    processes that do not watch): `callback.handle.profile().summary()`.

    Examples:
        >>> Trainer(model, args, callbacks=[ModProfCallback(log_freq=50)])   # doctest: +SKIP
    """

    def __init__(self, log_freq: int = 100, **watch_options: Any) -> None:
        self.log_freq = check_watch_options("ModProfCallback", log_freq, watch_options)
        self.watch_options = watch_options
        self.handle: WatchHandle | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        zero = state.is_world_process_zero
        if not zero and not other_rank_watches():
            return
        self._unwatch()  # a previous train() that raised before on_train_end
        model = kwargs.get("model")
        if not isinstance(model, nn.Module):
            raise ModProfError(
                "ModProfCallback expected the Trainer to pass its model (a torch.nn.Module) to "
                f"on_train_begin; got {type(model).__qualname__}"
            )
        optimizer = unwrap_optimizer(kwargs.get("optimizer"))
        # Every rank measures; only process zero logs (and needs the run): the others publish
        # their statistics to its table (`watch` under torch.distributed).
        options = {**self.watch_options, "run": self._find_run(args) if zero else None}
        self.handle = watch(model, self.log_freq, optimizer=optimizer, **options)
        if optimizer is not None:
            start_at_step(self.handle, int(state.global_step))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unwatch()

    def _unwatch(self) -> None:
        if self.handle is not None and self.handle.active:
            self.handle.unwatch()

    def _find_run(self, args: Any) -> Any:
        if self.watch_options.get("run") is not None:
            return self.watch_options["run"]
        try:
            return current_run(None)
        except ModProfError:
            raise ModProfError(
                "ModProfCallback logs to Weights & Biases and found no run: expected "
                "TrainingArguments(report_to='wandb') (or wandb.init() before train()); got "
                f"report_to={getattr(args, 'report_to', None)!r}"
            ) from None
