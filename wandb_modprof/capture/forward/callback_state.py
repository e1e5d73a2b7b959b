"""What `on_module` callbacks receive (`ModuleEvent`), and the bookkeeping of one module call's
backward (`CallState`) that the engine in `module_callbacks` keeps on its autograd nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from torch.utils.hooks import RemovableHandle

Phase = Literal["forward_start", "forward_end", "backward_start", "backward_end"]
PHASES: tuple[Phase, ...] = get_args(Phase)


@dataclass(frozen=True)
class ModuleEvent:
    """What a callback of `on_module` receives.

    `call` counts the module's forward calls since `on_module` (0-based); the backward events
    of a call carry the number of its forward, so a module called three times per step sees
    calls 0, 1, 2 forward and then, usually, 2, 1, 0 in backward.

    Examples:
        >>> ModuleEvent(phase="backward_start", call=0, module_type="Sequential")
        ModuleEvent(phase='backward_start', call=0, module_type='Sequential')
    """

    phase: Phase
    call: int
    module_type: str


Callback = Callable[[ModuleEvent], object]


class CallState:
    """The backward bookkeeping of one forward call: ints and hook handles, no tensors.

    Owned by the hooks on the call's autograd nodes, so it lives exactly as long as the graph.
    """

    __slots__ = (
        "__weakref__",
        "acc",
        "acc_ran",
        "broken",
        "call",
        "feeds",
        "handles",
        "names",
        "open",
        "pending",
        "pending_acc",
        "task",
    )

    def __init__(self, call: int) -> None:
        self.call = call
        self.names: dict[int, str] = {}  # sequence number -> node type, of the hooked nodes
        self.handles: list[RemovableHandle] = []
        # AccumulateGrad hooks by parameter id. Those nodes outlive the graph (a parameter's
        # node is shared by every graph built while it lives), so they are removed explicitly.
        self.acc: dict[int, RemovableHandle] = {}
        self.acc_ran: set[int] = set()
        self.open = False
        self.pending: set[int] = set()
        self.pending_acc: set[int] = set()
        self.feeds: dict[int, set[int]] = {}  # running node -> the AccumulateGrads it feeds
        self.task = -1  # the backward whose end-of-backward callback is queued
        # An internal error lost track of the pending nodes: end at the end of the backward.
        self.broken = False

    def remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        remove_all(self.acc)


def remove_all(acc: dict[int, RemovableHandle]) -> None:
    for handle in acc.values():
        handle.remove()
    acc.clear()


def remove_calls(calls: list[CallState]) -> None:
    for state in calls:
        state.remove_hooks()
