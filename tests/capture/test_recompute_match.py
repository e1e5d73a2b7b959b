"""A module called twice inside one checkpointed function (first on a large tensor, then a small
one): each recompute is matched to the call it repeats (`capture/backward/recompute.py`, by the
shapes of its arguments), in both checkpoint modes, so neither call gets the other's recompute
or backward time. And a container's recompute time includes its children's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import wandb_modprof


class TwiceInOneRegion(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)
        self.reentrant = reentrant

    def both(self, big: torch.Tensor, small: torch.Tensor) -> torch.Tensor:
        return self.fc(big).sum() + self.fc(small).sum()

    def forward(self, big: torch.Tensor, small: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.both, big, small, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_each_recompute_goes_to_the_call_it_repeats(reentrant: bool) -> None:
    torch.manual_seed(0)
    model = TwiceInOneRegion(reentrant)
    big = torch.randn(2048, 256, requires_grad=True)
    small = torch.randn(2, 256, requires_grad=True)
    with wandb_modprof.profile(model) as prof:
        for _ in range(5):
            model(big, small).backward()
    stats = prof.stats()

    def fastest(key: str, metric: str) -> float:
        # the minimum over samples: a preemption on a loaded machine only adds time
        return float(stats[key].metrics[metric].min)

    fwd0, fwd1 = fastest("fc#0", "fwd_ms"), fastest("fc#1", "fwd_ms")
    rec0, rec1 = fastest("fc#0", "recompute_ms"), fastest("fc#1", "recompute_ms")
    bwd0, bwd1 = fastest("fc#0", "bwd_ms"), fastest("fc#1", "bwd_ms")
    assert fwd0 > 5 * fwd1  # (the large call is the slow one: the test can tell them apart)
    # before: call #0 got the small call's recompute and call #1 the large one's
    assert rec0 > 5 * rec1, (rec0, rec1)
    assert bwd0 > 5 * bwd1, (bwd0, bwd1)


@pytest.mark.parametrize(
    "variant", [None, True, False], ids=["default", "reentrant", "non-reentrant"]
)
def test_a_layer_whose_forward_function_is_checkpointed_holds_its_children_recompute(
    variant: bool | None,
) -> None:
    """transformers checkpoints a layer's `forward` function, not the layer's module call
    (`activation_checkpointing_enable()`, formerly `gradient_checkpointing_enable()`): the
    layer's own call is never recomputed, its children's are. Its `recompute_ms` is theirs
    summed, as every inclusive time is."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64,
    )  # fmt: skip
    model = transformers.BertModel(config).train()
    kwargs = None if variant is None else {"use_reentrant": variant}
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    ids = torch.randint(0, 128, (2, 16))
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(input_ids=ids).last_hidden_state.sum().backward()
    records = {r.key: r for r in prof.invocations()}
    for layer in ("encoder.layer.0#0", "encoder.layer.1#0"):
        children = [r for r in records.values() if r.parent_key == layer]
        recomputed = [r.recompute_ms for r in children if r.recompute_ms is not None]
        assert recomputed, layer  # (the children were recomputed: the case this is about)
        total = records[layer].recompute_ms
        assert total is not None and total >= sum(recomputed) - 1e-9, (layer, total, recomputed)
    encoder = records["encoder#0"].recompute_ms
    assert encoder is not None and encoder >= records["encoder.layer.0#0"].recompute_ms
