"""The sampled steps a capture still waits on: forwards whose backward has not finished.

A capture keeps a few such sessions (with `loss = f(a) + f(b)` the backward of a sampled
`f(a)` runs after `f(b)`); at each new root forward the ones that can no longer finish are
abandoned, and a checkpoint recompute during a backward belongs to the session running it.
"""

from __future__ import annotations

from wandb_modprof.capture.backward.node_stamps import NodeStamps
from wandb_modprof.capture.session import StepSession


def backward_running(sessions: list[StepSession]) -> NodeStamps | None:
    """The backward half of the session whose backward is running: a checkpoint recompute
    belongs to it."""
    for session in sessions:
        if session.bwd_started and not session.closed:
            return session.backward
    return None


def prune_sessions(sessions: list[StepSession], max_pending: int) -> list[StepSession]:
    """At a new root forward: the sessions still worth keeping, the others abandoned."""
    # A backward that started but never finished (it raised) will not finish now.
    for session in sessions:
        if session.bwd_started and not session.closed:
            session.abandon()
    kept = [s for s in sessions if not s.closed]
    # Forwards whose backward never came (or not yet) are kept a little while: with
    # `loss = f(a) + f(b)` the backward of a sampled `f(a)` runs after `f(b)`.
    while len(kept) > max_pending:
        kept.pop(0).abandon()
    return kept
