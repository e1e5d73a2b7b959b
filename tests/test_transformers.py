"""Real third-party models built from config (random weights, no download) under `watch`."""

from __future__ import annotations

import pytest
import torch

import wandb_modprof

transformers = pytest.importorskip("transformers")


def _gpt2():
    config = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4)
    return transformers.GPT2LMHeadModel(config), config


def _bert():
    config = transformers.BertConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
    )
    return transformers.BertForSequenceClassification(config), config


@pytest.mark.parametrize("build", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_watch_trains_real_models_and_measures_every_module(build):
    torch.manual_seed(0)
    model, _ = build()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handle = wandb_modprof.watch(model, log_freq=2, optimizer=opt, structure=False)
    ids = torch.randint(0, 256, (2, 16))
    for _ in range(4):
        if isinstance(model, transformers.GPT2LMHeadModel):
            out = model(input_ids=ids, labels=ids)  # ModelOutput with a loss
        else:
            out = model(
                input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 1])
            )
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    prof = handle.unwatch()
    assert prof.num_samples == 2
    recs = prof.invocations()
    invoked = {r.module_name for r in recs}
    # Every module that ran in forward is measured, with the names users know.
    called = {
        n or "<root>" for n, m in model.named_modules() if not isinstance(m, torch.nn.ModuleList)
    }
    assert invoked <= called
    assert len(recs) > 20
    trainable = [r for r in recs if r.param_count > 0 and r.module_type != "Embedding"]
    assert trainable and all(r.bwd_ms and r.bwd_ms > 0 for r in trainable)
    # Optimizer state exists after the first step: AdamW keeps two moments per parameter.
    root = recs[0]
    assert root.optim_bytes == pytest.approx(2 * root.param_bytes, rel=0.01)
    assert root.grad_bytes == root.param_bytes  # every parameter got a gradient
    assert root.grad_norm > 0 and root.param_norm > 0
    summary = prof.summary()
    assert "Top modules by backward time" in summary and type(model).__name__ in summary
