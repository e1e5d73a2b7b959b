"""The structure pass calls `torch.utils.flop_counter`'s formulas without their pytree-walking
wrappers (`capture/structure/flops.py`): the FLOPs must be the registry's own, op by op."""

from __future__ import annotations

import pytest
import torch

from wandb_modprof.capture.structure.flops import FORMULAS, flops_of

aten = torch.ops.aten


def _cases() -> list[tuple[object, tuple[object, ...]]]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    x, w = r(2, 3, 9, 9), r(4, 3, 3, 3)
    q = k = v = r(1, 2, 5, 8)
    return [
        (aten.mm.default, (r(5, 7), r(7, 3))),
        (aten.addmm.default, (r(3), r(5, 7), r(7, 3))),
        (aten.bmm.default, (r(4, 5, 7), r(4, 7, 3))),
        (aten.baddbmm.default, (r(4, 5, 3), r(4, 5, 7), r(4, 7, 3))),
        (aten.convolution.default, (x, w, None, [2, 1], [1, 0], [1, 1], False, [0, 0], 1)),
        (aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v)),
    ]


@pytest.mark.parametrize(("op", "args"), _cases(), ids=lambda v: str(v)[:40])
def test_each_formula_gives_the_registry_s_flops(op, args) -> None:
    out = op(*args)
    formula = FORMULAS[op._overloadpacket]
    assert flops_of(formula, args, {}, out) == int(formula(*args, out_val=out)) > 0
