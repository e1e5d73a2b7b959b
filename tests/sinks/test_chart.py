"""`register_chart` / `wandb-modprof register-chart`: the panel's spec as a W&B chart preset.

Creating a preset needs network, so `wandb.Api().create_custom_chart` is the one thing
replaced here (by a recording fake); the no-API-key path runs the real SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any
from unittest import mock

import pytest
import wandb

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.api import cli as _cli
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.wandb import chart as _chart


def FakeApi(default_entity: str | None = "me", error: Exception | None = None) -> Any:  # noqa: N802
    """A `wandb.Api` stand-in built from the real class (`mock.create_autospec`: its methods and
    signatures, no others) whose `create_custom_chart` records its keyword arguments in `.calls`
    and raises `error` if given."""
    api = mock.create_autospec(wandb.Api, instance=True)
    api.default_entity = default_entity
    api.calls = []

    def create_custom_chart(**kwargs: Any) -> str:
        api.calls.append(kwargs)
        if error is not None:
            raise error
        return f"{kwargs['entity']}/{kwargs['name']}"

    api.create_custom_chart.side_effect = create_custom_chart
    return api


def test_register_chart_sends_the_spec():
    api = FakeApi()
    assert wandb_modprof.register_chart("my-team", api=api) == f"my-team/{_spec.CHART_NAME}"
    (call,) = api.calls
    assert call == {
        "entity": "my-team",
        "name": _spec.CHART_NAME,
        "display_name": "wandb_modprof module graph",
        "spec_type": "vega2",
        "access": "private",
        "spec": _spec.spec_text(),
    }
    spec = json.loads(call["spec"])
    assert any(data["name"] == "wandb" for data in spec["data"])


def test_register_chart_defaults_to_the_api_entity_and_can_be_public():
    api = FakeApi(default_entity="me")
    name = wandb_modprof.register_chart(name="other-v2", display_name="Mine", public=True, api=api)
    assert name == "me/other-v2"
    assert api.calls[0]["entity"] == "me" and api.calls[0]["access"] == "public"
    assert api.calls[0]["display_name"] == "Mine"


def test_register_chart_failures_are_mod_prof_errors():
    with pytest.raises(ModProfError, match=r"pass entity="):
        wandb_modprof.register_chart(api=FakeApi(default_entity=None))
    api = FakeApi(error=RuntimeError("permission denied"))
    with pytest.raises(ModProfError) as raised:
        wandb_modprof.register_chart("team", api=api)
    text = str(raised.value)
    assert "could not register the chart preset 'team/wandb-modprof-v4'" in text
    assert "RuntimeError: permission denied" in text and "wandb login" in text
    for bad in ("a/b", "", "has space"):
        with pytest.raises(ModProfError, match=r"entity expected a W&B name"):
            wandb_modprof.register_chart(bad, api=FakeApi())
    with pytest.raises(ModProfError, match=r"name expected a W&B name"):
        wandb_modprof.register_chart("me", name="x/y", api=FakeApi())


def test_without_an_api_key_the_error_says_how_to_log_in(tmp_path, monkeypatch):
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no ~/.netrc either
    with pytest.raises(ModProfError) as raised:
        wandb_modprof.register_chart("me")  # the real wandb.Api(): no network needed to fail
    text = str(raised.value)
    assert "UsageError" in text and "run `wandb login` or set WANDB_API_KEY" in text


def test_cli_register_chart(monkeypatch, capsys):
    api = FakeApi()
    monkeypatch.setattr(_chart, "_new_api", lambda: api)
    assert _cli.main(["register-chart", "--entity", "my-team", "--public"]) == 0
    assert capsys.readouterr().out == f"my-team/{_spec.CHART_NAME}\n"
    assert api.calls[0]["access"] == "public"
    assert _cli.main(["register-chart", "--name", "custom-v3"]) == 0
    assert capsys.readouterr().out == "me/custom-v3\n"
    assert api.calls[1]["access"] == "private"


def test_cli_register_chart_failure_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(_chart, "_new_api", lambda: FakeApi(error=RuntimeError("HTTP 403")))
    assert _cli.main(["register-chart", "--entity", "me"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("wandb-modprof: error: could not register the chart preset")
    assert "HTTP 403" in captured.err


def test_with_a_key_but_no_answer_the_cli_fails_within_the_bound_naming_the_entity(tmp_path):
    # A syntactically valid key and no W&B server to reach (this machine has no network; where
    # one exists, the fake key is refused): the real SDK, each request bounded by TIMEOUT_S.
    env = dict(os.environ, NETRC=str(tmp_path / "no-netrc"))
    env.pop("WANDB_MODE", None)
    env.pop("WANDB_API_KEY", None)
    command = [sys.executable, "-m", "wandb_modprof", "register-chart", "--entity", "my-team"]

    def run(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
        start = time.perf_counter()
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=120, check=False, env=env
        )
        return proc, time.perf_counter() - start

    # The same command without a key: the same start-up (Python, torch, W&B) and exit, and no
    # request. That start-up took 3 s here and 15-20 s on a loaded machine, where the whole
    # run took 20-26 s: the bound is on what the key adds, the requests.
    keyless, startup = run(env)
    assert keyless.returncode == 2 and "UsageError" in keyless.stderr, keyless.stderr[-2000:]
    proc, elapsed = run(dict(env, WANDB_API_KEY="a" * 40))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(
        f"wandb-modprof: error: could not register the chart preset 'my-team/{_spec.CHART_NAME}'"
    )
    assert f"each request waits at most {_chart.TIMEOUT_S} s" in proc.stderr
    # the SDK's default took 20-27 s, and W&B's exit handler then waited a minute or more
    assert elapsed - startup < 3 * _chart.TIMEOUT_S, (elapsed, startup)


def test_a_failure_before_the_entity_is_known_says_which_entity_was_meant(monkeypatch):
    def no_api() -> Any:
        raise RuntimeError("no answer")

    monkeypatch.setattr(_chart, "_new_api", no_api)
    with pytest.raises(ModProfError, match=r"preset 'team/wandb-modprof-v4' with W&B \("):
        wandb_modprof.register_chart("team")
    with pytest.raises(ModProfError, match=r"for the default entity of your API key"):
        wandb_modprof.register_chart()
