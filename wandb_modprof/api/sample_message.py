"""What `watch`'s worker process is sent per sample (`api.sample_handoff`): the session as
plain data and the readings its static memory and gradients are resolved from there.

Per parameter, not per module: the optimizer's bytes, gradient bytes and squared norms are
read on the training thread as flat lists; the sums per module happen in the worker, against
the model index's tables (`index_message`), sent once per index rather than with each sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wandb_modprof.capture.memory.static_memory import StaticReader, optim_bytes
from wandb_modprof.capture.session_record import session_record

if TYPE_CHECKING:
    from wandb_modprof.capture.memory.gradient_readings import PendingGradientState
    from wandb_modprof.capture.session import StepSession
    from wandb_modprof.stats.accumulator import StaticFn


def index_message(reader: StaticReader) -> tuple[Any, ...]:
    """The model index's tables the worker resolves later samples' static memory and
    gradient readings with: sent once per index, not with every sample."""
    return ("index", reader.index.members, reader.index.static)


def sample_message(
    session: StepSession, gradients: PendingGradientState | None, static_fn: StaticFn
) -> tuple[Any, ...] | None:
    """A finished session as the worker takes it (None: it cannot leave this process): with a
    `StaticReader`, the per-parameter readings (optimizer bytes, gradient bytes and norms on
    the host), resolved per module by the worker against the index's tables; else the
    static memory and gradient state resolved here."""
    record = session_record(session)
    if record is None:
        return None
    if isinstance(static_fn, StaticReader):
        optim = optim_bytes(static_fn.index, static_fn.optimizer)
        reading = gradients.reading() if gradients is not None else None
        return ("reading", record, optim, reading)
    static = dict(static_fn({inv.name for inv in session.invocations}))
    return ("sample", record, static, gradients.resolve() if gradients is not None else None)
