"""A sampled step's phases around its modules: the stamps, and what they come to.

The forward and the backward are the root call's own (`resolve`: its forward time and its
backward, our hooks' time taken out). Around them the capture stamps, with the session's clock:

* `forward_closed`: the root's exit hook has finished its work (the loss phase starts);
* `finished`: our reading of the gradients after the backward has finished (`SessionHooks`);
* `optimizer_begin` / `optimizer_end`: the first optimizer `step` to start after that, and the
  last to end before the next forward (`torch.optim` global step hooks, put on for that window
  only: an unsampled step pays nothing for them);
* `next_forward`: the next root forward's entry, before anything of ours runs there.

`between` is the gap that follows the sampled step, from its optimizer step (or, where none
ran, from its backward) to the next forward: the same span of the next step's "between", taken
where the stamps already are, so an unsampled step reads no clock of ours.

Under gradient accumulation the optimizer steps after more micro-batches' forwards. Where the
optimizer is known (passed to `watch` / `profile`, as the Lightning and Hugging Face callbacks
do), its step hooks stay on past the next forward until that optimizer's step has run, and the
sample is not resolved before (`PhaseStamps.settled`); the next sample's backward, or the end of
the capture, gives up on it. An unsampled micro-batch pays nothing: the hooks run only inside
`optimizer.step()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.hooks import RemovableHandle

from wandb_modprof.capture.step.clock import Clock
from wandb_modprof.records.phases import PHASES, StepPhases

NO_BACKWARD = "no backward ran in the sampled step"
NO_OPTIMIZER = "no optimizer step ran between the backward and the next forward"
NO_NEXT_FORWARD = "no forward followed the sampled step before the profile was read"
NOT_ALONE = "another sampled step of this model began before this one's backward ended"
NOT_COMPLETE = "its device events had not completed when the sample was resolved"
NO_STEP_BEFORE_NEXT = "the optimizer given did not step before the next sampled step's backward"


@dataclass
class PhaseStamps:
    """The stamps of one sampled step's phases outside its modules (the session's clock; on
    the host clock plain ints, so they travel with the session to the worker)."""

    forward_closed: Any = None
    finished: Any = None
    optimizer_begin: Any = None
    optimizer_end: Any = None
    next_forward: Any = None
    why_no_next: str = NO_NEXT_FORWARD
    why_no_optimizer: str = NO_OPTIMIZER
    # the newest of `optimizer_end` and `next_forward` (under accumulation the optimizer's
    # end comes last): a device's stream completes its events in order
    newest: Any = None
    # False while the sample waits past the next forward for the optimizer's step: it is not
    # resolved before (`SessionRecord.ready`)
    settled: bool = True


class PhaseWatch:
    """Stamps the optimizer step and the next forward after a sampled step's backward.

    `optimizer`: the one passed to `watch` / `profile` (only its steps count); None: the first
    optimizer to step after the backward, whichever it is."""

    def __init__(self, optimizer: torch.optim.Optimizer | None) -> None:
        self.clock: Clock | None = None  # the open sample's session's
        self.optimizer = optimizer
        self.open: PhaseStamps | None = None  # waiting for the next forward
        self.waiting: PhaseStamps | None = None  # past it, for the given optimizer's step
        self._may_wait = False
        self._handles: list[RemovableHandle] = []

    def after_backward(self, stamps: PhaseStamps, clock: Clock, backward: bool = True) -> None:
        """The sampled step's gradients are read: its optimizer step and the next forward
        follow (stamped with `clock`, the session's); `backward`: one ran (a forward alone
        waits for no optimizer step past the next forward)."""
        if self.open is not None:
            self.open.why_no_next = NOT_ALONE
        self._give_up(NO_STEP_BEFORE_NEXT)
        self._remove()
        self.clock = clock
        stamps.finished = clock.stamp()
        self.open = stamps
        self._may_wait = backward
        self._handles = [
            register_optimizer_step_pre_hook(self._optimizer_pre),
            register_optimizer_step_post_hook(self._optimizer_post),
        ]

    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        stamps, clock = self.open or self.waiting, self.clock
        if stamps is None or clock is None:
            return
        if self.optimizer is not None and optimizer is not self.optimizer:
            return
        if stamps.optimizer_begin is None:
            stamps.optimizer_begin = clock.stamp()

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        stamps, clock = self.open or self.waiting, self.clock
        if stamps is None or clock is None or stamps.optimizer_begin is None:
            return
        if self.optimizer is None or optimizer is self.optimizer:
            stamps.optimizer_end = stamps.newest = clock.stamp()
            if stamps is self.waiting:  # (accumulation: the step the sample waited for)
                stamps.settled = True
                self.waiting = None
                self._remove()

    def at_forward(self) -> None:
        """A root forward begins: the open sample's `between` ends here."""
        stamps, clock = self.open, self.clock
        if stamps is None or clock is None:
            return
        stamps.next_forward = stamps.newest = clock.stamp()
        self.open = None
        if self.optimizer is not None and self._may_wait and stamps.optimizer_end is None:
            self.waiting = stamps  # the optimizer given has not stepped yet: accumulation
            stamps.settled = False
            return
        self._remove()

    def close(self) -> None:
        """At detach: no forward follows, nor an optimizer step."""
        self.open = None
        self._give_up(NO_OPTIMIZER)
        self._remove()

    def _give_up(self, why: str) -> None:
        if self.waiting is not None:
            self.waiting.why_no_optimizer = why
            self.waiting.settled = True
            self.waiting = None

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def step_phases(
    stamps: PhaseStamps | None,
    clock: Clock,
    ref: Any,
    forward_ms: float,
    backward_ms: float | None,
    backward_begin: Any,
) -> StepPhases:
    """The phases of a resolved sample: `forward_ms` / `backward_ms` the root call's,
    `backward_begin` the first backward node's start stamp."""
    ms: dict[str, float] = {"forward": forward_ms}
    why: dict[str, str] = {}
    if stamps is None:
        return StepPhases(ms, {p: "not recorded" for p in PHASES if p != "forward"})
    # On a device clock the stamps after the backward may still be running when the sample is
    # resolved (the next forward's, just recorded): never waited for, those phases are named.
    late = [s for s in (stamps.optimizer_end, stamps.next_forward) if s is not None]
    if late and not all(clock.ready(s) for s in late):
        stamps = PhaseStamps(
            stamps.forward_closed,
            stamps.finished,
            why_no_next=NOT_COMPLETE,
        )
        why["optimizer"] = NOT_COMPLETE
    at = dict(
        zip(
            ("closed", "begin", "finished", "opt0", "opt1", "next"),
            clock.offsets_ms(
                ref,
                [
                    stamps.forward_closed,
                    backward_begin,
                    stamps.finished,
                    stamps.optimizer_begin,
                    stamps.optimizer_end,
                    stamps.next_forward,
                ],
            ),
            strict=True,
        )
    )
    if backward_ms is not None and _known(at["closed"], at["begin"]):
        ms["loss"] = max(0.0, at["begin"] - at["closed"])
        ms["backward"] = backward_ms
    else:
        why["loss"] = why["backward"] = NO_BACKWARD
    if _known(at["opt0"], at["opt1"]):
        ms["optimizer"] = at["opt1"] - at["opt0"]
    else:
        why.setdefault("optimizer", stamps.why_no_optimizer)
    # (under accumulation the optimizer steps after the next forward: `between` ends first)
    stepped = "optimizer" in ms and not at["opt1"] > at["next"]
    start = at["opt1"] if stepped else at["finished"]
    if _known(start, at["next"]):
        ms["between"] = max(0.0, at["next"] - start)
    else:
        why["between"] = stamps.why_no_next
    return StepPhases(
        {p: ms[p] for p in PHASES if p in ms}, {p: why[p] for p in PHASES if p in why}
    )


def _known(*values: float) -> bool:
    return all(not math.isnan(v) for v in values)
