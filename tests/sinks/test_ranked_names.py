"""The ranked list's names (`tools/spec/ranked.py`, `top`) rendered by Vega (vl-convert): each
entry reads differently from every other one listed (an MoE's "…experts.1" of every layer
did not), as `panel.ranked_names` computes them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import vl_convert as vlc
from browser import stored
from models import MoEStack, moe_input
from panel import ranked_names, records, texts, wandb_patched

import wandb_modprof
from wandb_modprof.records.modes import DEFAULT_MODE, mode
from wandb_modprof.sinks import spec as _spec

NAMES = [
    "layers.0.experts.1",
    "layers.1.experts.1",
    "layers.0.experts.12",
    "layers.1.router",
    "transformer.h.0.mlp.c_fc",
    "transformer.h.1.mlp.c_fc",
    "transformer.wte",
    "enc",
    "enc",
    "model.layers.12.mlp.experts.1",
    "model.layers.13.mlp.experts.1",
    "a_very_long_module_name_without_dots",
    "x.averyveryverylongcontainer_name.12",
    "y.averyveryverylongcontainer_name.12",
    "m.block.12.some_long_attention_projection.q",
]


def _top_only(names: list[str]) -> dict[str, Any]:
    """The spec's `top` dataset alone, over module nodes named `names` (ranked in that order),
    with a text mark showing each entry."""
    top = next(d for d in _spec.filled({})["data"] if d["name"] == "top")
    nodes = [
        {
            "node_kind": "module",
            "module_name": name,
            "label": name.rsplit(".", 1)[-1],
            "node_key": f"{name}#{i}",
            "v_m": 100.0 - i,
        }
        for i, name in enumerate(names)
    ]
    signals = {
        "mode": "m",
        "mode_rank_label": "",
        "top_n": 15,
        "mode_unit": "ms",
        "mode_rank_unit": "ms",
        "tot": {},
        "mode_total": "",
    }
    return {
        "signals": [{"name": k, "value": v} for k, v in signals.items()],
        "data": [{"name": "nodes_all", "values": nodes}, top],
        "marks": [
            {
                "type": "text",
                "name": "entry",
                "from": {"data": "top"},
                "encode": {"update": {"text": {"field": "rank_text"}, "y": {"field": "rank"}}},
            }
        ],
    }


def _listed(scene: dict[str, Any], mark: str) -> list[str]:
    """The entries' names in rank order ("3. name" -> "name")."""
    ranked = sorted(texts(scene, mark), key=lambda t: int(t.split(".", 1)[0]))
    return [t.split(". ", 1)[1] for t in ranked]


def test_every_listed_name_tells_its_entry_apart() -> None:
    shown = _listed(vlc.vega_to_scenegraph(_top_only(NAMES)), "entry")
    assert shown == ranked_names([(n, f"{n}#{i}") for i, n in enumerate(NAMES)])
    assert len(set(shown)) == len(shown)
    assert shown[:4] == [
        "layers.0.experts.1",  # not "…experts.1" twice
        "layers.1.experts.1",
        "…0.experts.12",  # its end is unique already
        "layers.1.router",
    ]
    assert shown[4] == "…h.0.mlp.c_fc" and shown[6] == "transformer.wte"  # as before
    assert shown[7:9] == ["enc #7", "enc #8"]  # one module called twice: its calls
    # too long to show whole: the part that differs, then the name's end
    assert shown[9:11] == ["…layers.12…experts.1", "…layers.13…experts.1"]
    assert all(len(s) <= 16 + 4 + 4 for s in shown)


@pytest.fixture(scope="module")
def moe_rows() -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = MoEStack(experts=8)
    x = moe_input(model)
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(x).square().mean().backward()
    return records(prof.table())


def test_an_moe_ranked_list_names_each_layers_experts_apart(moe_rows: list[dict[str, Any]]) -> None:
    spec = wandb_patched(_spec.filled({}), 1100, 640)
    next(d for d in spec["data"] if d["name"] == "wandb")["values"] = stored(moe_rows)
    scene = vlc.vega_to_scenegraph(spec)
    shown = _listed(scene, "top_label")
    assert len(shown) >= 8
    m = mode(DEFAULT_MODE)
    ranked = sorted(
        (
            (m.value(r), r["node_key"], r["module_name"])
            for r in moe_rows
            if r["row_kind"] == "node" and r["node_kind"] == "module" and m.value(r) is not None
        ),
        key=lambda x: (-x[0], x[1]),
    )[: len(shown)]
    assert shown == ranked_names([(name, key) for _, key, name in ranked])
    assert len(set(shown)) == len(shown)
    # both layers' experts are listed, and no two read alike
    assert any(name.startswith("layers.0.experts.") for *_, name in ranked)
    assert any(name.startswith("layers.1.experts.") for *_, name in ranked)
