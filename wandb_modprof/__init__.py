"""wandb_modprof: per-module forward/backward time and memory for PyTorch models.

>>> import wandb_modprof                                         # doctest: +SKIP
>>> handle = wandb_modprof.watch(model, log_freq=100)            # after wandb.init()
>>> with wandb_modprof.profile(model) as prof:                   # one-shot
...     model(x).sum().backward()
>>> print(prof.summary())
>>> prof.save("run.modprof.json"); wandb_modprof.load("run.modprof.json")
"""

from wandb_modprof._errors import ModProfError
from wandb_modprof._version import __version__
from wandb_modprof.api.callbacks import ModuleCallbacks, ModuleEvent, on_module
from wandb_modprof.api.checkpoint_apply import apply_checkpoint_plan
from wandb_modprof.api.profile import Profile
from wandb_modprof.api.profile_block import ProfileBlock, profile
from wandb_modprof.api.profile_load import load
from wandb_modprof.api.regression import check_regression
from wandb_modprof.api.settings import Settings
from wandb_modprof.api.watch import unwatch, watch
from wandb_modprof.api.watch_handle import WatchHandle
from wandb_modprof.records.calls import CallInfo as CallInfo
from wandb_modprof.records.calls import DataEdge as DataEdge
from wandb_modprof.records.calls import Structure as Structure
from wandb_modprof.records.checkpoint import CheckpointPlan as CheckpointPlan
from wandb_modprof.records.sample import METRICS as METRICS
from wandb_modprof.records.sample import BackwardRun as BackwardRun
from wandb_modprof.records.sample import InvocationRecord as InvocationRecord
from wandb_modprof.records.sample import ModuleStats as ModuleStats
from wandb_modprof.records.sample import RunningStat as RunningStat
from wandb_modprof.records.sample import Sample as Sample
from wandb_modprof.records.sample import StepTotals as StepTotals
from wandb_modprof.sinks.report.html import write_report
from wandb_modprof.sinks.text.regression import RegressionCheck
from wandb_modprof.sinks.wandb.chart import register_chart

# What users call and what they read first. The record types the profile's methods return
# (`Sample`, `ModuleStats`, `InvocationRecord`, ...) stay importable from here (the explicit
# re-exports above) and from their modules (`wandb_modprof.records.*`), without being listed.
__all__ = [
    "ModProfError",
    "ModuleCallbacks",
    "ModuleEvent",
    "Profile",
    "ProfileBlock",
    "RegressionCheck",
    "Settings",
    "WatchHandle",
    "__version__",
    "apply_checkpoint_plan",
    "check_regression",
    "load",
    "on_module",
    "profile",
    "register_chart",
    "unwatch",
    "watch",
    "write_report",
]
