"""`on_module`: run your code when one module's forward or backward starts and ends, e.g. to
start and stop `torch.profiler`, `torch.cuda.profiler`, an NVTX range or a memory snapshot
around exactly that module's backward. This is the boundary (arguments checked here); the
hooks and how backward boundaries are found are in `capture.forward.module_callbacks`.
"""

from __future__ import annotations

from torch import nn

from wandb_modprof._errors import ModProfError
from wandb_modprof._validate import check_model
from wandb_modprof.capture.forward.callback_state import Callback, ModuleEvent, Phase
from wandb_modprof.capture.forward.module_callbacks import ModuleCallbacks
from wandb_modprof.capture.step import torch_private as tp

__all__ = ["ModuleCallbacks", "ModuleEvent", "on_module"]


def on_module(
    module: nn.Module,
    *,
    forward_start: Callback | None = None,
    forward_end: Callback | None = None,
    backward_start: Callback | None = None,
    backward_end: Callback | None = None,
) -> ModuleCallbacks:
    """Call functions at one module's forward and backward boundaries, on every call.

    Each callback gets a `ModuleEvent` (phase, call number, module type). Events:

    - `forward_start` / `forward_end`: before and after every forward of the module (also
      eval and `no_grad` ones, and `forward_end` when the forward raised).
    - `backward_start`: just before the first autograd node of that call runs;
      `backward_end`: right after its last one (and its parameters' gradient accumulation).
      A call whose output needs no grad has no backward events. A module called several
      times gets one pair per call. A second backward through a retained graph gets another
      pair (without the gradient accumulation, which went to the first). A call whose
      outputs share no autograd node (two branches returned in a dict) and whose gradients
      arrive at different times gets one pair per stretch, in sequence, same call number.

    Limits, stated plainly:

    - `torch.profiler` started in a backward callback must be created with
      `experimental_config=torch.profiler._ExperimentalConfig(profile_all_threads=True)`:
      the autograd engine restores each node's thread-local state after it runs, so a
      profiler started the ordinary way records nothing (torch 2.13 warns "Leaked callback
      handle"). The first
      node's `autograd::engine::evaluate_function` wrapper began before the profiler, so the
      trace has that node's own event but not its wrapper. Process-wide switches
      (`torch.cuda.profiler.start()`, `torch.cuda.memory._record_memory_history`, NVTX
      `range_start`/`range_end`) need nothing special. Do not open `record_function` ranges
      in one callback and close them in another: that corrupts the profiler's event tree.
    - Activation checkpointing: forwards re-run during backward (checkpoint recomputes) fire
      no events. With `use_reentrant=True` the module's autograd nodes are only created
      during backward, so calls inside such a region have no backward events.
    - A parameter the model also uses before the module (tied embeddings) is accumulated
      after that earlier use's backward: it is left out of the module's window (checked on
      the first call).
    - `torch.compile`: inside a compiled model the hooks cause graph breaks around the
      module (events still fire); hooks added after compiling never fire. Compiling the
      module itself and passing the compiled module keeps it one graph.

    A callback that raises is reported once per phase (RuntimeWarning) and training goes on.

    Returns a `ModuleCallbacks` handle: `.remove()`, or use it as a context manager.

    Examples:
        >>> prof = torch.profiler.profile(                                    # doctest: +SKIP
        ...     activities=[torch.profiler.ProfilerActivity.CPU],
        ...     experimental_config=torch.profiler._ExperimentalConfig(profile_all_threads=True))
        >>> with wandb_modprof.on_module(model.layer3,                        # doctest: +SKIP
        ...                              backward_start=lambda e: prof.start(),
        ...                              backward_end=lambda e: prof.stop()):
        ...     model(x).sum().backward()        # the trace holds layer3's backward only
    """
    check_model(module, "on_module()", "a torch.nn.Module as `module`")
    callbacks: dict[Phase, Callback | None] = {
        "forward_start": forward_start,
        "forward_end": forward_end,
        "backward_start": backward_start,
        "backward_end": backward_end,
    }
    for phase, fn in callbacks.items():
        if fn is not None and not callable(fn):
            raise ModProfError(
                f"on_module() expected `{phase}` to be a callable taking a ModuleEvent, or None; "
                f"got {type(fn).__qualname__}"
            )
    if all(fn is None for fn in callbacks.values()):
        raise ModProfError(
            "on_module() expected at least one of forward_start, forward_end, backward_start, "
            "backward_end; got none"
        )
    tp.check(on_module=True)
    return ModuleCallbacks(module, callbacks)
