"""The forward of a module in a checkpoint plan: `CheckpointedForward`, set as the module's
instance attribute `forward` by `apply_checkpoint_plan`.

>>> block.forward = CheckpointedForward(block, "blocks.0", None)    # doctest: +SKIP
>>> block(x).sum().backward()          # checkpointed: recomputed in the backward

It is an object that holds its module, not a closure over the module's bound forward, so a
copy of the model is planned in the same way and computes from its own weights: `deepcopy`
(an EMA, `torch.optim.swa_utils.AveragedModel`) copies it with the module, whose copy it then
calls. Pickled (`pickle`, `torch.save(model)`), it is written as the forward it wraps: the file
holds no plan and loads where wandb_modprof is not installed.

A recompute in the backward runs the forward as the first run found its state:

* **buffers the forward writes** (running statistics, the power-iteration vectors `_u`, `_v` of
  spectral norm, a counter) are put back for the recompute as they were before that call's
  forward, and after it as the backward found them. Which buffers a forward writes is learnt
  at its first call (every buffer of the subtree is copied, then compared: its identity, its
  version counter and its values) and, later, from identities and version counters; a module
  keeping running statistics (`track_running_stats`) counts as writing them while training.
* **inputs the forward modifies in place** (a block that opens with `ReLU(inplace=True)`):
  `checkpoint` keeps a copy of them as the call found them, and the first run still modifies
  the caller's tensors. Also learnt at the first call, which keeps copies of all its inputs.

Known limitations: a tensor inside a list or dict argument is neither copied nor checked (the
checkpoint keeps a reference, as torch does); a module that first modifies its input in place
in a later call than its first gets torch's "modified by an inplace operation" error from that
step's backward, and keeps copies from then on; two tensor arguments that are views of one
storage reach the recompute as separate copies.
"""

from __future__ import annotations

import contextlib
import copy
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any, SupportsIndex

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from wandb_modprof._warn import warn_at_user

# A buffer by its owner and its name there (`module._buffers[name]`).
BufferKey = tuple[nn.Module, str]


class CheckpointedForward:
    """`module.forward` of a planned module: the forward it wraps (`own`, the instance
    attribute set before the plan; None: the class's, bound to `module` at each call) run under
    `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` when grad is enabled."""

    def __init__(self, module: nn.Module, name: str, own: Callable[..., Any] | None) -> None:
        self.module = module
        self.name = name
        self.own = own
        self.warned = False  # about a key/value cache: once
        self.probed = False  # a call had its inputs and buffers watched
        self.copies_inputs = False  # the forward modifies an input in place
        self.written: set[BufferKey] = set()  # buffers its forward writes

    def wrapped_forward(self) -> Callable[..., Any]:
        """The forward this wraps, bound to the module it belongs to now."""
        if self.own is not None:
            return self.own
        return _class_forward(self.module)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        # `inspect.signature(module.forward)` follows it: the forward's own parameters
        return self.wrapped_forward()

    def __repr__(self) -> str:
        return f"<checkpointed forward of {self.name or type(self.module).__name__}>"

    def __deepcopy__(self, memo: dict[int, Any]) -> CheckpointedForward:
        # Copied with its module: through `memo`, `module` (and a forward bound to it) become
        # the copy's, so the copy computes from its own weights.
        new = CheckpointedForward.__new__(CheckpointedForward)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            setattr(new, key, copy.deepcopy(value, memo))
        return new

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        # Pickled as the forward it wraps, with builtins only: the file holds no plan, needs no
        # wandb_modprof to load, and the loaded module runs its plain forward. (A bound method
        # pickles the same way: `getattr(module, "forward")`, which at load time, before the
        # module's own attributes are set, finds the class's forward.)
        if self.own is None:
            return (getattr, (self.module, "forward"))
        return (operator.getitem, ((self.own,), 0))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward = self.wrapped_forward()
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        cache = kv_cache(args, kwargs)
        if cache is not None:  # a recompute would extend the cache a second time: run plainly
            if not self.warned:
                self.warned = True
                warn_at_user(
                    f"wandb_modprof: apply_checkpoint_plan: {self.name} is not "
                    f"checkpointed while its call gets a key/value cache ({cache}): a "
                    "recompute would append to the cache again and break the backward. Train "
                    "with model.config.use_cache = False (as transformers' own gradient "
                    "checkpointing does) for the plan to apply.",
                    RuntimeWarning,
                )
            return forward(*args, **kwargs)
        # Tensors given by keyword go to `checkpoint` by position: it keeps positional tensors
        # as saved tensors (counted in `act_bytes`, released after backward), keyword ones only
        # in a closure that saved-tensor hooks never see (the kept input would go uncounted).
        names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        given = (*args, *(kwargs.pop(k) for k in names))
        call = _Call(self, forward, len(args), names, given)
        return checkpoint(call.run, *call.kept(), use_reentrant=False, **kwargs)


class _Call:
    """One checkpointed call: `checkpoint` runs `run` in the forward, then again for each
    recompute in the backward."""

    def __init__(
        self,
        owner: CheckpointedForward,
        forward: Callable[..., Any],
        positional: int,
        names: list[str],
        given: tuple[Any, ...],
    ) -> None:
        self.owner = owner
        self.forward = forward
        self.positional = positional
        self.names = names
        self.given: tuple[Any, ...] | None = given  # the caller's arguments: the first run's
        self.probe = not owner.probed
        self.runs = 0
        self.found: dict[BufferKey, torch.Tensor] = {}  # written buffers before the forward
        self.changed: set[BufferKey] = set()  # buffers the forward changed

    def kept(self) -> tuple[Any, ...]:
        """What `checkpoint` keeps for the recompute: the arguments, or copies of their tensors
        where the forward may modify them in place (copies keep `requires_grad` and the graph,
        so the recompute saves what the forward saved)."""
        assert self.given is not None
        if not (self.probe or self.owner.copies_inputs):
            return self.given
        copies: dict[int, torch.Tensor] = {}  # one copy per tensor given twice
        for value in self.given:
            if isinstance(value, torch.Tensor) and id(value) not in copies:
                copies[id(value)] = value.clone()
        return tuple(copies.get(id(v), v) if isinstance(v, torch.Tensor) else v for v in self.given)

    def run(self, *flat: Any, **rest: Any) -> Any:
        self.runs += 1
        if self.runs == 1:
            given, self.given = self.given, None  # not held until the backward
            assert given is not None
            return self._first(given, rest)
        with self._state_as_found():
            return self._call(flat, rest)

    def _call(self, flat: tuple[Any, ...], rest: Mapping[str, Any]) -> Any:
        n = self.positional
        return self.forward(*flat[:n], **rest, **dict(zip(self.names, flat[n:], strict=True)))

    def _first(self, given: tuple[Any, ...], rest: Mapping[str, Any]) -> Any:
        owner = self.owner
        inputs = [(t, _version(t)) for t in given if isinstance(t, torch.Tensor)]
        buffers = owned_buffers(owner.module)
        watched = [
            (key, t) for key, t in buffers if self.probe or key in owner.written or _stats(key)
        ]
        with torch.no_grad():
            self.found = {key: t.clone() for key, t in watched}
        before = [(key, t, _version(t)) for key, t in buffers]
        out = self._call(given, rest)
        if any(_version(t) != v for t, v in inputs):
            owner.copies_inputs = True
        for (module, name), t, version in before:
            now = module._buffers.get(name)
            if now is t and _version(t) == version and not self._differs((module, name), t):
                continue
            self._wrote(module, name)
        if self.probe:  # buffers the forward registered or gave a shape (a lazy module's)
            seen = {key for key, _, _ in before}
            for key, _ in owned_buffers(owner.module):
                if key not in seen:
                    self._wrote(*key)
        self.found = {k: v for k, v in self.found.items() if k in owner.written or _stats(k)}
        owner.probed = True
        return out

    def _wrote(self, module: nn.Module, name: str) -> None:
        self.changed.add((module, name))
        self.owner.written.update((module, n) for n in module._buffers)  # all of the module's

    def _differs(self, key: BufferKey, now: torch.Tensor) -> bool:
        """At the first call: values changed where neither identity nor version says so (the
        CPU kernel of batch norm updates running statistics without a version bump, and so
        does a write through `.data`). Plain tensors only: a fake tensor has no values."""
        found = self.found.get(key)
        if not self.probe or found is None or type(now) is not torch.Tensor:
            return False
        return now.device.type != "meta" and not torch.equal(found, now)

    @contextlib.contextmanager
    def _state_as_found(self) -> Iterator[None]:
        """The written buffers as this call's forward found them, for the recompute; on leaving
        (also when the recompute stops early: non-reentrant checkpointing raises once it has
        what backward needs) as the backward found them."""
        keys = set(self.found) | self.changed
        now: list[tuple[BufferKey, torch.Tensor | None, torch.Tensor | None]] = []
        with torch.no_grad():
            for module, name in keys:
                t = module._buffers.get(name)
                now.append(((module, name), t, None if t is None else t.clone()))
            for (module, name), value in self.found.items():
                t = module._buffers.get(name)
                if t is not None and _same_layout(t, value):
                    t.copy_(value)
                else:
                    module._buffers[name] = value.clone()
        try:
            yield
        finally:
            with torch.no_grad():
                for (module, name), buffer, kept in now:
                    module._buffers[name] = buffer
                    if buffer is not None and kept is not None:
                        buffer.copy_(kept)


def _class_forward(module: nn.Module) -> Callable[..., Any]:
    """`module.forward` as its class defines it, the instance attribute (ours) looked past."""
    kind = type(module)
    for klass in kind.__mro__:
        if "forward" in klass.__dict__:
            found = klass.__dict__["forward"]
            bind = getattr(found, "__get__", None)  # a function binds; a staticmethod unwraps
            bound: Callable[..., Any] = found if bind is None else bind(module, kind)
            return bound
    raise AssertionError(f"{kind.__name__} has no forward")  # nn.Module defines one


def owned_buffers(module: nn.Module) -> list[tuple[BufferKey, torch.Tensor]]:
    """Every buffer of `module`'s subtree, by owner and name (a shared module once), except a
    lazy module's before its first forward gives it a shape (it has no values to copy)."""
    return [
        ((m, name), t)
        for m in module.modules()
        for name, t in m._buffers.items()
        if t is not None and not isinstance(t, nn.parameter.UninitializedBuffer)
    ]


def _stats(key: BufferKey) -> bool:
    """A buffer of a module that updates running statistics now (BatchNorm, InstanceNorm with
    `track_running_stats`, training): written at every forward, whatever the first call saw."""
    module = key[0]
    return module.training and bool(getattr(module, "track_running_stats", False))


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _version(t: torch.Tensor) -> int:
    # inference tensors have no version counter (and cannot be modified outside inference)
    return -1 if t.is_inference() else t._version


def kv_cache(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The type of a key/value cache among a call's arguments (a `transformers` Cache: it has
    `update` and `get_seq_length`), None if there is none."""
    for value in (*args, *kwargs.values()):
        kind = type(value)
        if hasattr(kind, "update") and hasattr(kind, "get_seq_length"):
            return kind.__name__
    return None
