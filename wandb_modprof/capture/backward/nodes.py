"""The autograd nodes one sampled step hooked, in parallel lists indexed by slot.

Filled by the step session's node stamps (`node_stamps.NodeStamps`) as calls return (one `add`
per node), stamped by their node hooks during the backward, read by `resolve` after the step.
Plain lists of ints and stamps: no node or tensor is held. Also what is read off a node as it
is added: its class name (`node_name`) and the gradient bytes its accumulation creates
(`grad_to_create`).
"""

from __future__ import annotations

from typing import Any


class NodeTable:
    __slots__ = (
        "accumulate",
        "alloc0",
        "alloc1",
        "enclosing",
        "grad_new",
        "name",
        "own0",
        "own1",
        "owner",
        "peak",
        "seq",
        "t0",
        "t1",
        "thread",
        "via",
    )

    def __init__(self) -> None:
        self.seq: list[int] = []  # autograd sequence number; -1 for AccumulateGrad nodes
        self.name: list[str] = []  # autograd node class, for traces
        self.thread: list[int] = []  # native id of the thread that ran it
        self.via: list[int] = []  # AccumulateGrad: the slot of the node feeding it
        self.owner: list[int] = []  # index of the invocation charged (-1: not yet / none)
        self.t0: list[Any] = []  # clock stamps around the node's execution
        self.t1: list[Any] = []
        # our own time (`Clock.own_at`) at t0 and t1: the saved-tensor unpack hooks it ran
        self.own0: list[int] = []
        self.own1: list[int] = []
        self.enclosing: list[int] = []  # slot of the node it ran nested in (reentrant), or -1
        self.alloc0: list[int | None] = []  # accelerators: allocated bytes when it started
        self.alloc1: list[int | None] = []  # accelerators: allocated bytes when it ended
        # AccumulateGrad: bytes of the gradient it creates (0: the parameter had one before the
        # step, so its accumulation allocates nothing new); the CPU memory curve adds them.
        self.grad_new: list[int] = []
        self.peak: list[int | None] = []  # accelerators: allocator peak while it ran
        # AccumulateGrad nodes outlive the step's graph; they cannot start a sampled backward
        self.accumulate: list[bool] = []

    def __len__(self) -> int:
        return len(self.seq)

    def add(self, seq: int, name: str, via: int, owner: int, accumulate: bool) -> int:
        """A newly hooked node; returns its slot."""
        slot = len(self.seq)
        self.seq.append(seq)
        self.name.append(name)
        self.thread.append(0)
        self.via.append(via)
        self.owner.append(owner)
        self.t0.append(None)
        self.t1.append(None)
        self.own0.append(0)
        self.own1.append(0)
        self.enclosing.append(-1)
        self.alloc0.append(None)
        self.alloc1.append(None)
        self.grad_new.append(0)
        self.peak.append(None)
        self.accumulate.append(accumulate)
        return slot


_NAMES: dict[type, str] = {}  # autograd node class -> its name (one string object per class)
_MAX_NAMES = 4096  # classes made on the fly (custom Functions) would grow it without end


def node_name(node: Any) -> str:
    """`node.name()`, asked once per node class: one shared string per class pickles once per
    hand-off, not once per node. Only classes named as their nodes are (every generated
    backward node, custom Functions); C++ nodes torch has no Python class for share one
    generic class and are asked each time."""
    kind = type(node)
    name = _NAMES.get(kind)
    if name is None:
        name = node.name()
        if name == kind.__name__:
            if len(_NAMES) >= _MAX_NAMES:
                _NAMES.clear()
            _NAMES[kind] = name
    return name


def grad_to_create(param: Any) -> int:
    """Bytes the gradient of `param` will take when its AccumulateGrad node runs: none if it
    has one already (accumulation adds in place), else its size (the CPU memory curve)."""
    if param.grad is not None:
        return 0
    return int(param.numel()) * int(param.element_size())
