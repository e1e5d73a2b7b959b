"""When a structure pass is due for one watched model, and which forwards one may run on.

The first eligible forward takes a pass; after it, a timed step whose call sequence no graph
has asks for another (`check`), up to `MAX_STRUCTURES` sequences and `MAX_PASSES` passes that
failed or learnt nothing new. A sampled step derives its own graph where no pass may give it
(`derive_from_sample`), and a pass later refines that graph. No eager pass runs on a model
with compiled code (its graph is traced on fake tensors instead, `fake_structure`) or, in
eval, on one with an inference fast path. Where the graph stays short of the model's, the
schedule says so once (`warn`). `structure_driver.StructureDriver` holds one and runs the
passes it asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from wandb_modprof._warn import warn_safely
from wandb_modprof.capture.inert_hook import under_compile
from wandb_modprof.capture.model.compiled import compiled_in_place, is_compiled_wrapper
from wandb_modprof.capture.model.wrappers import inner_model
from wandb_modprof.capture.structure.kept_counts import KeptCounts
from wandb_modprof.capture.structure.known_calls import KnownCalls, twin_class
from wandb_modprof.capture.structure.pass_modes import structure_pass_active
from wandb_modprof.capture.structure.routed_graph import RoutedGraph
from wandb_modprof.capture.structure.step_dataflow import step_calls
from wandb_modprof.records.calls import Structure, call_signature

if TYPE_CHECKING:
    from wandb_modprof.capture.forward.invocation import Invocation
    from wandb_modprof.capture.memory.static_memory import ModelIndex

MAX_STRUCTURES = 8  # distinct call sequences captured; beyond that the graph stops growing
MAX_PASSES = 2 * MAX_STRUCTURES  # structure passes that failed or learnt nothing new
# Sampled steps of a model that varies derive their graph (`derive_from_sample`) until this
# many in a row added nothing to the routed graph; a step that calls something new resumes it.
IDLE_DERIVATIONS = 3
# Modules with an inference fast path that `has_torch_function` (true under our dataflow mode)
# turns off: a structure pass on their eval forward would change its numerics.
_FASTPATH_TYPES = (
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
    nn.TransformerEncoder,
)


class TimedStep(Protocol):
    """What `check` reads of a timed step (a `capture.session.StepSession`, which sits above
    this sub-package: named by what is read, not imported)."""

    invocations: list[Invocation]


class PassSchedule:
    """Whether a structure pass is `due`, the passes counted against the caps, and the graphs
    derived from timed steps that a pass should refine."""

    def __init__(
        self,
        enabled: bool,
        eligible: Callable[[nn.Module], bool],
        index: Callable[[], ModelIndex],
        sink: KeptCounts,
        known: dict[bool, KnownCalls],
    ) -> None:
        self.enabled = enabled
        self.eligible = eligible
        self.sink = sink
        self.known = known
        self.due = enabled
        self.passes = 0  # started, of every kind
        # passes counted against `MAX_PASSES`: all but the partial ones that learnt something
        self.spent = 0
        self._index = index  # the model's modules (`HookOwner.index`)
        self._derived: set[str] = set()  # signatures whose graph no pass has refined yet
        self.derive_failed = False  # a derivation raised: leave the graph to the passes
        # A timed step called a sequence no graph had (routing, dynamic control flow): from
        # then on sampled steps derive their own graph, so calls that appear only on sampled
        # steps (an expert the router picked there) get their edges.
        self.varies = False
        self._warned = False
        self._fastpath: tuple[ModelIndex, bool] | None = None
        self._compiled: tuple[ModelIndex, bool] | None = None
        # once it varies: its sampled steps' graphs grown into one (`routed_graph`)
        self.routed = RoutedGraph(self.list_members)
        self._lists: tuple[ModelIndex, dict[str, list[tuple[str, str]]]] | None = None
        self.idle = 0  # derived graphs in a row that added nothing to it
        self._twins: dict[str, str | None] = {}  # call key -> its `twin_class` (once: ~50 us)

    def compiled(self) -> bool:
        """The model has compiled regions (their boundaries are among the hooked modules):
        its graph comes from `before_step`, never from an eager pass or a timed step."""
        if under_compile():
            return True  # a torch.compile wrapper around the watched model: one region
        index = self._index()
        if self._compiled is None or self._compiled[0] is not index:
            found = any(
                is_compiled_wrapper(m) or compiled_in_place(m)
                for _, module in index.modules.values()
                for m in (module, inner_model(module))  # DDP(torch.compile(model))
                if m is not None
            )
            self._compiled = (index, found)
        return self._compiled[1]

    def can_start(self, module: nn.Module) -> bool:
        if not self.eligible(module) or self.compiled():
            return False  # (compiled code: `before_step` draws the graph)
        if torch.compiler.is_compiling():
            # The root's hooks run inside compiled code (`model.compile()`): no modes there.
            self.due = False
            self.warn("the model runs inside torch.compile; it has no structure pass")
            return False
        if structure_pass_active():
            return False  # another model's pass is running: ours on a later step
        return module.training or not self._has_fastpath_modules()

    def _has_fastpath_modules(self) -> bool:
        index = self._index()
        if self._fastpath is None or self._fastpath[0] is not index:
            found = any(isinstance(m, _FASTPATH_TYPES) for _, m in index.modules.values())
            self._fastpath = (index, found)
        return self._fastpath[1]

    def pass_taken(self) -> None:
        """A pass (eager or on fake tensors) starts now: no longer due, and counted."""
        self.due = False
        self.passes += 1
        self.spent += 1

    def pass_partial(self, progress: bool) -> None:
        """A pass ended short of its forward's graph (`progress`: it learnt new calls, or
        calls now known to vary): the next one is due at once, while passes are left."""
        if progress:
            self.spent -= 1  # progress (new calls, or calls now known to vary): not counted
        self.due = self.spent < MAX_PASSES

    def room_for(self, signature: str) -> bool:
        """A pass's graph of this sequence may be kept: it replaces one kept, or there is
        room for another under `MAX_STRUCTURES`."""
        return self.sink.has_structure(signature) or self.sink.num_structures() < MAX_STRUCTURES

    def refined(self, signature: str) -> None:
        """A pass drew the graph of this sequence: a graph derived of it is replaced."""
        self._derived.discard(signature)

    def derive_from_sample(self) -> bool:
        """A sampled step is about to start and no graph was captured yet (not even a failed
        pass's): that step derives the graph from its own forward instead of the step being
        given to a structure pass. No modes run, so its numerics and times are untouched.

        Also once the model's call sequence was seen to vary (`varies`), while graphs may still
        be added and no pass is due (a due pass takes the step where a pass may run, as
        before): a structure pass runs on a step the sampler did not pick and, with routing,
        sees other calls than the sampled steps (on a 4-step MoE, 12 module nodes drawn
        without edges). Deriving costs only the sampled steps of models that vary; their
        graphs grow one graph (`routed_graph`), so there is no cap on them, and it stops after
        `IDLE_DERIVATIONS` graphs in a row that added nothing (a sample that calls something
        new starts it again: `check`)."""
        if not self.enabled or self.derive_failed or self.compiled():
            return False  # (a compiled model: its compiled regions' insides would be missing)
        if self.sink.num_structures() and not (
            self.varies and not self.due and self.idle < IDLE_DERIVATIONS
        ):
            return False
        return not torch.compiler.is_compiling() and not structure_pass_active()

    def add_derived(self, structure: Structure) -> None:
        """The graph of a timed step (no FLOPs): kept until a structure pass of the same call
        sequence replaces it. That pass is asked for on a later eligible step. Once the
        model varies, the graph grows the routed graph instead, and asks for no pass (`check`
        asks for one where a call's counts are unknown)."""
        if self.varies:
            grown = self.routed.absorb(structure, self.sink.held[structure.training])
            self.idle = 0 if grown is not None else self.idle + 1
            if grown is not None:
                self.sink.add_structure(grown)
            return
        if self.sink.has_structure(structure.signature):
            return
        self.sink.add_structure(structure)
        self._derived.add(structure.signature)
        if self.spent < MAX_PASSES:
            self.due = True

    def rearm(self) -> None:
        """After a failed pass: the next timed sample finds its call sequence unknown and asks
        for another pass (`check`), so failing passes alternate with samples and stop after
        `MAX_PASSES`."""
        if self.spent >= MAX_PASSES:
            self.warn(f"{MAX_PASSES} structure passes failed or were cut short")

    def check(self, session: TimedStep, training: bool) -> None:
        """A timed step whose call sequence was never captured asks for a structure pass,
        unless a pass already counted each of its calls (`covered`): a router that picked
        other experts, or sent them other numbers of tokens, then needs none."""
        if not self.enabled or self.compiled():
            return  # (a compiled model's sample has its regions' boundaries only)
        invocations = session.invocations
        signature = call_signature(inv.key for inv in invocations)
        known = self.sink.has_structure(signature)
        covered = False
        if not known:
            self.varies = True
            # the calls whose children changed are followed by the next pass (`known_calls`)
            keys = [inv.key for inv in invocations]
            parents = [inv.parent for inv in invocations]
            for table in self.known.values():  # (the session does not say which mode ran)
                table.mark_changed(keys, parents)
            covered = self.covered(invocations, training)  # (before the graph is filled)
            # calls no graph holds yet are nodes of the routed graph from this sample on
            held = self.sink.held[training]
            room = self.sink.num_structures() < MAX_STRUCTURES and self.spent < MAX_PASSES
            # (a pass about to be asked for gives them their graph, edges and all)
            if (covered or not room) and any(key not in held for key in keys):
                bare = Structure(signature, training, step_calls(invocations), ())
                grown = self.routed.absorb(bare, held, bare=True)
                if grown is not None:
                    self.idle = 0  # (the next sampled steps derive: their edges)
                    self.sink.add_structure(grown)
            if self.known[training].fresh:
                self.sink.refresh()  # (calls that took a twin's counts: graphs filled again)
            if covered:
                return
        if self.due or (known and signature not in self._derived):
            return
        if known:  # a graph derived from a timed step (this one or earlier): a pass refines it
            if self.spent < MAX_PASSES:
                self.due = True
            return  # else the derived graph stays (the warning was given when passes ran out)
        if self.sink.num_structures() < MAX_STRUCTURES and self.spent < MAX_PASSES:
            self.due = True
        else:
            self.warn(f"the model called more than {MAX_STRUCTURES} different sequences of modules")

    def list_members(self, name: str) -> list[tuple[str, str]]:
        """The model's modules in module list `name`, with their types (`routed_graph`)."""
        index = self._index()
        if self._lists is None or self._lists[0] is not index:
            lists: dict[str, list[tuple[str, str]]] = {}
            for member, module in index.modules.values():
                owner, _, last = member.rpartition(".")
                if last.isdigit():
                    lists.setdefault(owner, []).append((member, type(module).__name__))
            self._lists = (index, lists)
        return self._lists[1].get(name, [])

    def covered(self, invocations: list[Invocation], training: bool) -> bool:
        """Every call's own counts are known from a pass (`KnownCalls.covers`: the same call,
        or an identical list member, on inputs of the same shapes or of other rows). Each
        call no pass met gets its twin here (`KnownCalls.alias`), which `kept_counts` reads."""
        table = self.known[training]
        if not table.calls:
            return False
        modules = None  # (the index costs a walk of the model: only where a twin is new)
        covered = True
        twins = self._twins
        for inv in invocations:
            twin = None
            if inv.key not in table.calls and inv.key not in table.alias:
                if inv.key in twins:
                    twin = twins[inv.key]
                else:
                    modules = self._index().modules if modules is None else modules
                    entry = modules.get(inv.module_id)
                    twin = twins[inv.key] = None if entry is None else twin_class(inv.key, entry[1])
            covered = table.covers(inv.key, inv.shapes, twin) and covered
        return covered

    def warn(self, why: str) -> None:
        if self._warned:
            return
        self._warned = True
        warn_safely(
            f"wandb_modprof: {why}; the graph shows the structures captured so far (module "
            "statistics still cover every module, drawn without edges or FLOPs where no pass saw "
            "them; `Profile.flops_unknown` counts the calls without FLOPs).",
            RuntimeWarning,
            stacklevel=5,
        )
