"""`wandb_modprof.check_regression`: the regression gate of `wandb-modprof compare --fail-above`
for test suites (the rules: `sinks/text/regression.py`).

>>> check = wandb_modprof.check_regression("base.modprof.json", prof)  # doctest: +SKIP
>>> assert check.passed, check.format()                                # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.snapshot import ProfileData, SupportsSnapshot
from wandb_modprof.sinks.text.regression import RegressionCheck, regression_check

if TYPE_CHECKING:
    from wandb_modprof.api.profile import Profile


def check_regression(
    base: Profile | ProfileData | str | os.PathLike[str],
    new: Profile | ProfileData | str | os.PathLike[str],
    fail_above: float = 1.10,
    *,
    mode: str = "fwd_bwd",
    min_share: float = 0.01,
) -> RegressionCheck:
    """Did any module call of `new` get slower (or bigger, per `mode`) than `fail_above` times
    its value in `base`? Each of `base` and `new` is a profile, its `snapshot()`, or the path of
    a `*.modprof.json` file. Only calls holding at least `min_share` of the model total (in
    either) count, judged on each side's fastest sample, which a busy machine or one slow
    outlier moves far less than the median (`sinks/text/regression.py` says why). `check.passed`,
    `check.regressed` (the offenders), `check.format()` (what the command line prints)."""
    a, label_a = _profile(base, "base")
    b, label_b = _profile(new, "new")
    return regression_check(a, b, fail_above, mode, min_share, label_a, label_b)


def _profile(
    value: Profile | ProfileData | str | os.PathLike[str], name: str
) -> tuple[ProfileData | SupportsSnapshot, str]:
    if isinstance(value, (str, os.PathLike)):
        from wandb_modprof.api.profile_load import load

        return load(value), Path(value).name
    if isinstance(value, (ProfileData, SupportsSnapshot)):
        return value, name
    raise ModProfError(
        f"check_regression() {name} expected a wandb_modprof.Profile, its snapshot() or the "
        f"path of a .modprof.json file; got {type(value).__name__}"
    )
