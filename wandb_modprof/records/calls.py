"""The structure pass's output: the call tree and dataflow edges of one forward.

Plain frozen data (no torch): produced by `capture.structure.structure_pass`, read by the views,
the table and the profile file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from wandb_modprof.records.roofline import Roofline


@dataclass(frozen=True)
class CallInfo:
    """One module invocation as seen by the structure pass.

    `inputs` / `outputs` name the argument slots and output fields that carried tensors: the
    input and output nodes of this call's own view. `fwd_flops` includes children's FLOPs,
    `fwd_self_flops` only those of ops in the call's own code. `flops_known` is False for
    calls no structure pass saw (their node comes from the statistics alone).

    `compiled_region` is the key of the compiled region (`torch.compile`) the call ran in:
    its own key for a region's root (the call measured at the region's boundary), an
    ancestor's for a call inside one, whose own time and memory compilation fused into the
    region's (`capture.structure.fake_structure`); None outside compiled code, and for every
    call of a graph from a profile file before version 4, which did not record it.

    The work of the call's forward as the structure pass counted it (`work_known`; False for a
    graph no pass saw and for a profile file before version 6): `bwd_flops`, the FLOPs of its
    backward (the formulas of the backward kernels of its ops, for the inputs that needed a
    gradient); `fwd_bytes`, the bytes its ops read and wrote; `fwd_ops`, its ATen ops (views
    not counted). Each includes the children's; `*_self_*` only the call's own code's.
    `bwd_bytes` / `bwd_ops` likewise for the ops its backward ran, counted on the pass's own
    backward (`capture.structure.backward_work`) where one came (`bwd_work_known`; False for
    a step with no backward and for a profile file before version 7).

    `rows`: the rows (tokens) of the call's first tensor input when its counts were taken
    (`capture.forward.invocation.rows_of`; None where unknown). `rows_linear`: every op of
    the call and of the calls inside it is linear in those rows (matrix products, elementwise
    ops), so its counts scale with the rows it processes: the views give such a call the
    counts at its mean rows over the samples (`view.graphs.merge`).
    """

    key: str
    module_name: str
    module_type: str
    call_index: int
    parent_key: str | None
    depth: int
    order: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fwd_flops: int
    fwd_self_flops: int
    flops_known: bool
    compiled_region: str | None = None
    bwd_flops: int = 0
    bwd_self_flops: int = 0
    fwd_bytes: int = 0
    fwd_self_bytes: int = 0
    fwd_ops: int = 0
    fwd_self_ops: int = 0
    work_known: bool = False
    bwd_bytes: int = 0
    bwd_self_bytes: int = 0
    bwd_ops: int = 0
    bwd_self_ops: int = 0
    bwd_work_known: bool = False
    rows: int | None = None
    rows_linear: bool = False


@dataclass(frozen=True)
class DataEdge:
    """Inside view `view_key`, a tensor from `src_key` reaches `dst_key` (node keys as in
    `records.graph.GraphNode`)."""

    view_key: str
    src_key: str
    dst_key: str


@dataclass(frozen=True)
class Structure:
    """The call tree and dataflow of one forward; `signature` identifies its call sequence.
    `roofline`: the machine's peaks the calls' efficiency is measured against, found when the
    structure pass ran (None: a graph derived from a timed step, a pass that could not find
    them, or a profile file before version 6)."""

    signature: str
    training: bool
    calls: tuple[CallInfo, ...]
    edges: tuple[DataEdge, ...]
    roofline: Roofline | None = None


def input_key(view_key: str, slot: str) -> str:
    return f"{view_key}|in:{slot}"


def output_key(view_key: str, slot: str) -> str:
    return f"{view_key}|out:{slot}"


def self_key(view_key: str) -> str:
    return f"{view_key}|self"


def call_signature(keys: Iterable[str]) -> str:
    """A stable digest of a call sequence (the calls' keys in call order), equal for two steps
    that called the same modules in the same order. A plain key is `name#index`, so this is the
    digest files written before prefixed keys (`capture.forward.call_keys`) hold. Any `str`
    hashes: a module name with a lone surrogate (`"a\\ud800"`, legal in Python) is encoded
    with `surrogatepass`, where a strict encode would raise and fail every structure pass."""
    digest = hashlib.blake2b(digest_size=12)
    for key in keys:
        digest.update(f"{key}\n".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def routed_signature(training: bool) -> str:
    """The signature of a routed model's growing graph (`capture.structure.routed_graph`): one
    per training mode, unlike any call sequence's. Calls it holds without an edge were added
    from a step that derived no graph, or as list members no step called yet."""
    return call_signature(("<routed graph>", "train" if training else "eval"))
