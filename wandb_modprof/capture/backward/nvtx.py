"""Opt-in NVTX ranges for Nsight Systems: `<module>.forward` and `<module>.backward`.

Forward ranges are pushed and popped on the forward thread (they nest like the calls).
Backward ranges follow the same segments as traces (`sinks.traces.trace_events.segments`): as each
autograd node starts, the ranges of calls it does not belong to are closed and those of its
owner's chain opened. They use `range_start`/`range_end`, which are not tied to a thread,
because the end of a backward is reported on whichever thread finishes it. Only sampled steps
carry ranges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from wandb_modprof._errors import ModProfError

if TYPE_CHECKING:
    from wandb_modprof.capture.backward.nodes import NodeTable
    from wandb_modprof.capture.forward.invocation import Invocation


def check_available() -> None:
    """`nvtx=True` needs NVTX, which ships with the CUDA (and ROCm) builds of torch; no GPU is
    needed, the ranges are host-side markers. Fail at the boundary, saying what is missing: a
    CPU-only build has no NVTX at all, a CUDA build whose NVTX calls fail has a broken one."""
    try:
        torch.cuda.nvtx.range_push("wandb_modprof")
        torch.cuda.nvtx.range_pop()
    except (RuntimeError, AttributeError) as error:
        cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
        if cuda is None and hip is None:
            what = f"torch {torch.__version__} is a CPU-only build, which has no NVTX"
        else:
            build = f"CUDA {cuda}" if cuda is not None else f"ROCm {hip}"
            device = "a GPU is visible" if torch.cuda.is_available() else "no GPU is visible"
            what = (
                f"torch {torch.__version__} is a {build} build but its NVTX calls fail ({device})"
            )
        raise ModProfError(
            f"nvtx=True needs a CUDA build of torch with working NVTX: {what}: {error}"
        ) from None


class NvtxRanges:
    """The ranges of one sampled step."""

    def __init__(self) -> None:
        self._pushed = 0
        # per thread: [(key, range id)], outermost first
        self._open: dict[int, list[tuple[str, int]]] = {}
        self._chains: list[tuple[tuple[str, str], ...]] | None = None  # per invocation

    def backward_node_of(
        self, invocations: Sequence[Invocation], nodes: NodeTable, slot: int, stack: list[int]
    ) -> None:
        """Node `slot` starts (`stack`: the slots running on its thread, it last): open the
        ranges of the call that owns it and of that call's ancestors."""
        if self._chains is None:
            self._chains = []
            for inv in invocations:  # preorder: parents first
                head = self._chains[inv.parent] if inv.parent >= 0 else ()
                self._chains.append((*head, (inv.key, inv.name)))
        owner = nodes.owner[slot]
        if owner < 0:
            return  # a node of an unmatched recompute: no call to name a range after
        chain = self._chains[owner]
        outer = stack[-2] if len(stack) > 1 and nodes.owner[stack[-2]] >= 0 else -1
        if outer >= 0:  # nested in a node of a call it does not descend from: stay in that one
            around = self._chains[nodes.owner[outer]]
            if chain[: len(around)] != around:
                chain = around
        self.backward_node(nodes.thread[slot], chain)

    def forward_enter(self, name: str) -> None:
        torch.cuda.nvtx.range_push(f"{name}.forward")
        self._pushed += 1

    def forward_exit(self) -> None:
        if self._pushed:
            torch.cuda.nvtx.range_pop()
            self._pushed -= 1

    def forward_abort(self) -> None:
        """The forward failed part-way: pop what it left open."""
        while self._pushed:
            self.forward_exit()

    def backward_node(self, thread: int, chain: Sequence[tuple[str, str]]) -> None:
        """A node owned by the last call of `chain` ((key, label) root first) starts."""
        stack = self._open.setdefault(thread, [])
        common = 0
        while common < len(stack) and common < len(chain) and stack[common][0] == chain[common][0]:
            common += 1
        while len(stack) > common:
            torch.cuda.nvtx.range_end(stack.pop()[1])
        for key, label in chain[common:]:
            stack.append((key, torch.cuda.nvtx.range_start(f"{label}.backward")))

    def backward_end(self) -> None:
        """Close every open backward range. Runs from the engine's end-of-backward callback
        and from error paths, so it must not raise: a failing NVTX call is dropped."""
        stacks, self._open = list(self._open.values()), {}
        for stack in stacks:
            while stack:
                # An unbalanced range beats a broken backward.
                with contextlib.suppress(Exception):
                    torch.cuda.nvtx.range_end(stack.pop()[1])
