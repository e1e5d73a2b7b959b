"""Our hooks on a watched model's submodules (`capture/submodule_hooks.py`): on during sampled
steps only, put back as they were between samples (not registered again), with a user's hooks
and swapped hook dicts respected, and gone after `unwatch()`."""

from __future__ import annotations

from collections import OrderedDict

import torch
from helpers import disabled_run, hook_counts
from torch import nn

import wandb_modprof


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4), nn.Tanh()))


def _step(model: nn.Module) -> None:
    model(torch.randn(2, 4)).sum().backward()


def _samples(prof: wandb_modprof.Profile) -> dict[str, int]:
    """Samples that timed each call key."""
    return {key: stat.metrics["fwd_ms"].count for key, stat in prof.stats().items()}


def _hook_dict_sizes(model: nn.Module) -> int:
    return sum(
        len(getattr(m, attr))
        for m in model.modules()
        for attr in (
            "_forward_pre_hooks",
            "_forward_pre_hooks_with_kwargs",
            "_forward_hooks",
            "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called",
        )
    )


def test_children_are_hooked_on_sampled_steps_only_and_every_sample_times_them():
    model = _model()
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run(), structure=False)
    root_only = None
    for _ in range(8):
        _step(model)
        counts = hook_counts(model)
        assert counts.pop("<root>") == 2
        assert sum(counts.values()) == 0  # between steps: no hook on a submodule
        root_only = root_only or _hook_dict_sizes(model)
        assert _hook_dict_sizes(model) == root_only  # nothing of ours left in any dict
    prof = handle.unwatch()
    assert prof.num_samples == 4
    assert _samples(prof) == {k: 4 for k in ("<root>#0", "0#0", "1#0", "2#0", "2.0#0", "2.1#0")}
    assert sum(hook_counts(model).values()) == 0 and _hook_dict_sizes(model) == 0


def test_a_users_hooks_added_between_samples_run_and_ours_come_back():
    model = _model()
    calls: list[str] = []
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run(), structure=False)
    _step(model)
    _step(model)  # a sample: our hooks were registered once
    user = model[2][0].register_forward_hook(lambda m, a, out: calls.append("post"))
    pre = model[0].register_forward_pre_hook(lambda m, a: calls.append("pre"), prepend=True)
    for _ in range(4):
        _step(model)
    assert calls == ["pre", "post"] * 4
    user.remove()
    pre.remove()
    _step(model)
    _step(model)
    prof = handle.unwatch()
    assert prof.num_samples == 4
    assert set(_samples(prof).values()) == {4}
    assert sum(hook_counts(model).values()) == 0


def test_a_module_whose_hook_dicts_were_replaced_is_still_timed():
    """A library that resets a module's hook dicts between steps does not lose the module."""
    model = _model()
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run(), structure=False)
    _step(model)
    _step(model)
    inner = model[2][0]
    inner._forward_hooks = OrderedDict()
    inner._forward_hooks_with_kwargs = OrderedDict()
    inner._forward_hooks_always_called = OrderedDict()
    inner._forward_pre_hooks = OrderedDict()
    inner._forward_pre_hooks_with_kwargs = OrderedDict()
    for _ in range(4):
        _step(model)
    prof = handle.unwatch()
    assert _samples(prof)["2.0#0"] == 3
    assert {r.key: r for r in prof.invocations()}["2.0#0"].fwd_ms > 0
    assert sum(hook_counts(model).values()) == 0


def test_a_module_added_between_samples_is_hooked_and_a_removed_one_released():
    model = _model()
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run(), structure=False)
    _step(model)
    _step(model)
    removed = model[2]
    model[2] = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4))
    for _ in range(2):
        _step(model)
    assert sum(hook_counts(removed).values()) == 0
    prof = handle.unwatch()
    # the newest sample timed the new modules
    assert {r.module_name for r in prof.invocations()} >= {"2.0", "2.1", "2.2"}
    assert sum(hook_counts(model).values()) == 0
