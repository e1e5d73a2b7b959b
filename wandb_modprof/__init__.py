"""wandb_modprof: per-module forward/backward time and memory for PyTorch models.

>>> import wandb_modprof                                         # doctest: +SKIP
>>> handle = wandb_modprof.watch(model, log_freq=100)            # after wandb.init()
>>> with wandb_modprof.profile(model) as prof:                   # one-shot
...     model(x).sum().backward()
>>> print(prof.summary())
>>> prof.save("run.modprof.json"); wandb_modprof.load("run.modprof.json")
"""

from ._callbacks import ModuleCallbacks, ModuleEvent, on_module
from ._chart import register_chart
from ._errors import ModProfError
from ._html import write_report
from ._profile import Profile
from ._profile_block import ProfileBlock, profile
from ._profile_file import load
from ._records import (
    METRICS,
    BackwardRun,
    InvocationRecord,
    ModuleStats,
    RunningStat,
    Sample,
    StepTotals,
)
from ._structure import CallInfo, DataEdge, Structure
from ._watch import WatchHandle, unwatch, watch

__version__ = "0.1.0"

__all__ = [
    "METRICS",
    "BackwardRun",
    "CallInfo",
    "DataEdge",
    "InvocationRecord",
    "ModProfError",
    "ModuleCallbacks",
    "ModuleEvent",
    "ModuleStats",
    "Profile",
    "ProfileBlock",
    "RunningStat",
    "Sample",
    "StepTotals",
    "Structure",
    "WatchHandle",
    "__version__",
    "load",
    "on_module",
    "profile",
    "register_chart",
    "unwatch",
    "watch",
    "write_report",
]
