"""`Settings`: the choices of `watch` and `profile` that the product makes by itself and a few
experts change, in one object, so that the two calls keep the arguments every user sets.

`watch(model, settings=Settings(timing="device", offload=False))` or
`profile(model, settings=Settings(warmup=2))`. The fields `watch` took as keyword arguments
before 0.2 still work there, with one warning per argument naming the replacement
(`moved_to_settings`); `profile` takes the same fields but the five that only concern a W&B run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from wandb_modprof._errors import ModProfError
from wandb_modprof._warn import warn_at_user
from wandb_modprof.api.overhead import DEFAULT_OVERHEAD
from wandb_modprof.capture.options import Options, parse_options
from wandb_modprof.records.modes import DEFAULT_MODE, DEFAULT_SCALE

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Settings:
    """Settings for experts, shared by `watch` and `profile` (the defaults suit nearly every
    run; every value is checked where it is used, with the same errors as before).

    Attributes:
        timing: "auto" (host clock on CPU, device events on accelerators), "cpu" or "device".
        warmup: the model's first `warmup` training steps run untimed (counted, never sampled).
            With 0 (default), a first sample that is the model's first step in the process is
            marked so (`Sample.cold_start`) and left out of the statistics once a later
            sample exists.
        nvtx: on sampled steps, emit NVTX ranges `<module>.forward` / `<module>.backward` for
            Nsight Systems (needs a CUDA build of torch).
        peak_flops: the peak FLOP/s each call's efficiency (the "eff" mode) is measured
            against. None (default): a GEMM calibrated once per process on CPU, the data
            sheet on common GPUs (`capture.structure.calibration`).
        peak_bw: the peak memory bytes/s of that roofline; None: calibrated likewise.
        offload: `watch` only. Where the work after a sample (resolve, statistics, table)
            runs: "auto" (default) in a worker process from 1,000 module calls a sample, True
            always there, False on the training thread (`api.sample_handoff`).
        overhead: `watch` only. With `log_freq="auto"`, the share of training time sampling
            may take (default 0.01).
        chart: `watch` only. The W&B chart preset "entity/name" (from `register_chart`);
            default `<run entity>/wandb-modprof-v4`.
        default_mode: `watch` only. What the panel colours nodes by when opened (one of
            `records.modes.MODE_KEYS`).
        default_scale: `watch` only. The panel's initial colour scale, "linear" or "log".
    """

    timing: str = "auto"
    warmup: int = 0
    nvtx: bool = False
    peak_flops: float | None = None
    peak_bw: float | None = None
    offload: bool | str = "auto"
    overhead: float = DEFAULT_OVERHEAD
    chart: str | None = None
    default_mode: str = DEFAULT_MODE
    default_scale: str = DEFAULT_SCALE


# the fields that mean something only to a watched model's W&B run
WATCH_ONLY = ("offload", "overhead", "chart", "default_mode", "default_scale")
FIELDS = tuple(f.name for f in dataclasses.fields(Settings))
PROFILE_FIELDS = tuple(name for name in FIELDS if name not in WATCH_ONLY)
_DEFAULTS = Settings()


def check_settings(value: object, where: str) -> Settings:
    """`settings=` as given to `where` ("watch()" / "profile()"): None means the defaults;
    `profile()` refuses the fields that only `watch` uses."""
    if value is None:
        return _DEFAULTS
    if not isinstance(value, Settings):
        raise ModProfError(
            f"{where} settings expected a wandb_modprof.Settings or None; got "
            f"{type(value).__qualname__}"
        )
    if where == "profile()":
        set_here = [n for n in WATCH_ONLY if getattr(value, n) != getattr(_DEFAULTS, n)]
        if set_here:
            raise ModProfError(
                f"profile() settings expected only fields a profile block uses "
                f"({', '.join(PROFILE_FIELDS)}); got "
                f"{', '.join(set_here)}, which concern watch() and its W&B run only"
            )
    return value


def capture_options(given: Settings, *, activations: bool, norms: bool, structure: bool) -> Options:
    """The capture's options from `watch` / `profile`'s own arguments and their `Settings`
    (checked by `check_settings`)."""
    return parse_options(
        timing=given.timing,
        activations=activations,
        norms=norms,
        structure=structure,
        nvtx=given.nvtx,
        warmup=given.warmup,
        peak_flops=given.peak_flops,
        peak_bw=given.peak_bw,
    )


def moved_text(where: str, name: str) -> str:
    """The warning for a keyword argument of `where` that moved into `Settings`."""
    return (
        f"wandb_modprof: {where}({name}=...) is deprecated and will be removed; pass "
        f"{where}(..., settings=wandb_modprof.Settings({name}=...)) instead."
    )


_told: set[tuple[str, str]] = set()  # (function, argument) pairs warned about, once each


def moved_to_settings(where: str, given: Mapping[str, Any], settings: object) -> Settings:
    """`settings` with the keyword arguments `given` that moved into `Settings` (each warned
    about once per process); one set both ways raises."""
    base = check_settings(settings, f"{where}()")
    for name in given:
        if (where, name) not in _told:
            _told.add((where, name))
            warn_at_user(moved_text(where, name), FutureWarning)
    twice = [n for n in given if getattr(base, n) != getattr(_DEFAULTS, n)]
    if twice:
        raise ModProfError(
            f"{where}() expected {', '.join(twice)} once, in settings=Settings(...); got it "
            "both there and as a keyword argument"
        )
    return dataclasses.replace(base, **dict(given))


def accepts_moved(where: str, moved: tuple[str, ...]) -> Callable[[F], F]:
    """Let `where`'s function take the keyword arguments `moved` (now `Settings` fields) as
    before, with `moved_to_settings`'s warning; its signature shows the current parameters."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in moved if name in kwargs}
            if given:
                kwargs["settings"] = moved_to_settings(where, given, kwargs.get("settings"))
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return decorate
