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

`RootHooks` owns what only the root's calls change: their nesting (`depth`), the first steps'
countdown, which steps to sample and its own seconds (`root_hook_s`). It drives the
submodules' hooks (`submodule_hooks.SubmoduleHooks`), the sessions
(`session_hooks.SessionHooks`) and the structure driver through their methods.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from torch import nn

from wandb_modprof._warn import warn_at_user
from wandb_modprof.capture.forward.callstack import call_depth
from wandb_modprof.capture.memory.static_memory import ROOT_NAME
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.session_hooks import SessionHooks
from wandb_modprof.capture.step import gc_pause, interrupt_guard
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.structure.pass_modes import structure_pass_active
from wandb_modprof.capture.structure.structure_driver import StructureDriver
from wandb_modprof.capture.submodule_hooks import SubmoduleHooks


def _nothing() -> None:
    return None


class RootHooks:
    """The root's forward pre-hook (`pre`) and forward hook (`post`) of a capture."""

    def __init__(
        self,
        model: nn.Module,
        modules: SubmoduleHooks,
        sessions: SessionHooks,
        structures: StructureDriver,
        should_sample: Callable[[nn.Module], int | None],
        cold: bool,
    ) -> None:
        self.model = model
        self.modules = modules
        self.sessions = sessions
        self.structures = structures
        self.should_sample = should_sample  # the step to sample, or None
        # hands a finished sample to `sessions.after_sample` (`delivery`), once one is set
        self.deliver: Callable[[], None] = _nothing
        self.depth = 0  # nesting of root calls (a root may call itself)
        # The first step's sample is the model's first step in this process when nothing says
        # the model ran before (`registry.cold_model`).
        self._cold = cold
        self._cold_step = False  # the step now starting is that first step
        self._first_steps = 2  # counts down over the first two steps, then never read again
        # steps that were to be measured but ran under a torch.func transform: not measured
        self.transformed_steps = 0
        # the root hooks' own seconds so far, read with the clock inside them: the floor of
        # `watch` that every step pays (`api.overhead`)
        self.root_hook_s = 0.0

    def pre(self, module: nn.Module, args: Any, kwargs: Any) -> ForwardFrame | None:
        start = perf_counter()
        try:
            if self._enter(module, args, kwargs):
                return ForwardFrame((args, kwargs))  # a window opened: see `ForwardFrame`
        except Exception as error:
            self.sessions.internal_error(ROOT_NAME, error)
        finally:
            self.root_hook_s += perf_counter() - start
        return None

    def _enter(self, module: nn.Module, args: Any, kwargs: Any) -> bool:  # noqa: PLR0911  (an exit per kind of step)
        """What this forward is (the module's docstring); True where it opened a window of
        ours (a sampled forward or a structure pass)."""
        # The unsampled path: a counter, a few attribute reads and one C call.
        sessions = self.sessions
        if tp.in_backward():
            sessions.pre(module, args, kwargs)  # a checkpoint recompute of the root
            return False
        if self.depth:
            if call_depth(module) > 1:  # the root calls itself: one step, not several
                self.depth += 1
                if sessions.forward is not None or self.structures.current is not None:
                    sessions.pre(module, args, kwargs)
                return False
            self._recover_interrupted()
        self.depth = 1
        if sessions.phase_watch.open is not None:  # a sample's `between` ends here
            sessions.phase_watch.at_forward()
        self.modules.forward_began()
        if self._first_steps:  # (later steps: one attribute read)
            self._first_steps -= 1
            self._cold_step = self._cold and self._first_steps == 1
            _registry.stepped(self.model)
        if gc_pause.holding():  # a window left without its end (a failed backward)
            recover_interrupted_captures(entering=self)
        if sessions.sample_due:
            self.deliver()
        if sessions.stale or sessions.pending:
            sessions.before_root()
        if self.structures.stale or self.structures.backward is not None:
            self.structures.between_steps()
        step = self.should_sample(module)
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
            if self.modules.children_hooked:
                self.modules.release_children()
            return False
        if structure_pass_active():
            return False  # another model's structure pass runs through this forward: not timed
        sessions.start(step, module, args, kwargs, derive, self._cold_step)
        return True

    def post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        start = perf_counter()
        sessions = self.sessions
        session = sessions.forward
        try:
            if tp.in_backward():
                sessions.post(module, args, kwargs, result)  # a checkpoint recompute of the root
                return
            self.depth = max(0, self.depth - 1)
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
            sessions.end_forward(session, module.training)
            self.modules.release_children()
            session.phase_stamps.forward_closed = session.clock.stamp()  # (the loss starts)
        except Exception as error:
            sessions.forward = None
            if session is not None:
                sessions.end_failed_forward(session)
            sessions.internal_error(ROOT_NAME, error)
            self.modules.release_children()
        finally:
            # the model may change between forwards; within this one (the graph check above
            # included) one walk of it sufficed
            self.modules.forward_left(self.depth > 0)
            self.root_hook_s += perf_counter() - start

    def _materialised_now(self) -> bool:
        """The forward ending now (the root's outermost call) materialised lazy modules
        (`SubmoduleHooks.materialised_now`)."""
        return self.depth == 0 and self.modules.materialised_now()

    def _exit_pass(self, module: nn.Module, result: object) -> None:
        """The root's exit during a structure pass. A pass whose forward materialised lazy
        modules is ended without keeping anything and not counted against the passes' limit:
        the next step where a pass may run runs another."""
        if not self._materialised_now():
            self.structures.exit(module, result)
            return
        self.structures.end()
        self.structures.spent -= 1
        self.structures.due = self.structures.enabled

    def _skip_transformed_step(self) -> None:
        """A sampled step (or one due for a structure pass) called under a `torch.func`
        transform (`vmap`, `grad`, ...: `model/transforms.py`): counted, neither measured nor a
        pass (one stays due); the first one warns."""
        self.transformed_steps += 1
        if self.transformed_steps == 1:
            warn_at_user(under_transform_text(type_name(self.model)), UserWarning)
        if self.modules.children_hooked:
            self.modules.release_children()

    def _recover_interrupted(self) -> None:
        """A forward ended without our root exit hook: `Module._call_impl` runs always-call
        hooks on `Exception` only, so a KeyboardInterrupt or SystemExit skips them."""
        self.depth = 0
        if self.structures.current is not None:  # (the driver's warning counts these frames)
            self.structures.end()
            self.structures.rearm()
        self.sessions.end_interrupted_forward()
        self.modules.release_children()

    def recover_dead_windows(self, interrupted: bool) -> None:
        """From outside this model's forward (another model's root entry, `profile()`,
        `watch()`, `unwatch()`), or from the SIGINT handler (`interrupted`: every window of
        this thread is about to unwind): end a root forward no longer on the stack (a
        `KeyboardInterrupt` skipped its exit hook) and a sampled backward that began but never
        reached its end callback (a node raised); pop what a stale session or pass left pushed."""
        if self.depth and (interrupted or call_depth(self.model) == 0):
            self._recover_interrupted()
        self.sessions.end_dead_backwards()
        self.sessions.pop_stale()
        # (stale passes' modes only: a pass's backward may still come after its forward)
        self.structures.pop_stale()


def under_transform_text(model_type: str) -> str:
    """The warning given once per watch or profile block when a step that was to be measured
    ran under a `torch.func` transform (`capture/model/transforms.py`)."""
    return (
        f"wandb_modprof: {model_type} was called under torch.func transforms (vmap, grad, "
        "jacrev, jvp, functionalize), e.g. a torch.func.stack_module_state ensemble or "
        "per-sample gradients; calls under these transforms are not profiled: they run on "
        "functorch's wrapper tensors, which have no storage to measure and no autograd graph of "
        "their own. Those steps are not sampled; calls of the model outside a transform "
        "(torch.func.functional_call on its own included) are profiled as usual."
    )


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
        roots: RootHooks = capture.roots
        if roots is entering:
            roots.sessions.end_dead_backwards()
            continue
        try:
            roots.recover_dead_windows(interrupted)
        except Exception as error:  # never break the user's code: that capture warns once
            capture.warn_once("<recovery after an interrupted step>", error)
        live = live or bool(roots.depth)
    if not live:
        gc_pause.release_all()


def _recover_on_sigint() -> None:
    recover_interrupted_captures(interrupted=True)


interrupt_guard.register(_recover_on_sigint)
