"""Real third-party models built from config (random weights, no download) under `watch`."""

from __future__ import annotations

import pytest
import torch
from helpers import disabled_run

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
    handle = wandb_modprof.watch(
        model, log_freq=2, optimizer=opt, structure=False, run=disabled_run()
    )
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


def _views(prof: wandb_modprof.Profile) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = {}
    (structure,) = prof.structures()
    for e in structure.edges:
        prefix = e.view_key + "|"
        out.setdefault(e.view_key, set()).add(
            (e.src_key.removeprefix(prefix), e.dst_key.removeprefix(prefix))
        )
    return out


def test_gpt2_graph_from_kwargs_to_model_output_fields():
    torch.manual_seed(0)
    model, _ = _gpt2()
    ids = torch.randint(0, 256, (2, 16))
    labels = ids.clone()  # a separate tensor: one tensor passed twice is one tensor to us
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(input_ids=ids, labels=labels).loss.backward()
    calls = {c.key: c for c in prof.structures()[0].calls}
    assert calls["<root>#0"].inputs == ("input_ids", "labels")
    assert calls["<root>#0"].outputs == ("loss", "logits")  # ModelOutput fields
    views = _views(prof)
    assert views["<root>#0"] == {
        ("in:input_ids", "transformer#0"),
        ("transformer#0", "lm_head#0"),
        ("lm_head#0", "out:logits"),
        ("lm_head#0", "out:loss"),
        ("in:labels", "out:loss"),  # the loss is computed in the root's own code
    }
    assert ("transformer.h.0#0", "transformer.h.1#0") in views["transformer#0"]
    # the block: ln_1 -> attn -> (residual) -> ln_2 -> mlp, residuals to the output
    block = views["transformer.h.0#0"]
    assert {
        ("transformer.h.0.ln_1#0", "transformer.h.0.attn#0"),
        ("transformer.h.0.attn#0", "transformer.h.0.ln_2#0"),
        ("in:hidden_states", "transformer.h.0.ln_2#0"),
        ("transformer.h.0.ln_2#0", "transformer.h.0.mlp#0"),
        ("transformer.h.0.mlp#0", "out:output"),
    } <= block
    table = prof.table()
    assert not table.reduced
    attn = next(r for r in table.resolved() if r["node_key"] == "transformer.h.0.attn#0")
    assert attn["fwd_flops"] > 0 and attn["has_view"]


def test_bert_eval_graph_without_grad():
    model, _ = _bert()
    model.eval()
    ids = torch.randint(0, 256, (2, 16))
    with wandb_modprof.profile(model) as prof, torch.no_grad():
        for _ in range(2):
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    (structure,) = prof.structures()
    assert not structure.training
    views = _views(prof)
    assert ("in:input_ids", "bert#0") in views["<root>#0"]
    assert ("in:attention_mask", "bert#0") in views["<root>#0"]
    assert ("classifier#0", "out:logits") in views["<root>#0"]
    encoder = views["bert.encoder#0"]
    assert ("bert.encoder.layer.0#0", "bert.encoder.layer.1#0") in encoder
    assert prof.num_samples == 2 - 1  # the second forward was timed
