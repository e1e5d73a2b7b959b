"""What `watch`'s worker process is sent per sample (`api.sample_handoff`): the session's plain
record and the readings its static memory and gradients are resolved from there.

Per parameter, not per module: the optimizer's bytes, gradient bytes and squared norms are
read on the training thread as flat lists; the sums per module happen in the worker, against
the model index's tables (`index_message`), sent once per index rather than with each sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wandb_modprof.capture.memory.gradient_readings import PendingGradientState
    from wandb_modprof.capture.memory.static_memory import StaticReadings
    from wandb_modprof.capture.session_record import SessionRecord


def index_message(static: StaticReadings) -> tuple[Any, ...]:
    """The model index's tables the worker resolves later samples' static memory and
    gradient readings with: sent once per index, not with every sample."""
    return ("index", static.members, static.static)


def sample_message(
    record: SessionRecord, gradients: PendingGradientState | None, static: StaticReadings
) -> tuple[Any, ...] | None:
    """A finished session's record as the worker takes it (None: it cannot leave this
    process, `SessionRecord.movable`), with the per-parameter readings read now (optimizer
    bytes, gradient bytes and norms on the host), resolved per module by the worker against
    the index's tables."""
    if not record.movable:
        return None
    reading = gradients.reading() if gradients is not None else None
    return ("reading", record, static.optim_read(), reading)
