"""The Vega spec of the panel (`vega_specs/`, shipped in the wheel) and how data meets it.

W&B fills `${string:NAME:default}` placeholders from `string_fields` and feeds the table's rows
as the dataset `wandb`; `filled` and `with_rows` do the same for everything outside W&B (the
HTML report, static pictures, tests).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

SPEC_FILE = "modprof.vg.json"
SPEC_VERSION = 1
# The W&B preset name (`entity/CHART_NAME`); bump the version with any incompatible change of
# the spec or of the table columns it reads, so old runs keep the preset they were logged with.
CHART_NAME = f"wandb-modprof-v{SPEC_VERSION}"
DATASET = "wandb"
_PLACEHOLDER = re.compile(r"\$\{string:([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


def spec_text() -> str:
    """The spec file as shipped, placeholders unfilled (what is registered with W&B)."""
    folder = resources.files("wandb_modprof").joinpath("vega_specs")
    return folder.joinpath(SPEC_FILE).read_text("utf-8")


def filled(string_fields: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The spec with `${string:NAME:default}` replaced as W&B does (substring replacement)."""
    fields = dict(string_fields or {})

    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        return fields.get(name, default if default is not None else "")

    spec: dict[str, Any] = json.loads(_PLACEHOLDER.sub(sub, spec_text()))
    return spec


def with_rows(
    spec: Mapping[str, Any], columns: Sequence[str], rows: Sequence[Sequence[object]]
) -> dict[str, Any]:
    """A copy of `spec` whose `wandb` dataset holds `rows` inline (outside W&B only)."""
    out = copy.deepcopy(dict(spec))
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    for data in out["data"]:
        if data["name"] == DATASET:
            data["values"] = records
            break
    else:
        raise ValueError(f"the spec has no dataset named {DATASET!r}")
    return out
