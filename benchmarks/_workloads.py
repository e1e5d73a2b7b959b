"""The three models the peer, accuracy and GPU benchmarks share, each with one fixed batch.

* ``resnet``: the test zoo's torchvision-style ResNet (BasicBlocks, in-place ReLU, residual
  ``+=``), cross-entropy over 10 classes;
* ``gpt2``: Hugging Face ``GPT2LMHeadModel`` built from a config (random weights, nothing
  downloaded, dropout off), causal-LM loss computed by the model (``labels=``);
* ``bert``: Hugging Face ``BertForMaskedLM`` from a config (dropout off), MLM loss over every
  token (``labels=input_ids``).

Sizes: ``quick`` (CI smoke, tiny), ``cpu`` (the issue's small configs: 4 layers, dim 256,
seq 128, batch 4; ResNet widths 16/32/64 on 16x3x32x32) and ``gpu`` (GPT-2 small's real shape,
BERT-base's, a wider ResNet: big enough that an H200 is busy rather than waiting for Python).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from models import ResNet, TinyGPT

SIZES = ("quick", "cpu", "gpu")
MODELS = ("resnet", "gpt2", "bert", "llama", "tinygpt")


@dataclass(frozen=True)
class Workload:
    """A model factory and one step's forward / loss on a fixed batch (already on `device`)."""

    name: str
    description: str
    build: Callable[[], nn.Module]
    forward: Callable[[nn.Module], Any]
    loss_of: Callable[[Any], torch.Tensor]
    device: torch.device
    # The modules whose activation bytes are compared with MemTracker (accuracy), by name.
    blocks: Callable[[nn.Module], list[tuple[str, nn.Module]]]

    def loss(self, model: nn.Module) -> torch.Tensor:
        return self.loss_of(self.forward(model))


def returned_bytes(output: Any) -> int:
    """Bytes of the tensors a forward returned (alive because the caller holds them)."""
    if isinstance(output, torch.Tensor):
        return output.numel() * output.element_size()
    values = output.values() if isinstance(output, dict) else ()
    return sum(returned_bytes(v) for v in values if isinstance(v, torch.Tensor))


def _hf_loss(output: Any) -> torch.Tensor:
    return output.loss  # type: ignore[no-any-return]


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()


def _resnet(size: str, device: torch.device) -> Workload:
    widths, blocks, img, batch = {
        "quick": ((8, 16), 1, 16, 4),
        "cpu": ((16, 32, 64), 2, 32, 16),
        "gpu": ((64, 128, 256), 2, 64, 128),
    }[size]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, img, img, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)

    def loss_of(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, y)

    def block_list(model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [
            (name, module)
            for name, module in model.named_modules()
            if type(module).__name__ == "BasicBlock"
            or (name.startswith("layer") and "." not in name)
        ]

    return Workload(
        name="resnet",
        description=(
            f"ResNet-style (tests/models.py): widths {widths}, {blocks} BasicBlocks per stage, "
            f"{batch}x3x{img}x{img} input, 10 classes"
        ),
        build=lambda: ResNet(widths, blocks=blocks).to(device),
        forward=lambda model: model(x),
        loss_of=loss_of,
        device=device,
        blocks=block_list,
    )


def _lm_shape(size: str) -> tuple[int, int, int, int, int, int]:
    """vocab, seq, dim, heads, layers, batch."""
    return {
        "quick": (256, 32, 64, 4, 2, 2),
        "cpu": (1000, 128, 256, 4, 4, 4),
        "gpu": (50257, 512, 768, 12, 12, 8),
    }[size]


def _gpt2(size: str, device: torch.device) -> Workload:
    import transformers

    _quiet_transformers()
    vocab, seq, dim, heads, layers, batch = _lm_shape(size)
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=seq,
        n_embd=dim,
        n_layer=layers,
        n_head=heads,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)

    return Workload(
        name="gpt2",
        description=(
            f"GPT-2 (transformers GPT2LMHeadModel from a config): {layers} layers, dim {dim}, "
            f"{heads} heads, seq {seq}, batch {batch}, vocab {vocab}, SDPA attention"
        ),
        build=lambda: transformers.GPT2LMHeadModel(config).to(device),
        forward=lambda model: model(input_ids=ids, labels=ids),
        loss_of=_hf_loss,
        device=device,
        blocks=lambda model: [(f"transformer.h.{i}", b) for i, b in enumerate(model.transformer.h)],
    )


def _bert(size: str, device: torch.device) -> Workload:
    import transformers

    _quiet_transformers()
    vocab, seq, dim, heads, layers, batch = _lm_shape(size)
    vocab = 30522 if size == "gpu" else vocab
    config = transformers.BertConfig(
        vocab_size=vocab,
        hidden_size=dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * dim,
        max_position_embeddings=seq,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)

    return Workload(
        name="bert",
        description=(
            f"BERT encoder (transformers BertForMaskedLM from a config): {layers} layers, "
            f"dim {dim}, {heads} heads, seq {seq}, batch {batch}, vocab {vocab}, MLM loss"
        ),
        build=lambda: transformers.BertForMaskedLM(config).to(device),
        forward=lambda model: model(input_ids=ids, labels=ids),
        loss_of=_hf_loss,
        device=device,
        blocks=lambda model: [
            (f"bert.encoder.layer.{i}", b) for i, b in enumerate(model.bert.encoder.layer)
        ],
    )


def _llama(size: str, device: torch.device) -> Workload:
    import transformers

    _quiet_transformers()
    vocab, seq, dim, heads, layers, batch = _lm_shape(size)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=dim,
        intermediate_size=4 * dim,
        num_hidden_layers=max(2, layers // 2),
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=seq,
        attention_dropout=0.0,
    )
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(2))
    ids = ids.to(device)

    return Workload(
        name="llama",
        description=(
            f"Llama (transformers LlamaForCausalLM from a config): "
            f"{config.num_hidden_layers} layers, dim {dim}, {heads} heads, seq {seq}, "
            f"batch {batch}, vocab {vocab}"
        ),
        build=lambda: transformers.LlamaForCausalLM(config).to(device),
        forward=lambda model: model(input_ids=ids, labels=ids),
        loss_of=_hf_loss,
        device=device,
        blocks=lambda model: [(f"model.layers.{i}", b) for i, b in enumerate(model.model.layers)],
    )


def _tinygpt(size: str, device: torch.device) -> Workload:
    vocab, seq, dim, heads, layers, batch = _lm_shape(size)
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(3))
    ids = ids.to(device)

    def loss_of(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), ids.flatten())

    return Workload(
        name="tinygpt",
        description=(
            f"the test zoo's TinyGPT (tests/models.py, tied head): {layers} layers, dim {dim}, "
            f"{heads} heads, seq {seq}, batch {batch}, vocab {vocab}"
        ),
        build=lambda: TinyGPT(vocab, dim, heads, layers, seq).to(device),
        forward=lambda model: model(ids),
        loss_of=loss_of,
        device=device,
        blocks=lambda model: [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)],
    )


def make_workloads(
    names: str | list[str], size: str, device: torch.device | str = "cpu"
) -> list[Workload]:
    """Workloads by name (comma-separated string or list), in the order given."""
    device = torch.device(device)
    wanted = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    builders = {
        "resnet": _resnet,
        "gpt2": _gpt2,
        "bert": _bert,
        "llama": _llama,
        "tinygpt": _tinygpt,
    }
    unknown = [n for n in wanted if n not in builders]
    if unknown or size not in SIZES:
        raise SystemExit(f"unknown model(s) {unknown} or size {size!r}: models {MODELS}")
    return [builders[n](size, device) for n in wanted if n]
