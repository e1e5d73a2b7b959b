"""Compatibility for models saved while watched, before the stage layout (wandb_modprof 0.1).

`torch.save(model)` of a watched model pickles its hook dicts, whose entries unpickle as an
inert no-op hook (`capture.inert_hook`); files written before the package was split into
stages name that function `wandb_modprof._capture._inert_hook`, so the name stays loadable.
"""

from wandb_modprof.capture.inert_hook import inert_hook as _inert_hook

__all__ = ["_inert_hook"]
