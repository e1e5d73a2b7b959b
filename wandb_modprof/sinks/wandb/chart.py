"""Register the panel's Vega spec with W&B as a custom chart preset, once per entity.

>>> wandb_modprof.register_chart("my-team")                # doctest: +SKIP
'my-team/wandb-modprof-v4'

or from a shell: `wandb-modprof register-chart --entity my-team`. `watch` logs its panels with
the preset `<run entity>/wandb-modprof-v4`; the preset is what turns the logged tables into
the module-graph panel in the W&B UI. Registering needs network and an API key (`wandb login`
or `WANDB_API_KEY`); offline runs can be logged first and the preset registered before
`wandb sync`.

W&B's SDK (0.31) can create a preset but not list, update or delete one; what the server does
with a name that already exists is not documented (and could not be tried here). The spec
version is in the name (`wandb-modprof-v4`) so an incompatible spec gets a new preset instead
of changing the one old runs were logged with.
"""

from __future__ import annotations

from typing import Any

from wandb_modprof._errors import ModProfError
from wandb_modprof._validate import check_preset_part
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.spec import CHART_NAME

# Each W&B request waits at most this long. The SDK's own default (20 s, and more with its
# retries) made `register-chart` with an API key but no network sit for 20-27 s before failing.
TIMEOUT_S = 8


def _new_api() -> Any:
    """`wandb.Api()` (the factory tests and the CLI tests replace: creating needs network)."""
    import wandb

    return wandb.Api(timeout=TIMEOUT_S)


def register_chart(
    entity: str | None = None,
    *,
    name: str = CHART_NAME,
    display_name: str = "wandb_modprof module graph",
    public: bool = False,
    api: Any = None,
) -> str:
    """Create the W&B chart preset `entity/name` holding the panel's spec; return that name.

    Args:
        entity: the W&B user or team owning the preset (default: the API key's default entity).
            Register it for the entity your runs log to.
        name: the preset name (default `wandb-modprof-v4`, what `watch` uses unless given
            `chart=`).
        display_name: the name shown in the W&B UI.
        public: "public" access instead of "private" (only the entity's members can use it).
        api: a `wandb.Api` to use (default: a new one).

    Raises:
        ModProfError: when no API key is configured, the entity is unknown, W&B refuses, or
            W&B does not answer within `TIMEOUT_S` (8 s) per request (no network).

    Examples:
        >>> wandb_modprof.register_chart()                          # your default entity
        'me/wandb-modprof-v4'
    """
    if entity is not None:
        check_preset_part("entity", entity)
    check_preset_part("name", name)
    if not isinstance(display_name, str) or not display_name:
        raise ModProfError(f"display_name expected a non-empty str; got {display_name!r}")
    if not isinstance(public, bool):
        raise ModProfError(f"public must be True or False; got {public!r}")
    try:
        if api is None:
            api = _new_api()
        owner = entity or api.default_entity
    except Exception as error:
        raise ModProfError(_failure(entity or "", name, error)) from None
    if not owner:
        raise ModProfError(
            "register_chart() could not find a default W&B entity for this API key; "
            "pass entity='your-user-or-team' (--entity in the CLI)"
        )
    try:
        created = api.create_custom_chart(
            entity=owner,
            name=name,
            display_name=display_name,
            spec_type="vega2",
            access="public" if public else "private",
            spec=_spec.spec_text(),
        )
    except Exception as error:
        raise ModProfError(_failure(owner, name, error)) from None
    return created if isinstance(created, str) and created else f"{owner}/{name}"


def _failure(entity: str, name: str, error: Exception) -> str:
    what = (
        f"the chart preset '{entity}/{name}'"
        if entity
        else f"the chart preset '{name}' for the default entity of your API key (not read)"
    )
    text = (
        f"could not register {what} with W&B ({type(error).__name__}: {error}; each request "
        f"waits at most {TIMEOUT_S} s)"
    )
    if "api key" in str(error).lower():
        return f"{text}; log in first: run `wandb login` or set WANDB_API_KEY"
    return (
        f"{text}. Check the network, the API key (`wandb login` or WANDB_API_KEY) and that "
        "you are a member of the entity; if the preset exists already, it can be used as is "
        "(W&B cannot update presets: pass another --name / name= for a changed spec)"
    )
