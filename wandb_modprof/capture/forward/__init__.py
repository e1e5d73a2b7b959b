"""What a module call records in the forward, and the per-call hooks of `on_module`.

`Invocation` is one module call of a sampled step's forward and `Recompute` one run again by
activation checkpointing (`invocation`, which also finds the autograd nodes of an output); the
call keys that name the same work on every step (`call_keys`); which module calls are open on
the Python stack (`callstack`); `on_module`'s engine (`module_callbacks`, its backward half
`callback_backward`) and what its callbacks receive (`callback_state`). The step session
(`capture/session.py`) fills the invocations as calls enter and return. May import
`capture.step`, the leaves at the top of `capture/` (`options`, `inert_hook`), `records` and
the base modules.
"""
