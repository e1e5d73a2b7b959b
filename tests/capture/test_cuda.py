"""CUDA paths: device events, allocator peaks, and no device synchronisation in hooks.

Skipped without a GPU; run on a lent GPU machine with `pytest tests/capture/test_cuda.py`.
"""

from __future__ import annotations

import pytest
import torch
from conftest import requires_cuda
from helpers import disabled_run
from models import ResNet, TinyGPT, gpt_input, resnet_input

import wandb_modprof

pytestmark = requires_cuda


def test_event_timing_and_memory_on_cuda():
    model = ResNet().cuda()
    x = resnet_input(32, 64).cuda()
    model(x).sum().backward()
    torch.cuda.synchronize()
    with wandb_modprof.profile(model, structure=False) as prof:
        model(x).sum().backward()
    recs = prof.invocations()
    root = recs[0]
    assert root.fwd_ms > 0 and root.bwd_ms > 0
    assert root.fwd_mem_peak_bytes is not None and root.fwd_mem_peak_bytes > 0
    assert root.fwd_mem_delta_bytes is not None and root.fwd_mem_delta_bytes > 0
    assert root.bwd_mem_peak_bytes is not None
    conv = next(r for r in recs if r.module_type == "Conv2d")
    assert conv.bwd_ms > 0 and conv.fwd_mem_peak_bytes >= 0


def test_sampled_step_never_synchronises_the_device():
    model = TinyGPT(dim=256, layers=4).cuda()
    x = gpt_input(8, 32).cuda()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    model(x).float().mean().backward()  # warm-up sample
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(x).float().mean().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    prof = handle.unwatch()
    assert prof.num_samples == 2


def test_bitwise_identical_on_cuda():
    import copy

    torch.manual_seed(0)
    a = TinyGPT().cuda()
    b = copy.deepcopy(a)
    x = gpt_input().cuda()
    la = a(x).float().mean()
    la.backward()
    with wandb_modprof.profile(b, structure=False):
        lb = b(x).float().mean()
        lb.backward()
    assert torch.equal(la, lb)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa.grad, pb.grad)


@pytest.mark.parametrize("mode", ["auto", "cpu"])
def test_timing_modes_on_cuda(mode):
    model = TinyGPT().cuda()
    with wandb_modprof.profile(
        model, settings=wandb_modprof.Settings(timing=mode), structure=False
    ) as prof:
        model(gpt_input().cuda()).float().mean().backward()
    assert prof.invocations()[0].bwd_ms > 0


# ---- structure pass, traces and callbacks on CUDA (written without a GPU: never run yet) ----
def test_structure_pass_on_cuda_counts_flops_and_does_not_sync():
    model = TinyGPT().cuda()
    x = gpt_input(4, 32).cuda()
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(x).float().mean().backward()
    (structure,) = prof.structures()
    calls = {c.key: c for c in structure.calls}
    assert calls["<root>#0"].fwd_flops > 0
    assert calls["blocks.0.attn#0"].fwd_self_flops > 0  # the CUDA attention kernel's formula
    assert prof.num_samples == 1


def test_trace_on_cuda_puts_backward_on_the_autograd_device_thread(tmp_path):
    import json
    import threading

    from wandb_modprof.sinks.traces.trace import nesting_errors

    model = ResNet().cuda()
    x = resnet_input(8, 32).cuda()
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(x).sum().backward()
    torch.cuda.synchronize()
    events = json.loads(prof.export_chrome_trace(tmp_path / "t.json").read_text())["traceEvents"]
    assert nesting_errors(events) == []
    forward = {ev["tid"] for ev in events if ev.get("cat") == "wandb_modprof.forward"}
    backward = {ev["tid"] for ev in events if ev.get("cat") == "wandb_modprof.backward"}
    assert forward == {threading.get_native_id()}
    assert backward and backward != forward  # CUDA nodes run on autograd's device thread


def test_merged_trace_on_cuda_with_host_timing(tmp_path):
    import json

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from wandb_modprof.sinks.traces.trace import NODE_EVENT_PREFIX, nesting_errors

    model = ResNet().cuda()
    x = resnet_input(8, 32).cuda()
    with wandb_modprof.profile(model, settings=wandb_modprof.Settings(timing="cpu")) as prof:
        model(x).sum().backward()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            model(x).sum().backward()
            torch.cuda.synchronize()
    path = prof.export_chrome_trace(tmp_path / "m.json", torch_profiler=tp)
    events = json.loads(path.read_text())["traceEvents"]
    assert nesting_errors(events, "wandb_modprof") == []
    backward: dict[str, list[dict]] = {}
    for ev in events:
        if ev.get("cat") == "wandb_modprof.backward":
            backward.setdefault(ev["args"]["key"], []).append(ev)
    layer = next(r for r in prof.invocations() if r.key == "layer2#0")
    nodes = [
        ev
        for ev in events
        if str(ev.get("name", "")).startswith(NODE_EVENT_PREFIX)
        and isinstance(ev["args"].get("Sequence number"), int)
        and layer.seq_start <= ev["args"]["Sequence number"] < layer.seq_end
    ]
    assert nodes
    for ev in nodes:
        assert any(
            s["tid"] == ev["tid"]
            and s["ts"] <= ev["ts"]
            and ev["ts"] + ev["dur"] <= s["ts"] + s["dur"]
            for s in backward["layer2#0"]
        )


def test_on_module_backward_events_on_cuda():
    model = ResNet().cuda()
    x = resnet_input(8, 32).cuda()
    events = []
    with wandb_modprof.on_module(
        model.layer2, backward_start=events.append, backward_end=events.append
    ):
        model(x).sum().backward()
    torch.cuda.synchronize()
    assert [e.phase for e in events] == ["backward_start", "backward_end"]


def test_step_phases_come_from_device_events_on_cuda():
    """Every phase of a CUDA training step, the optimizer's from events around its step (the
    session's device clock): a sample is resolved once those events have completed."""
    from wandb_modprof.capture.step.clock import CpuClock
    from wandb_modprof.records.phases import PHASES

    model = TinyGPT(dim=256, layers=4).cuda()
    x = gpt_input(8, 32).cuda()
    opt = torch.optim.AdamW(model.parameters())
    handle = wandb_modprof.watch(
        model, log_freq=1, structure=False, run=disabled_run(), optimizer=opt
    )
    assert not isinstance(handle._capture.clock, CpuClock)  # events, not host stamps
    for _ in range(4):
        model(x).float().mean().backward()
        opt.step()
        opt.zero_grad()
    prof = handle.unwatch()
    phases = prof.step_phases()
    assert list(phases) == list(PHASES), prof.snapshot().phases
    assert phases["optimizer"] > 0 and phases["backward"] > 0 and phases["forward"] > 0
