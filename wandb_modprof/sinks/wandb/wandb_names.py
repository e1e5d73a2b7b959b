"""What a W&B log is filed under: the key of a watched model in its run (`modprof/<Class>`,
`_1`, `_2` ... for further models of that class), the chart preset it is logged with (and the
offline notice that names the command to register it), and the artifact the profile file goes
into (`modprof-<run id>-<Class>`). The log itself is `wandb_log`.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from torch import nn

from wandb_modprof._warn import entry_point, warn_at_user
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.sinks import spec as _spec

KEY_PREFIX = "modprof"
ARTIFACT_TYPE = "modprof-profile"
PROFILE_FILE = "profile.modprof.json"  # the file's name inside the artifact
# Keys handed out per run (weakly held): distinct keys for same-class models, kept after
# `unwatch` so a later model never overwrites an earlier one's panel.
_RUN_KEYS: weakref.WeakKeyDictionary[Any, list[tuple[str, weakref.ref[nn.Module]]]] = (
    weakref.WeakKeyDictionary()
)
# One notice per process per kind ("offline"): it names a command to run once, not per model.
_NOTICES: set[str] = set()
# How a user gives the run an entity, by the entry point they came through (`entry_point`):
# Lightning and Trainer users never call wandb.init themselves.
_ENTITY_FIX = {
    "watch": "wandb.init(entity=E) or WANDB_ENTITY=E",
    "lightning": "WandbLogger(entity=E) or WANDB_ENTITY=E",
    "huggingface": "WANDB_ENTITY=E in the environment (report_to='wandb' reads it)",
}


def model_key(run: Any, model: nn.Module) -> str:
    """`modprof/<Class>`, suffixed `_1`, `_2` ... for further models of that class in `run`."""
    base = f"{KEY_PREFIX}/{type_name(model)}"
    try:
        taken = _RUN_KEYS.setdefault(run, [])
    except TypeError:  # a run object that cannot be weakly referenced: no registry
        return base
    for key, ref in taken:
        if ref() is model:
            return key
    names = {key for key, _ in taken}
    key, n = base, 0
    while key in names:
        n += 1
        key = f"{base}_{n}"
    taken.append((key, weakref.ref(model)))
    return key


def run_flag(run: Any, name: str) -> bool:
    """The run's boolean attribute `name` ("disabled", "offline"), False where reading it fails."""
    try:
        return bool(getattr(run, name, False))
    except Exception:  # a property of a finished or foreign run object
        return False


def _run_entity(run: Any) -> str:
    try:
        entity = getattr(run, "entity", "")
    except Exception:
        entity = ""
    return entity if isinstance(entity, str) and entity else os.environ.get("WANDB_ENTITY", "")


def _run_name(run: Any) -> str:
    try:
        return str(getattr(run, "id", None) or getattr(run, "name", None) or "?")
    except Exception:
        return "?"


def chart_name(run: Any, chart: str | None, key: str) -> str | None:
    """The preset to log with (None: tables only), emitting the offline notice once."""
    if run_flag(run, "disabled"):
        return chart or f"{_run_entity(run) or 'dummy'}/{_spec.CHART_NAME}"
    entity = chart.split("/")[0] if chart is not None else _run_entity(run)
    name = chart or (f"{entity}/{_spec.CHART_NAME}" if entity else None)
    if run_flag(run, "offline") and "offline" not in _NOTICES:
        _NOTICES.add("offline")
        run_id = _run_name(run)
        if name is None:
            text = (
                f"wandb_modprof: run {run_id} is offline and has no W&B entity, so {key} is logged "
                f"as its table alone ({key}_table), without the panel.\n"
                f"For the panel: {_ENTITY_FIX[entry_point()]}, then register the preset once: "
                "`wandb-modprof register-chart --entity E`."
            )
        else:
            more = "" if name.endswith(f"/{_spec.CHART_NAME}") else f" --name {name.split('/')[1]}"
            text = (
                f"wandb_modprof: run {run_id} is offline; its modprof panels use the W&B chart "
                f"preset '{name}'.\n"
                f"Before `wandb sync`, register it once: `wandb-modprof register-chart "
                f"--entity {entity}{more}`."
            )
        warn_at_user(text, UserWarning)  # at the user's watch() / fit() / train() line
    return name


def artifact_name(run: Any, key: str) -> str:
    """`modprof-<run id>-<Class>` for the key `modprof/<Class>`: artifact names are per
    project, so the run id keeps two runs' profiles apart (W&B allows letters, digits, `-`,
    `_` and `.`; anything else becomes `_`)."""
    raw = f"{KEY_PREFIX}-{_run_name(run)}-{key.removeprefix(KEY_PREFIX + '/')}"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)
