"""The call tree and the per-view graphs are reused between tables of the same profile
(`view.graphs.call_graphs`): equal to a fresh `merge` + `view_graphs`, and rebuilt when the
structure passes or the calls only the statistics know change."""

from __future__ import annotations

import dataclasses

from models import TinyGPT, gpt_input

import wandb_modprof
from wandb_modprof.view.graphs import call_graphs, merge, view_graphs


def _profile() -> wandb_modprof.Profile:
    model = TinyGPT()
    x = gpt_input()
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(x).float().pow(2).mean().backward()
    return prof


def test_the_same_structures_and_calls_reuse_the_tree_and_views() -> None:
    data = _profile().snapshot()
    tree, graphs = call_graphs(data.structures, data.stats.values())
    assert tree == merge(data.structures, data.stats.values())
    assert list(graphs) == view_graphs(tree)
    again = call_graphs(data.structures, dict(data.stats).values())
    assert again[0] is tree and again[1] is graphs


def test_a_call_no_pass_saw_or_another_pass_rebuilds_them() -> None:
    data = _profile().snapshot()
    tree, _ = call_graphs(data.structures, data.stats.values())
    root = next(iter(data.stats.values()))
    extra = dataclasses.replace(
        root, key="extra#0", module_name="extra", parent_key=root.key, depth=1, order=10**6
    )
    stats = [*data.stats.values(), extra]
    with_extra, views = call_graphs(data.structures, stats)
    assert with_extra is not tree and "extra#0" in {c.key for c in with_extra.calls}
    assert with_extra == merge(data.structures, stats) and list(views) == view_graphs(with_extra)
    # equal passes that are other objects (a profile read again): built again, equal
    copies = tuple(dataclasses.replace(s) for s in data.structures)
    rebuilt, _ = call_graphs(copies, data.stats.values())
    assert rebuilt is not tree and rebuilt == tree
