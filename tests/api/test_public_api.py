"""Public API surface: profile object contents, summary text, builtins export, errors."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import disabled_run
from models import TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof import ModProfError


def _profiled():
    model = TinyGPT()
    with wandb_modprof.profile(model, structure=False) as prof:
        model(gpt_input()).float().pow(2).mean().backward()
    return model, prof


def test_public_names_are_exported():
    for name in wandb_modprof.__all__:
        assert hasattr(wandb_modprof, name)


def test_invocation_records_are_plain_and_complete():
    _, prof = _profiled()
    recs = prof.invocations()
    assert [r.order for r in recs] == list(range(len(recs)))
    d = recs[1].to_dict()
    assert set(wandb_modprof.METRICS) <= set(d)
    json.dumps(d)  # plain builtins only
    with pytest.raises(AttributeError):
        recs[0].fwd_ms = 1.0  # frozen


def test_to_dict_is_json_and_round_trips_keys():
    _, prof = _profiled()
    data = prof.to_dict()
    text = json.dumps(data)
    back = json.loads(text)
    assert back["num_samples"] == 1
    assert set(back["stats"]) == {r.key for r in prof.invocations()}
    assert back["stats"]["head#0"]["metrics"]["bwd_ms"]["count"] == 1


def test_summary_lists_top_modules_and_totals():
    _, prof = _profiled()
    text = prof.summary(n=3)
    assert text.startswith("wandb_modprof profile of TinyGPT: 1 sampled step(s)")
    for title in ("forward time", "backward time", "activation memory"):
        assert f"Top modules by {title}" in text
    top_bwd = prof.top("bwd_self_ms", n=3)
    assert top_bwd[0].key in text.split("Top modules by backward time")[1]
    assert len(top_bwd) == 3
    assert top_bwd[0].mean("bwd_self_ms") >= top_bwd[-1].mean("bwd_self_ms")
    assert str(prof) == prof.summary()


def test_top_records_have_a_one_line_repr():
    _, prof = _profiled()
    rows = prof.top("fwd_ms", n=3)
    text = repr(rows)
    assert "\n" not in text and len(text) < 3 * 200  # was ~4 KB for 3 rows
    first = rows[0]
    assert repr(first).startswith(f"<ModuleStats {first.key} {first.module_type} fwd_ms=")
    assert f"fwd_ms={first.typical('fwd_ms'):.4g}" in repr(first)
    assert "(medians of 1 sample(s); .metrics has " in repr(first)
    assert first.metrics["fwd_ms"].count == 1  # the data is all still there


def test_summary_of_a_small_model_picks_units():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with wandb_modprof.profile(model, structure=False) as prof:
        model(torch.randn(4, 8)).sum().backward()
    text = prof.summary()
    assert "0.00" not in text and "MiB" not in text
    assert "128 B" in text  # Linear(8, 8)'s saved 4x8 fp32 input, in bytes, not 0.00 MiB
    assert " µs" in text or " ms" in text


def test_top_rejects_unknown_metric_and_bad_n():
    _, prof = _profiled()
    with pytest.raises(ModProfError, match=r"metric must be one of .*got 'time'"):
        prof.top("time")
    with pytest.raises(ModProfError, match="n must be a positive int; got 0"):
        prof.top("fwd_ms", n=0)


def test_empty_profile_summary():
    model = TinyGPT()
    with wandb_modprof.profile(model, structure=False) as prof:
        pass
    assert prof.num_samples == 0
    assert "no sampled steps yet" in prof.summary()
    assert prof.invocations() == []


def test_eval_forward_in_profile_has_forward_only():
    model = TinyGPT().eval()
    with wandb_modprof.profile(model, structure=False) as prof, torch.no_grad():
        model(gpt_input())
    rec = prof.invocations()[0]
    assert rec.fwd_ms > 0 and rec.bwd_ms is None and rec.grad_bytes is None
    assert rec.act_bytes == 0


def test_watch_handle_repr_and_steps():
    model = TinyGPT()
    handle = wandb_modprof.watch(model, log_freq=3, structure=False, run=disabled_run())
    for _ in range(4):
        model(gpt_input()).float().mean().backward()
    assert handle.steps == 4
    assert "log_freq=3" in repr(handle) and "active" in repr(handle)
    handle.unwatch()
    assert "removed" in repr(handle)


def test_run_and_flag_arguments_are_validated():
    import wandb

    model = TinyGPT()
    with pytest.raises(ModProfError, match=r"run must be a wandb Run .* got str"):
        wandb_modprof.watch(model, run="my-run", structure=False)
    with pytest.raises(ModProfError, match=r"activations must be True or False; got 1"):
        wandb_modprof.watch(model, activations=1, structure=False, run=disabled_run())
    with pytest.raises(ModProfError, match=r"norms must be True or False; got 'no'"):
        wandb_modprof.profile(model, norms="no", structure=False)
    run = wandb.init(mode="disabled")
    try:
        handle = wandb_modprof.watch(model, log_freq=1, run=run, structure=False)
        assert handle.run is run  # kept for W&B logging (the panel issue)
        with pytest.warns(UserWarning, match=r"0 training step\(s\)"):
            handle.unwatch()
    finally:
        run.finish()


def test_watch_refuses_a_finished_run(tmp_path):
    import wandb

    # (a disabled run logs nothing, finished or not: it is accepted either way)
    run = wandb.init(mode="offline", project="modprof-test", dir=str(tmp_path))
    run.finish()
    model = TinyGPT()
    with pytest.raises(ModProfError, match=r"run expected an active wandb Run; .* is finished"):
        wandb_modprof.watch(model, run=run, structure=False)
    handle = wandb_modprof.watch(model, structure=False, run=wandb.init(mode="disabled"))
    handle.unwatch()  # the refusal left nothing behind: the model can be watched


def test_options_switch_measurements_off():
    model = TinyGPT()
    with wandb_modprof.profile(model, activations=False, norms=False, structure=False) as prof:
        model(gpt_input()).float().pow(2).mean().backward()
    rec = prof.invocations()[0]
    assert rec.act_bytes is None and rec.param_norm is None and rec.grad_norm is None
    assert rec.bwd_ms > 0 and rec.grad_bytes > 0


def test_user_saved_tensor_hooks_are_not_shadowed():
    model = TinyGPT()
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t

    with (
        wandb_modprof.profile(model, structure=False) as prof,
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
    ):
        model(gpt_input()).float().pow(2).mean().backward()
    assert packed  # the user's hooks saw every saved tensor
    assert prof.invocations()[0].act_bytes is None  # so we did not measure activations


def test_model_changes_between_samples_are_seen():
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    x = torch.randn(4, 8)
    model(x).sum().backward()
    assert handle.profile().invocations()[-1].param_bytes == (8 * 2 + 2) * 4
    model[2] = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 2))  # new submodules
    model[0].weight = nn.Parameter(torch.randn(8, 8))  # a replaced parameter
    model(x).sum().backward()
    keys = {r.key: r for r in handle.unwatch().invocations()}
    assert keys["2#0"].param_bytes == ((8 * 16 + 16) + (16 * 2 + 2)) * 4
    assert keys["2.1#0"].bwd_ms > 0  # the new submodules were hooked
    assert keys["0#0"].param_norm == pytest.approx(
        float(torch.cat([model[0].weight.flatten(), model[0].bias]).detach().norm()), rel=1e-5
    )


def test_device_timing_on_a_cpu_model_is_a_clear_error():
    model = TinyGPT()
    with pytest.raises(ModProfError, match=r"timing='device' needs a model on an accelerator"):
        wandb_modprof.watch(
            model,
            settings=wandb_modprof.Settings(timing="device"),
            structure=False,
            run=disabled_run(),
        )
    with wandb_modprof.profile(
        model, settings=wandb_modprof.Settings(timing="cpu"), structure=False
    ) as prof:  # explicit host clock works
        model(gpt_input()).float().mean().backward()
    assert prof.invocations()[0].bwd_ms > 0
