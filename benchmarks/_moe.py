"""A mixture-of-experts model for the scale benchmark, from a transformers Qwen2-MoE config.

transformers 5 fuses the experts: `Qwen2MoeExperts` (and `MixtralExperts`) hold all experts'
weights as two 3-D parameters and loop over the hit experts inside one module, so a step calls
one `experts` module per layer (and its shared `act_fn` once per hit expert), not one module
per expert. The layout most MoE code still has (transformers 4's `Qwen2MoeSparseMoeBlock`,
Mixtral's `MixtralBlockSparseTop2MLP`, DeepSeek-MoE, Megatron's sequential experts) is a
`ModuleList` of expert MLPs, one module call each: that is what a user profiling experts sees
and what makes a step tens of thousands of calls. `moe_model` builds the transformers model and
swaps each layer's fused `experts` for `ExpertList`, the same routing with one
`Qwen2MoeMLP(config, moe_intermediate_size)` per expert (`gate_proj`, `up_proj`, `act_fn`,
`down_proj`: 5 calls per hit expert).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ExpertList(nn.Module):
    """`Qwen2MoeExperts.forward` (transformers 5.24) over a `ModuleList` of expert MLPs."""

    def __init__(self, config: Any) -> None:
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeMLP

        super().__init__()
        self.num_experts = config.num_experts
        self.experts = nn.ModuleList(
            Qwen2MoeMLP(config, intermediate_size=config.moe_intermediate_size)
            for _ in range(config.num_experts)
        )

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts)
            mask = mask.permute(2, 1, 0)  # expert, top-k slot, token
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()[:, 0].tolist()
        for e in hit:
            slot, token = torch.where(mask[e])
            y = self.experts[e](hidden_states[token]) * top_k_weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out


def moe_config(layers: int, experts: int, top_k: int) -> Any:
    import transformers

    return transformers.Qwen2MoeConfig(
        vocab_size=256, hidden_size=16, intermediate_size=16, moe_intermediate_size=8,
        shared_expert_intermediate_size=8, num_hidden_layers=layers, num_attention_heads=2,
        num_key_value_heads=2, num_experts=experts, num_experts_per_tok=top_k,
        max_position_embeddings=64, decoder_sparse_step=1, mlp_only_layers=[],
        output_router_logits=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip


def moe_model(layers: int = 48, experts: int = 128, top_k: int = 8) -> nn.Module:
    """Qwen2-MoE with tiny dimensions and one module per expert (see the module docstring).
    The routers get random weights (transformers initialises them to zeros, which routes every
    token to the first `top_k` experts), so a 64-token batch reaches nearly every expert."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = moe_config(layers, experts, top_k)
    config._attn_implementation = "eager"
    model = transformers.Qwen2MoeForCausalLM(config)
    generator = torch.Generator().manual_seed(0)
    for layer in model.model.layers:
        block = layer.mlp
        block.experts = ExpertList(config)
        with torch.no_grad():
            block.gate.weight.normal_(0.0, 1.0, generator=generator)
    return model


def moe_ids(tokens: int = 64) -> torch.Tensor:
    return torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(0))
