"""Activation bytes agree with PyTorch's MemTracker on the same step.

MemTracker charges a tensor to the module that *creates* it; we charge a saved storage to the
module that *saves* it first (a conv's output is kept alive by the BatchNorm after it, so it is
the BatchNorm's activation memory). The two agree exactly wherever creator and saver are inside
the same module: residual blocks, stages, and the whole model once its returned outputs (alive
because the caller holds them, not saved for backward) are taken out. Tolerance: 1 %.
"""

from __future__ import annotations

import pytest
import torch
from models import ResNet, gpt2_from_config, resnet_input
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState

import wandb_modprof

TOL = 0.01


def _act_delta(tracker: MemTracker, module: torch.nn.Module) -> int:
    stats = tracker.memory_tracking[module]
    dev = torch.device("cpu")
    pre = stats.snapshots[_ModState.PRE_FW][-1][dev][_MemRefType.ACT]
    post = stats.snapshots[_ModState.POST_FW][-1][dev][_MemRefType.ACT]
    return post - pre


def _loss(out):
    return out if isinstance(out, torch.Tensor) else out.loss


def _run(model, step):
    _loss(step()).backward()  # warm-up
    model.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker, wandb_modprof.profile(model, structure=False) as prof:
        out = step()
        _loss(out).backward()
    return tracker, {r.key: r for r in prof.invocations()}, out


def _close(ours: int, theirs: int) -> bool:
    return abs(ours - theirs) <= TOL * max(theirs, 1)


def test_resnet_blocks_and_model_match_memtracker():
    torch.manual_seed(0)
    model = ResNet()
    x = resnet_input(8, 32)
    holder = {}

    def step():
        logits = model(x)
        holder["logits"] = logits
        return logits.sum()

    tracker, recs, _ = _run(model, step)
    checked = 0
    for name, module in model.named_modules():
        if type(module).__name__ in ("BasicBlock",) or name in ("layer1", "layer2", "layer3"):
            ours, theirs = recs[f"{name}#0"].act_bytes, _act_delta(tracker, module)
            assert _close(ours, theirs), (name, ours, theirs)
            checked += 1
    assert checked == 9
    logits_bytes = holder["logits"].numel() * holder["logits"].element_size()
    root = recs["<root>#0"].act_bytes
    assert _close(root, _act_delta(tracker, model) - logits_bytes), (
        root,
        _act_delta(tracker, model),
    )
    assert root > 1_000_000  # a real amount, not a vacuous match


def test_gpt2_blocks_and_model_match_memtracker():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = gpt2_from_config()
    ids = torch.randint(0, 512, (4, 64))
    tracker, recs, out = _run(model, lambda: model(input_ids=ids, labels=ids))
    for i, block in enumerate(model.transformer.h):
        ours, theirs = recs[f"transformer.h.{i}#0"].act_bytes, _act_delta(tracker, block)
        assert _close(ours, theirs), (i, ours, theirs)
    returned = out.logits.numel() * 4 + out.loss.numel() * 4
    root = recs["<root>#0"].act_bytes
    assert _close(root, _act_delta(tracker, model) - returned), (root, _act_delta(tracker, model))
    assert root > 1_000_000


class Probe(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x * 2).mean(0).detach()  # its graph is freed at once


class Keep(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x * 3)  # sigmoid keeps its output for backward


class ProbeKeep(nn.Module):
    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.probes = nn.ModuleList(Probe() for _ in range(n))
        self.keeps = nn.ModuleList(Keep() for _ in range(n))

    def forward(self, x):
        out = 0
        for p, k in zip(self.probes, self.keeps, strict=True):
            out = out + p(x) + k(x)
        return out


def test_activation_bytes_count_what_is_still_saved_when_addresses_are_reused():
    model = ProbeKeep()
    with wandb_modprof.profile(model, structure=False) as prof:
        model(torch.randn(8, 256, requires_grad=True)).sum().backward()
    recs = prof.invocations()
    assert [r.act_self_bytes for r in recs if r.module_type == "Keep"] == [8 * 256 * 4] * 16
    assert [r.act_self_bytes for r in recs if r.module_type == "Probe"] == [0] * 16
