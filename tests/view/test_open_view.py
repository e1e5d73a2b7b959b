"""The view the panel and the report open on (`view.meta.open_view`): inside the module that
holds >= 90 % of its parent's time, as deep as such a module goes; the root otherwise."""

from __future__ import annotations

import torch
from models import Dominated, ResNet, resnet_input
from torch import nn

import wandb_modprof
from wandb_modprof.view.meta import DOMINANT_SHARE


def _opened(model: nn.Module, x: torch.Tensor) -> tuple[list[str], wandb_modprof.Profile]:
    model(x).sum().backward()  # start-up, untimed
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(x).sum().backward()
    rows = prof.table().records()
    return [str(r["meta_value"]) for r in rows if r["meta_key"] == "open_view"], prof


def test_a_dominant_module_is_opened_as_deep_as_the_dominance_goes() -> None:
    opened, prof = _opened(Dominated(), torch.randn(512, 768))
    stats = prof.stats()

    def cost(key: str) -> float:
        return sum(stats[key].typical(m) or 0.0 for m in ("fwd_ms", "bwd_ms"))

    assert cost("body#0") >= DOMINANT_SHARE * cost("<root>#0")  # (the premise)
    assert cost("body.inner#0") >= DOMINANT_SHARE * cost("body#0")
    # inside `body.inner` no layer holds 90 %: it is the view to open on
    assert opened == ["body.inner#0"]
    views = {r["view_key"] for r in prof.table().resolved() if r["row_kind"] == "view"}
    assert "body.inner#0" in views


def test_a_balanced_model_opens_on_its_root() -> None:
    opened, prof = _opened(ResNet(), resnet_input())
    stats = prof.stats()
    root = sum(stats["<root>#0"].typical(m) or 0.0 for m in ("fwd_ms", "bwd_ms"))
    top = max(
        sum(s.typical(m) or 0.0 for m in ("fwd_ms", "bwd_ms"))
        for s in stats.values()
        if s.parent_key == "<root>#0"
    )
    assert top < DOMINANT_SHARE * root  # (the premise)
    assert opened == []
