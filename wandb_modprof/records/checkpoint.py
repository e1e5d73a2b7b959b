"""An activation-checkpointing plan: which modules to recompute in backward, and what that is
predicted to save and cost.

Plain frozen data (no torch): made by `view.checkpoint_plan.checkpoint_plan` from a profile,
written as JSON (`to_json`: builtins with a format and version field) and applied to a model by
`wandb_modprof.apply_checkpoint_plan`.

>>> call = PlannedCall("blocks.0#0", "blocks.0", "Block", 4096, 1.5, "frees 4 KiB")
>>> plan = CheckpointPlan(8192, 12288, 8192, 11.5, 10.0, 1024, (call,), (("<root>#0", "root"),))
>>> CheckpointPlan.from_json(plan.to_json()) == plan
True
>>> plan.module_names
('blocks.0',)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from wandb_modprof._errors import ModProfError

# Where a module stands in the plan the table carries (`view.checkpoint_cells`; the table's
# `ckpt_state` holds 1 + the index): chosen, a candidate not chosen, or left out and why.
STATES = ("planned", "candidate", "root", "shared", "inside", "unmeasured")
STATE_TEXT = {
    "planned": "checkpointed in the plan",
    "candidate": "not in the plan (a cheaper choice fits)",
    "root": "the model itself: never checkpointed",
    "shared": "left out: called from several modules",
    "inside": "left out: inside a module called from several",
    "unmeasured": "left out: no activation bytes or forward time",
}

PLAN_FORMAT = "wandb_modprof.checkpoint_plan"
PLAN_VERSION = 1


@dataclass(frozen=True)
class PlannedCall:
    """One module to checkpoint. Wrapping is per module, so every call of it in a step is
    recomputed: `calls` says how many, and `bytes_freed` / `recompute_ms` sum over them.

    `key` is the module's first call key (`"blocks.0#0"`); `module_type` its class name as the
    profile recorded it (`apply_checkpoint_plan` refuses a model whose module of that name is
    of another class; "" in an entry written by hand: checked by name only); `bytes_freed` the
    activation bytes the plan expects to be released (`act_bytes` less what checkpointing
    keeps: see `view.checkpoint_plan`); `recompute_ms` the inclusive forward time (`fwd_ms`)
    that the backward pays again; `why` one line saying so in words."""

    key: str
    module_name: str
    module_type: str
    bytes_freed: int
    recompute_ms: float
    why: str
    calls: int = 1


@dataclass(frozen=True)
class CheckpointPlan:
    """The modules to checkpoint to fit activation memory into `budget_bytes`.

    `activation_bytes_now`: the root call's `act_bytes` in the profile. The prediction:
    `predicted_activation_bytes` = now less the planned calls' `bytes_freed`, and
    `predicted_step_ms` = `step_ms_now` (the root's forward + backward) plus their
    `recompute_ms` plus `checkpoint_call_ms` (what torch's checkpointing itself costs per
    call beyond the recompute, measured on the host that planned:
    `capture.backward.checkpoint_cost`; 0 in plans written before it) for each planned call.
    `margin_bytes` is the part of the prediction that rests on an estimate
    rather than a measurement: the inputs and shared outputs that checkpointing keeps, sized
    from the first and last saves of each planned call (`view.checkpoint_plan`); the realised
    activation bytes are expected within that of the prediction. Not covered: tensor
    arguments the call's subtree never saved (an attention mask), which the checkpoint keeps
    as well. `excluded` lists `(call key, reason)` for calls the plan refused to consider (the
    root, a module called from several places, nothing measured).

    `peak_bytes_now`: the root's memory peak, the larger of its forward and backward peaks
    (`fwd_mem_peak_bytes`, `bwd_mem_peak_bytes`: each above what was live as it started; on
    CPU the peak of the saved-tensor memory curve); `predicted_peak_bytes`: the forward peak
    less the bytes freed, or the backward peak if larger (the plan does not lower it, and the
    recompute runs in it). None where the profile has no peak (plans written before them)."""

    budget_bytes: int
    activation_bytes_now: int
    predicted_activation_bytes: int
    predicted_step_ms: float
    step_ms_now: float
    margin_bytes: int
    calls: tuple[PlannedCall, ...]
    excluded: tuple[tuple[str, str], ...]
    model_name: str = ""
    peak_bytes_now: int | None = None
    predicted_peak_bytes: int | None = None
    checkpoint_call_ms: float = 0.0

    @property
    def module_names(self) -> tuple[str, ...]:
        """The qualified names of the modules whose forward the plan wraps."""
        return tuple(c.module_name for c in self.calls)

    @property
    def recompute_ms(self) -> float:
        """The backward time the plan adds: the sum of the planned calls' `recompute_ms`."""
        return sum(c.recompute_ms for c in self.calls)

    @property
    def checkpoint_ms(self) -> float:
        """The backward and forward time checkpointing itself adds beyond the recomputes:
        `checkpoint_call_ms` for each planned call."""
        return self.checkpoint_call_ms * sum(c.calls for c in self.calls)

    def to_json(self) -> dict[str, Any]:
        """Plain builtins (`json.dumps` takes them), with `format` and `version` fields."""
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "model_name": self.model_name,
            "budget_bytes": self.budget_bytes,
            "activation_bytes_now": self.activation_bytes_now,
            "predicted_activation_bytes": self.predicted_activation_bytes,
            "predicted_step_ms": self.predicted_step_ms,
            "step_ms_now": self.step_ms_now,
            "margin_bytes": self.margin_bytes,
            "peak_bytes_now": self.peak_bytes_now,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "checkpoint_call_ms": self.checkpoint_call_ms,
            "calls": [
                {
                    "key": c.key,
                    "module_name": c.module_name,
                    "module_type": c.module_type,
                    "bytes_freed": c.bytes_freed,
                    "recompute_ms": c.recompute_ms,
                    "why": c.why,
                    "calls": c.calls,
                }
                for c in self.calls
            ],
            "excluded": [{"key": key, "reason": reason} for key, reason in self.excluded],
        }

    @classmethod
    def from_json(cls, data: object, where: str = "checkpoint plan") -> CheckpointPlan:
        """The plan `to_json` wrote; anything else raises `ModProfError` naming the field
        (its JSON path in `where`), what was expected and what was found."""
        top = _mapping(data, where)
        if top.get("format") != PLAN_FORMAT:
            _bad(where + ".format", repr(PLAN_FORMAT), top.get("format"))
        if top.get("version") != PLAN_VERSION:
            _bad(where + ".version", str(PLAN_VERSION), top.get("version"))
        calls = []
        for i, item in enumerate(_list(top, "calls", where)):
            at = f"{where}.calls[{i}]"
            entry = _mapping(item, at)
            calls.append(
                PlannedCall(
                    key=_str(entry, "key", at),
                    module_name=_str(entry, "module_name", at),
                    module_type=_str(entry, "module_type", at),
                    bytes_freed=_int(entry, "bytes_freed", at),
                    recompute_ms=_float(entry, "recompute_ms", at),
                    why=_str(entry, "why", at),
                    calls=_int(entry, "calls", at),
                )
            )
        excluded = []
        for i, item in enumerate(_list(top, "excluded", where)):
            at = f"{where}.excluded[{i}]"
            entry = _mapping(item, at)
            excluded.append((_str(entry, "key", at), _str(entry, "reason", at)))
        return cls(
            budget_bytes=_int(top, "budget_bytes", where),
            activation_bytes_now=_int(top, "activation_bytes_now", where),
            predicted_activation_bytes=_int(top, "predicted_activation_bytes", where),
            predicted_step_ms=_float(top, "predicted_step_ms", where),
            step_ms_now=_float(top, "step_ms_now", where),
            margin_bytes=_int(top, "margin_bytes", where),
            calls=tuple(calls),
            excluded=tuple(excluded),
            model_name=_str(top, "model_name", where),
            peak_bytes_now=_optional_int(top, "peak_bytes_now", where),
            predicted_peak_bytes=_optional_int(top, "predicted_peak_bytes", where),
            checkpoint_call_ms=(
                _float(top, "checkpoint_call_ms", where) if "checkpoint_call_ms" in top else 0.0
            ),
        )


def _bad(where: str, expected: str, got: object) -> NoReturn:
    shown = repr(got) if len(repr(got)) <= 80 else f"a {type(got).__name__}"
    raise ModProfError(f"{where}: expected {expected}; got {shown}")


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        _bad(where, "a JSON object", value)
    return value


def _list(data: Mapping[str, Any], name: str, where: str) -> list[Any]:
    value = data.get(name)
    if not isinstance(value, list):
        _bad(f"{where}.{name}", "a JSON list", value)
    return value


def _str(data: Mapping[str, Any], name: str, where: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        _bad(f"{where}.{name}", "a string", value)
    return value


def _int(data: Mapping[str, Any], name: str, where: str) -> int:
    value = data.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        _bad(f"{where}.{name}", "an integer", value)
    return value


def _optional_int(data: Mapping[str, Any], name: str, where: str) -> int | None:
    """Absent or null: None (plans written before the field existed)."""
    return None if data.get(name) is None else _int(data, name, where)


def _float(data: Mapping[str, Any], name: str, where: str) -> float:
    value = data.get(name)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        _bad(f"{where}.{name}", "a number", value)
    return float(value)
