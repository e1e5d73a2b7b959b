"""When the structure pass runs, and what happens around it, for one watched model.

The pass (`structure_pass.StructurePass`) is one untimed forward with two torch modes pushed.
This driver runs one when it is due (`pass_schedule.PassSchedule`: the first eligible
forward; again when a timed step's call sequence is new, up to `MAX_STRUCTURES` sequences and
`MAX_PASSES` attempts): it starts the pass from the root's pre-hook, ends it at the root's exit
and hands the finished `Structure` to the sink, as every graph, through
`kept_counts.KeptCounts` (what earlier passes counted, filled in where a graph lacks it). The
capture's `submodule_hooks.SubmoduleHooks` owns the module hooks; the driver reaches them only
through the small `HookOwner` interface below.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from wandb_modprof.capture.memory.static_memory import ROOT_NAME
from wandb_modprof.capture.step import gc_pause
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.capture.structure.backward_work import BackwardWork, count_pass_backward
from wandb_modprof.capture.structure.calibration import roofline_of
from wandb_modprof.capture.structure.fake_structure import fake_structure
from wandb_modprof.capture.structure.kept_counts import KeptCounts
from wandb_modprof.capture.structure.known_calls import KnownCalls, PassRecord
from wandb_modprof.capture.structure.pass_modes import prepare, structure_pass_active
from wandb_modprof.capture.structure.pass_schedule import MAX_STRUCTURES, PassSchedule
from wandb_modprof.capture.structure.structure_pass import StructurePass

if TYPE_CHECKING:
    from wandb_modprof.capture.memory.static_memory import ModelIndex
    from wandb_modprof.records.calls import Structure

# Calls one pass follows at most (`known_calls`): a larger model's first graph takes a few
# passes, each on its own step, instead of one step many times longer than a plain one.
FOLLOW_BUDGET = 2500


class HookOwner(Protocol):
    """What the driver needs from the capture that owns the model's hooks."""

    def index(self) -> ModelIndex: ...

    def hook_children(self, index: ModelIndex) -> None: ...

    def release_children(self) -> None: ...

    def label(self, module: nn.Module, default_name: str) -> tuple[str, str]: ...


class StructureSink(Protocol):
    def add_structure(self, structure: Structure) -> None: ...

    def has_structure(self, signature: str) -> bool: ...

    def num_structures(self) -> int: ...


class StructureDriver:
    """The structure passes of one capture: due (its `schedule`, a `PassSchedule`), running
    (`current`), or stale (their modes could not be popped yet because someone else's mode is
    on top of ours)."""

    def __init__(
        self,
        owner: HookOwner,
        warn_once: Callable[[str, Exception], None],
        sink: StructureSink,
        enabled: bool,
        eligible: Callable[[nn.Module], bool],
        peaks: tuple[float | None, float | None] = (None, None),
    ) -> None:
        self.owner = owner
        self.warn_once = warn_once  # the capture's: an internal error warns once per capture
        self.known = {True: KnownCalls(), False: KnownCalls()}  # what passes learnt, per mode
        self.sink = KeptCounts(sink, self.known)  # (graphs get the counts passes kept)
        self.schedule = PassSchedule(enabled, eligible, owner.index, self.sink, self.known)
        # The schedule's methods the capture's root hooks call, bound here rather than wrapped:
        # no frame of ours between (they run on sampled steps, and a warning they give keeps
        # its stack level).
        self.can_start = self.schedule.can_start
        self.derive_from_sample = self.schedule.derive_from_sample
        self.add_derived = self.schedule.add_derived
        self.check = self.schedule.check
        self.rearm = self.schedule.rearm
        self.peaks = peaks  # `watch(peak_flops=, peak_bw=)`: None = found by `calibration`
        self.current: StructurePass | None = None
        self.stale: list[StructurePass] = []
        self.records: list[PassRecord] = []
        self._started = 0.0
        self.budget: int | None = FOLLOW_BUDGET
        self.reuse = True  # False: every pass follows every call (a benchmark's baseline)
        self.backward: BackwardWork | None = None  # the last pass's backward, being counted
        if enabled:
            prepare()

    # ---- the schedule's state, as the capture reads it (`root_hooks`, `submodule_hooks`) and,
    # on a fork or a voided pass, writes it (`step/registry`, `submodule_hooks`): a property
    # read per step costs about 40 ns, nothing per module call
    @property
    def due(self) -> bool:
        return self.schedule.due

    @due.setter
    def due(self, value: bool) -> None:
        self.schedule.due = value

    @property
    def enabled(self) -> bool:
        return self.schedule.enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self.schedule.enabled = value

    @property
    def spent(self) -> int:
        return self.schedule.spent

    @spent.setter
    def spent(self, value: int) -> None:
        self.schedule.spent = value

    @property
    def derive_failed(self) -> bool:
        return self.schedule.derive_failed

    @derive_failed.setter
    def derive_failed(self, value: bool) -> None:
        self.schedule.derive_failed = value

    @property
    def passes(self) -> int:
        """Passes started, of every kind (`api.step_counter`)."""
        return self.schedule.passes

    def totals(self) -> dict[str, Any]:
        """The passes that ran, as `records.snapshot.Overhead` reports them."""
        return {
            "passes": len(self.records),
            "partial_passes": sum(r.followed < r.calls for r in self.records),
            "pass_s": sum(r.seconds for r in self.records),
        }

    def pop_stale(self) -> None:
        self.stale = [s for s in self.stale if not s.pop_modes()]

    def between_steps(self) -> None:
        """At a root forward (and `detach`): pop stale passes' modes, and stop counting the
        last pass's backward (`close_backward`)."""
        self.pop_stale()
        self.close_backward()

    def before_step(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """At a root forward of a model with compiled code, while a graph is due: draw it from
        the eager modules on fake tensors (`fake_structure`), beside the step, which then runs
        compiled as it would have (sampled or not): its numerics stay the compiled ones."""
        schedule = self.schedule
        if not (schedule.due and schedule.enabled) or not schedule.eligible(module):
            return
        if not schedule.compiled() or torch.compiler.is_compiling() or structure_pass_active():
            return
        schedule.pass_taken()
        structure, error = fake_structure(module, args, kwargs)
        if structure is None:
            # Not retried: the same forward on fake tensors fails the same way.
            schedule.warn(f"the graph of the compiled model could not be traced ({error!r})")
            return
        schedule.refined(structure.signature)
        self.sink.add_structure(self._with_roofline(structure, module))

    def _with_roofline(self, structure: Structure, module: nn.Module) -> Structure:
        """A pass's graph with the machine's roofline (`calibration`: measured once per
        process; a failure leaves it out, with the one internal-error warning)."""
        try:
            found = roofline_of(module, *self.peaks)
        except Exception as error:
            self.warn_once("<roofline calibration>", error)
            return structure
        return dataclasses.replace(structure, roofline=found)

    def start(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self.schedule.pass_taken()
        # The collector held off through the pass's forward, as through a sampled one: the
        # pass makes many small objects (frames, sets), and the collections they set off
        # took ~30 % of a 10,000-call pass (`gc_pause`).
        gc_pause.hold(id(self))
        self.owner.hook_children(self.owner.index())
        _disturb_other_timed_forwards(self.owner)
        known = self.known[module.training] if self.reuse else None
        structure = StructurePass(module, training=module.training, known=known, budget=self.budget)
        self._started = time.perf_counter()
        self.current = structure
        try:
            structure.push_modes()
            name, module_type = self.owner.label(module, ROOT_NAME)
            structure.enter(module, name, module_type, args, kwargs)
        except BaseException:
            self.end()  # pops what was pushed, takes the child hooks off again
            self.schedule.rearm()
            raise

    def exit(self, module: nn.Module, result: Any) -> None:
        """The root's exit hook during a pass."""
        structure = self.current
        assert structure is not None
        # (held on through what the pass's end makes: its calls, graph, what it learnt)
        gc_pause.hold(id(structure))
        try:
            self._exit(structure, module, result)
            self.sink.refresh()  # what the pass learnt fills graphs that lacked it
        finally:
            gc_pause.release(id(structure))

    def _exit(self, structure: StructurePass, module: nn.Module, result: Any) -> None:
        raised = sys.exc_info()[1]
        if raised is not None and raised is not structure.exception_at_start:
            # The forward raised (always-call hooks run on exceptions): a partial graph is
            # not kept; a later step tries again.
            self.end()
            self.schedule.rearm()
            return
        structure.exit(module, result)
        if not structure.forward_done and not structure.failed:
            return  # the root was re-entered; its outer call is still open
        self.end()
        if structure.failed:
            self.schedule.rearm()
            error = structure.error or RuntimeError("forward hooks fired out of order")
            self.warn_once("<structure pass>", error)
            return
        seconds = time.perf_counter() - self._started
        calls = len(structure.followed_calls())  # (once a pass: the calls met)
        self.records.append(PassRecord(structure.followed, calls, structure.complete(), seconds))
        known = self.known[structure.training]
        before = len(known.calls)
        for key, call in structure.learnt():
            known.learn(key, call)
        known.dynamic.update(structure.changed)
        if not structure.complete():
            # Known calls that called others than before, or new calls beyond the budget:
            # the next pass follows them (it is due at once: it starts where this one ended).
            self.schedule.pass_partial(len(known.calls) > before or bool(structure.changed))
            self._count_backward(structure, None, result)
            return
        finished = structure.finish()
        if not self.schedule.room_for(finished.signature):
            # A pass asked for to refine a derived graph may meet yet another new sequence
            # (routing changes every step) after that graph filled the last place: not kept.
            text = f"the model called more than {MAX_STRUCTURES} different sequences of modules"
            self.schedule.warn(text)
            self._count_backward(structure, None, result)
            return
        self.schedule.refined(finished.signature)
        stored = self._with_roofline(finished, module)
        self.sink.add_structure(stored)
        self._count_backward(structure, stored, result)

    def _count_backward(
        self, structure: StructurePass, stored: Structure | None, result: Any
    ) -> None:
        """Count the backward of the pass's step where one comes (`backward_work`): the sink
        then gets `stored` again, with each call's backward bytes and ops (the calls the pass
        did not follow: from the pass that did); the calls it followed are learnt."""
        self.close_backward()
        self.backward = count_pass_backward(
            structure, stored, result, self.sink.add_structure, self.warn_once
        )

    def close_backward(self) -> None:
        """A backward that has not come by the next forward is not counted, and no hook of
        ours stays on a node a later, timed, backward may run (`BackwardWork.close`)."""
        work, self.backward = self.backward, None
        if work is not None:
            work.close()
            self.sink.refresh()  # (the backward counts it learnt)

    def end(self) -> None:
        structure, self.current = self.current, None
        if structure is not None and not structure.pop_modes():
            self.stale.append(structure)  # someone's mode is on top of ours
        self.owner.release_children()
        gc_pause.release(id(self))


def _disturb_other_timed_forwards(owner: object) -> None:
    """A pass about to run inside another model's timed forward spoils that sample (`owner`:
    this capture's hooks, `Capture.modules`)."""
    for capture in _registry.attached_captures():
        running = capture.timed_forward
        if capture.modules is not owner and running is not None:
            running.disturbed = True
