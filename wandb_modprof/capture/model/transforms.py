"""`torch.func`: which calls are profiled and which are refused, and what the user is told.

`torch.func.functional_call(model, params, args)` on its own swaps the given tensors into the
model for one call: an ordinary forward, profiled as usual (the model index is built from the
tensors in place, so their bytes, gradients and norms are read). Under a transform (`vmap`,
`grad`, `jacrev`, `jvp`, `functionalize`: a `stack_module_state` ensemble, per-sample
gradients) the forward runs on functorch's wrapper tensors, which have no storage to size and
whose autograd graph is the transform's, so such a step is counted and not measured
(`root_hooks.RootHooks._skip_transformed_step`, which warns once:
`root_hooks.under_transform_text`).

A model whose parameters are on the meta device (an ensemble's base module) has no data to run
on its own, and no device whose clock and memory could be read: refused at `watch` / `profile`.
"""

from __future__ import annotations

import torch

from wandb_modprof._errors import ModProfError


def refuse_meta_model(model_type: str, device: torch.device) -> None:
    """Raise `ModProfError` for a model on the meta device (`device`: its first parameter's)."""
    if device.type != "meta":
        return
    raise ModProfError(
        f"{model_type}'s parameters are on the meta device (no data), so it cannot be profiled "
        "itself: a meta module runs only through torch.func.functional_call with other "
        "tensors, e.g. as the base of a torch.func.stack_module_state ensemble under "
        "torch.vmap, and calls under torch.func transforms (vmap, grad, jacrev, jvp, "
        "functionalize) are not profiled. Profile a model with real parameters instead (e.g. "
        "one member of the ensemble, called directly)."
    )
