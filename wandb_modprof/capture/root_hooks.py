"""The root hooks' step boundaries: what each forward of the watched model is, and its end.

The root module always carries one forward pre-hook and one forward hook (cheap: a counter and
a few attribute reads on an unsampled step). At the root's entry the pre-hook decides what the
step is: sampled (a step session starts, `session_hooks`), a structure pass, a step under a
`torch.func` transform (counted, not measured), or untouched (the submodules' hooks come off);
on the way it hands a finished sample to `watch`'s logging (`delivery`) and prunes the
sessions whose backward can no longer come (`step_queue`). At the root's exit the hook closes
the timed forward and queues its session for its backward. A root that calls itself is one
step; a forward that a KeyboardInterrupt left without its exit hook is recovered from at the
next root entry.

The base class of `hooks.Capture`: the hook bodies read the capture's state in one attribute
read, as before this was split from `hooks.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from torch import nn

from wandb_modprof.capture.forward.callstack import call_depth
from wandb_modprof.capture.memory.static_memory import ROOT_NAME
from wandb_modprof.capture.session_hooks import SessionHooks
from wandb_modprof.capture.step import gc_pause, interrupt_guard
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step_queue import prune_sessions
from wandb_modprof.capture.structure.pass_modes import structure_pass_active

_MAX_PENDING = 4


class RootHooks(SessionHooks):
    """The root's forward pre-hook and forward hook of `hooks.Capture`.

    The attributes declared below without a value are the capture's, set by its `__init__`."""

    _should_sample: Callable[[nn.Module], int | None]  # the step to sample, or None
    _deliver_fn: Callable[[], None]  # hands a finished sample to `after_sample` (`delivery`)
    _cold: bool  # the first step's sample is the model's first step in this process
    _first_steps: int  # counts down over the first two steps, then never read again
    root_hook_s: float  # the root hooks' own seconds so far (`api.overhead`)

    def _root_pre(self, module: nn.Module, args: Any, kwargs: Any) -> ForwardFrame | None:
        start = perf_counter()
        try:
            if self._enter_root(module, args, kwargs):
                return ForwardFrame((args, kwargs))  # a window opened: see `ForwardFrame`
        except Exception as error:
            self._internal_error(ROOT_NAME, error)
        finally:
            self.root_hook_s += perf_counter() - start
        return None

    def _enter_root(self, module: nn.Module, args: Any, kwargs: Any) -> bool:  # noqa: PLR0911  (an exit per kind of step)
        """What this forward is (the module's docstring); True where it opened a window of
        ours (a sampled forward or a structure pass)."""
        # The unsampled path: a counter, a few attribute reads and one C call.
        if tp.in_backward():
            self._pre(module, args, kwargs)  # a checkpoint recompute of the root
            return False
        if self._root_depth:
            if call_depth(module) > 1:  # the root calls itself: one step, not several
                self._root_depth += 1
                if self._forward is not None or self.structures.current is not None:
                    self._pre(module, args, kwargs)
                return False
            self._recover_interrupted()
        self._root_depth = 1
        self._index_checked = False
        if self._first_steps:  # (later steps: one attribute read)
            self._first_steps -= 1
            self._cold_step = self._cold and self._first_steps == 1
            _registry.stepped(self.model)
        if gc_pause.holding():  # a window left without its end (a failed backward)
            recover_interrupted_captures(entering=self)
        if self.sample_due:
            self._deliver_fn()
        if self._stale_sessions:
            self._stale_sessions = [
                s for s in self._stale_sessions if not s.pop_saved_tensors_hooks()
            ]
        if self._sessions:
            self._sessions = prune_sessions(self._sessions, _MAX_PENDING)
            for pending in self._sessions:
                pending.superseded = True
        if self.structures.stale or self.structures.backward is not None:
            self.structures.between_steps()
        step = self._should_sample(module)
        if (step is not None or self.structures.due) and tp.functorch_active():
            self._skip_transformed_step()  # (a step, counted, but not measured)
            return False
        # A model with compiled code: its graph is traced on fake tensors, before this step.
        if self.structures.due:  # (an unsampled step with no graph due: attribute reads)
            self.structures.before_step(module, args, kwargs)
        # A sampled step while no graph was captured yet derives the graph from its own
        # forward (`step_dataflow`): one forward + backward gives the whole profile.
        derive = step is not None and self.structures.derive_from_sample()
        if not derive and self.structures.due and self.structures.can_start(module):
            # A structure pass is never timed: this step's sample (if it was one) is skipped.
            self.structures.start(module, args, kwargs)
            return True
        if step is None:
            if self.children_hooked:
                self._maybe_detach_children()
            return False
        if structure_pass_active():
            return False  # another model's structure pass runs through this forward: not timed
        self._start(step, module, args, kwargs, derive)
        return True

    def _root_post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        start = perf_counter()
        session = self._forward
        try:
            if tp.in_backward():
                self._post(module, args, kwargs, result)  # a checkpoint recompute of the root
                return
            self._root_depth = max(0, self._root_depth - 1)
            if self.structures.current is not None:
                self._exit_pass(module, result)
                return
            if session is None:
                return
            if self._materialised_now():
                session.failed = True  # dropped quietly at the root's exit, as below
            session.exit(id(module), result)
            if not session.forward_done:
                return  # the root was re-entered; its outer call is still open
            self._forward = None
            if session.structure is not None:
                self.structures.add_derived(session.structure)
            elif session.structure_error is not None:
                self.structures.derive_failed = True  # the next step's pass draws the graph
                self.warn_once("<module graph>", session.structure_error)
            if not session.closed:
                self._sessions.append(session)
                self.structures.check(session, module.training)
            self._maybe_detach_children()
        except Exception as error:
            self._forward = None
            if session is not None:
                self._end_failed_forward(session)
            self._internal_error(ROOT_NAME, error)
            self._maybe_detach_children()
        finally:
            # the model may change between forwards; within this one (the graph check above
            # included) one walk of it sufficed
            self._index_checked = False
            self.root_hook_s += perf_counter() - start

    def _recover_interrupted(self) -> None:
        """A forward ended without our root exit hook: `Module._call_impl` runs always-call
        hooks on `Exception` only, so a KeyboardInterrupt or SystemExit skips them."""
        self._root_depth = 0
        if self.structures.current is not None:  # (the driver's warning counts these frames)
            self.structures.end()
            self.structures.rearm()
        session, self._forward = self._forward, None
        if session is not None:
            self._end_failed_forward(session)
        self._maybe_detach_children()

    def recover_dead_windows(self, interrupted: bool) -> None:
        """From outside this model's forward (another model's root entry, `profile()`,
        `watch()`, `unwatch()`), or from the SIGINT handler (`interrupted`: every window of
        this thread is about to unwind): end a root forward no longer on the stack (a
        `KeyboardInterrupt` skipped its exit hook) and a sampled backward that began but never
        reached its end callback (a node raised); pop what a stale session or pass left pushed."""
        if self._root_depth and (interrupted or call_depth(self.model) == 0):
            self._recover_interrupted()
        self._end_dead_backwards()
        if self._stale_sessions:
            self._stale_sessions = [
                s for s in self._stale_sessions if not s.pop_saved_tensors_hooks()
            ]
        # (stale passes' modes only: a pass's backward may still come after its forward)
        self.structures.pop_stale()

    def _end_dead_backwards(self) -> None:
        # Outside a backward on this thread, a begun one that is not closed has raised: the
        # engine ran no end callback of ours after it (the sample is dropped).
        for session in self._sessions:
            if session.bwd_started and not session.closed:
                session.abandon()


class ForwardFrame(tuple):  # type: ignore[type-arg]
    """The root pre-hook's `(args, kwargs)` on a sampled step or a structure pass: the same
    two objects, handed back to `Module._call_impl`, which keeps them in a local of the
    forward's frame until that frame is gone. A forward that a `KeyboardInterrupt` (or another
    `BaseException`) cut short skipped our exit hook; its frame goes when the exception does
    (at the end of the `except` block that caught it, unless something keeps the traceback),
    and with it this object, whose finaliser then ends the windows the forward left open
    (`recover_interrupted_captures`). After a forward that returned there is nothing to end:
    one check of the collector's holds."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            if gc_pause.holding():
                recover_interrupted_captures()
        except Exception:  # (a finaliser must not raise; at interpreter exit globals are gone)
            return


def recover_interrupted_captures(
    entering: RootHooks | None = None, interrupted: bool = False
) -> None:
    """End every window of ours that an exception left open (`RootHooks.recover_dead_windows`)
    in every attached capture; then, where no forward of ours is still running, release the
    collector. `entering`: a capture whose root forward starts now (its own leftovers were
    handled on entry). Never inside a backward, except for a SIGINT (`interrupted`)."""
    if tp.in_backward() and not interrupted:
        return
    live = False
    for capture in _registry.attached_captures():
        if entering is not None and capture is entering:
            entering._end_dead_backwards()
            continue
        try:
            capture.recover_dead_windows(interrupted)
        except Exception as error:  # never break the user's code: that capture warns once
            capture.warn_once("<recovery after an interrupted step>", error)
        live = live or bool(capture._root_depth)
    if not live:
        gc_pause.release_all()


def _recover_on_sigint() -> None:
    recover_interrupted_captures(interrupted=True)


interrupt_guard.register(_recover_on_sigint)
