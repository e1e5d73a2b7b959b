"""The static-memory records under their path before `capture/` was split by what it
captures: `stats/accumulator.py` names them here (for types only) until it imports them from
`capture.memory.static_memory`, where they live. Nothing in `capture/` imports this module.
"""

from wandb_modprof.capture.memory.static_memory import PendingGradientState, StaticMemory

__all__ = ["PendingGradientState", "StaticMemory"]
