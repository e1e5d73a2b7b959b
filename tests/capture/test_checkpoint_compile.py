"""Activation checkpointing (both modes) and torch.compile.

Checkpointing: a checkpointed block runs its forward twice (once in the forward, once during
backward). It must show as ONE invocation per call, with the recompute reported separately as
`recompute_ms`, and its backward (the recomputed nodes' work) attributed to it.

torch.compile: a compiled module is measured at its boundary as one leaf (hooks inside a
compiled region never fire or cause graph breaks), and sampling must never cause a recompile.
The matrix of compile styles x backends on whole models is `end_to_end/test_compiled.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from helpers import by_key, children, disabled_run, hook_counts
from models import TinyGPT, gpt_input
from torch import nn

import wandb_modprof
from wandb_modprof import Profile

JITTER_MS = 0.05


def _check_tree(records):
    for r in records:
        kids = children(records, r.key)
        if r.bwd_ms is not None and kids:
            assert r.bwd_ms >= sum(k.bwd_ms for k in kids) - JITTER_MS, r.key
        assert r.fwd_ms >= sum(k.fwd_ms for k in kids) - 1e-6, r.key


@contextmanager
def _measured(model: nn.Module, how: str) -> Iterator[Profile]:
    """Measure the steps in the body: watch with every step sampled, or a profile block."""
    if how == "watch":
        handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
        yield handle.profile()
        handle.unwatch()
    else:
        with wandb_modprof.profile(model, structure=False) as prof:
            yield prof


def _gpt_step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).pow(2).mean().backward()
    model.zero_grad(set_to_none=True)


# ---- activation checkpointing ----------------------------------------------------------------
@pytest.mark.parametrize("how", ["watch", "profile"])
@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpointed_blocks_are_one_invocation_with_recompute(mode, how):
    torch.manual_seed(0)
    model = TinyGPT(checkpointing=mode)
    x = gpt_input()
    _gpt_step(model, x)  # warm-up outside
    with _measured(model, how) as prof:
        _gpt_step(model, x)
        _gpt_step(model, x)
    assert prof.num_samples == 2
    recs = prof.invocations()
    keys = by_key(recs)
    # The recompute is not a second forward call: one entry per block and per submodule.
    for i in range(2):
        block = f"blocks.{i}"
        assert f"{block}#0" in keys
        assert f"{block}#1" not in keys
        for sub in (
            "ln1",
            "attn",
            "attn.qkv",
            "attn.proj",
            "ln2",
            "mlp",
            "mlp.up",
            "mlp.act",
            "mlp.down",
        ):
            assert f"{block}.{sub}#0" in keys, sub
            assert f"{block}.{sub}#1" not in keys, sub
    assert len(recs) == len(keys)
    # The block's forward ran again during backward, and that is reported as a recompute.
    for i in range(2):
        blk = keys[f"blocks.{i}#0"]
        assert blk.recompute_ms is not None and blk.recompute_ms > 0, blk
        assert blk.bwd_ms is not None and blk.bwd_ms > 0, blk
        # Submodules were recomputed too, as part of their block.
        for sub in ("attn", "mlp", "mlp.up"):
            r = keys[f"blocks.{i}.{sub}#0"]
            assert r.recompute_ms is not None and r.recompute_ms > 0, r.key
            assert r.recompute_ms <= blk.recompute_ms + JITTER_MS, r.key
        # The backward of the recomputed nodes is attributed inside the block.
        for leaf in ("attn.qkv", "attn.proj", "mlp.up", "mlp.down"):
            r = keys[f"blocks.{i}.{leaf}#0"]
            assert r.bwd_ms is not None and r.bwd_ms > 0, r.key
    # Modules outside the checkpointed region are not recomputed; the root holds its blocks'
    # recomputes (inclusive, as every time is)
    for key in ("wte#0", "wpe#0", "ln_f#0", "head#0"):
        assert keys[key].recompute_ms is None, key
        assert keys[key].bwd_ms is not None and keys[key].bwd_ms > 0, key
    blocks = keys["blocks.0#0"].recompute_ms + keys["blocks.1#0"].recompute_ms
    assert keys["<root>#0"].recompute_ms == pytest.approx(blocks)
    assert (
        keys["<root>#0"].bwd_ms >= keys["blocks.0#0"].bwd_ms + keys["blocks.1#0"].bwd_ms - JITTER_MS
    )
    _check_tree(recs)


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpointed_step_leaves_no_hooks_and_later_steps_agree(mode):
    model = TinyGPT(checkpointing=mode)
    x = gpt_input()
    handle = wandb_modprof.watch(model, log_freq=2, structure=False, run=disabled_run())
    for _ in range(4):
        _gpt_step(model, x)
        assert hook_counts(model)["<root>"] == 2
        assert sum(hook_counts(model).values()) == 2
    prof = handle.profile()
    assert prof.num_samples == 2
    stats = prof.stats()
    assert "blocks.0#1" not in stats
    assert stats["blocks.0#0"].metrics["recompute_ms"].count == 2


# ---- torch.compile ---------------------------------------------------------------------------
class Sub(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.act = nn.Tanh()
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class WithCompiledSub(nn.Module):
    def __init__(self, backend, dim: int = 16) -> None:
        super().__init__()
        self.pre = nn.Linear(dim, dim)
        self.sub = torch.compile(Sub(dim), backend=backend)
        self.post = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.sub(torch.relu(self.pre(x))))


@pytest.fixture
def compile_counter():
    import torch._dynamo
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    yield counter
    torch._dynamo.reset()


def _train(model: nn.Module, x: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        model(x).pow(2).mean().backward()
        model.zero_grad(set_to_none=True)


def test_compiled_submodule_is_one_leaf_without_recompiles(compile_counter):
    import torch._dynamo

    model = WithCompiledSub(compile_counter)
    x = torch.randn(8, 16)
    _train(model, x, 1)  # compile outside of any measurement
    assert compile_counter.frame_count == 1
    handle = wandb_modprof.watch(model, log_freq=2, structure=False, run=disabled_run())
    with torch._dynamo.config.patch(error_on_recompile=True):
        _train(model, x, 5)  # steps 1..5: unsampled, sampled, unsampled, sampled, unsampled
    assert compile_counter.frame_count == 1  # no recompile between sampled and unsampled steps
    prof = handle.profile()
    assert prof.num_samples == 2
    keys = by_key(prof.invocations())
    assert set(keys) == {"<root>#0", "pre#0", "sub#0", "post#0"}  # nothing below "sub"
    sub = keys["sub#0"]
    assert sub.module_type == "Sub"  # the user's class, under the torch.compile wrapper
    assert sub.fwd_ms > 0
    assert sub.bwd_ms is not None and sub.bwd_ms > 0
    assert sub.backward_nodes >= 1
    assert sub.param_count == sum(p.numel() for p in model.sub.parameters())
    assert sub.grad_norm is not None and sub.grad_norm > 0
    _check_tree(prof.invocations())
    handle.unwatch()
    assert sum(hook_counts(model).values()) == 0


def test_compiled_submodule_in_profile_block(compile_counter):
    model = WithCompiledSub(compile_counter)
    x = torch.randn(8, 16)
    _train(model, x, 1)
    with wandb_modprof.profile(model, structure=False) as prof:
        _train(model, x, 2)
    _train(model, x, 1)
    assert compile_counter.frame_count == 1
    keys = by_key(prof.invocations())
    assert set(keys) == {"<root>#0", "pre#0", "sub#0", "post#0"}
    assert keys["sub#0"].bwd_ms > 0


def test_whole_model_compiled(compile_counter):
    import torch._dynamo

    model = Sub()
    compiled = torch.compile(model, backend=compile_counter)
    x = torch.randn(8, 16)
    _train(compiled, x, 1)
    assert compile_counter.frame_count == 1
    handle = wandb_modprof.watch(compiled, log_freq=2, structure=False, run=disabled_run())
    with torch._dynamo.config.patch(error_on_recompile=True):
        _train(compiled, x, 4)
    assert compile_counter.frame_count == 1
    prof = handle.profile()
    assert prof.num_samples == 2
    recs = prof.invocations()
    assert [r.key for r in recs] == ["<root>#0"]  # the compiled model is one leaf
    assert recs[0].fwd_ms > 0 and recs[0].bwd_ms > 0
    assert recs[0].param_count == sum(p.numel() for p in model.parameters())
    handle.unwatch()
    assert sum(hook_counts(compiled).values()) == 0
    assert sum(hook_counts(model).values()) == 0


# ---- the structure pass around compiled code --------------------------------------------------
class InPlaceCompiled(nn.Module):
    def __init__(self, backend, dim: int = 16) -> None:
        super().__init__()
        self.pre = nn.Linear(dim, dim)
        self.sub = Sub(dim)
        self.sub.compile(backend=backend)  # Module.compile(): compiled in place, not hooked
        self.post = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.sub(torch.relu(self.pre(x))))


@pytest.mark.parametrize("in_place", [False, True])
def test_graph_of_compiled_code_is_traced_on_fake_tensors_without_recompiles(
    compile_counter, in_place
):
    import torch._dynamo
    import torch._dynamo.eval_frame

    model = InPlaceCompiled(compile_counter) if in_place else WithCompiledSub(compile_counter)
    x = torch.randn(8, 16)
    _train(model, x, 1)
    assert compile_counter.frame_count == 1
    handle = wandb_modprof.watch(model, log_freq=2, run=disabled_run())
    with torch._dynamo.config.patch(error_on_recompile=True):
        _train(model, x, 5)  # step 1: graph traced beside the step; 2 and 4 sampled
    assert compile_counter.frame_count == 1
    assert torch._dynamo.eval_frame._stance.stance == "default"  # restored after the pass
    prof = handle.unwatch()
    assert prof.num_samples == 2
    # both styles are measured at the compiled module's boundary, nothing inside it
    assert set(by_key(prof.invocations())) == {"<root>#0", "pre#0", "sub#0", "post#0"}
    (structure,) = prof.structures()
    root_edges = {(e.src_key, e.dst_key) for e in structure.edges if e.view_key == "<root>#0"}
    assert root_edges == {
        ("<root>#0|in:x", "pre#0"),
        ("pre#0", "sub#0"),
        ("sub#0", "post#0"),
        ("post#0", "<root>#0|out:output"),
    }
    calls = {c.key: c for c in structure.calls}
    # inside the compiled module: drawn under the user's names (no `_orig_mod`)
    assert {"sub.up#0", "sub.act#0", "sub.down#0"} <= set(calls)
    assert calls["sub#0"].module_type == "Sub"
    # the compiled code's eager forward ran on fake tensors under the FLOP counter
    assert calls["<root>#0"].fwd_flops == 2 * 8 * (16 * 16 + 16 * 32 + 32 * 16 + 16 * 1)
