"""Bytes each module invocation keeps alive for backward, via saved-tensor hooks.

`pack` runs whenever autograd saves a tensor during the sampled forward and charges its storage
to the innermost running invocation (first saver wins, so a storage counts once). Counted at the
end of the forward are the storages still saved then: a graph the forward itself discarded
(truncated BPTT) frees its tensors, and a freed address reused by a later tensor is a new
storage, not a duplicate. Liveness is tracked with weak references to the packed objects.

On CPU the same bookkeeping gives the step's memory curve (`capture/memory_curve.py`): with
`curve=True` each newly saved storage appends `(perf_counter_ns, +nbytes)` to `curve`, and the
death of its last packed object (autograd releases a node's saved tensors once the node has
run, or the whole graph when it is freed) appends `(perf_counter_ns, -nbytes)`. The weak
reference's callback does that: no tensor is held and no device is touched; a few ints per
saved storage.

Two deliberate choices keep training unchanged:
* `pack` stores `tensor.detach()`, not the tensor: packing the tensor itself makes
  output -> grad_fn -> saved output a reference cycle that Python cannot collect, so a forward
  without backward would leak its whole graph (checked in tests/end_to_end/test_no_leaks.py).
* autograd skips its in-place modification check for tensors packed by hooks; `unpack`
  performs the same version-counter check, so `x.add_(1)` after `sigmoid(x)` still raises.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import torch

from wandb_modprof.capture.memory.storage import StorageKey, storages
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.clock import Clock


class _Packed:
    __slots__ = ("__weakref__", "tensor", "version")

    def __init__(self, tensor: torch.Tensor, version: int | None) -> None:
        self.tensor = tensor
        self.version = version


def _version(tensor: torch.Tensor) -> int | None:
    try:
        return int(tensor._version)
    except RuntimeError:  # inference tensors have no version counter
        return None


def unpack(packed: _Packed) -> torch.Tensor:
    tensor = packed.tensor
    if packed.version is not None and tensor._version != packed.version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{tensor.type()} {list(tensor.shape)}] is at version "
            f"{tensor._version}; expected version {packed.version} instead. (Reported by "
            "wandb_modprof's saved-tensor hook, which performs autograd's usual check.)"
        )
    return tensor


def ledgered_unpack(clock: Clock) -> Callable[[_Packed], torch.Tensor]:
    """`unpack` that keeps its time out of the backward node it runs inside: the truth, a step
    without our hooks, unpacks in C++. Holds only the clock (the graph keeps the hook as long
    as it lives: not the session)."""

    def unpack_ledgered(packed: _Packed) -> torch.Tensor:
        clock.own_enter()
        try:
            return unpack(packed)
        finally:
            clock.own_leave_pack()

    return unpack_ledgered


class _Saved:
    """One saved storage: who saved it first, its bytes, and the weak references to the packed
    objects holding it. Also the references' callback (one object per storage, not a
    `functools.partial` per reference: fewer objects for the garbage collector, `gc_pause`).
    Its call runs inside autograd when a packed object dies: it must not raise."""

    __slots__ = ("curve", "live", "nbytes", "owner", "refs", "released")

    def __init__(self, owner: int, nbytes: int, curve: list[int] | None) -> None:
        self.owner = owner
        self.nbytes = nbytes
        self.curve = curve
        self.refs: list[weakref.ref[_Packed]] = []  # alive, so that their callbacks run
        self.released = False  # no packed object holds it any more (or the step is over)
        # Packed objects still holding the storage (a count: MoE layers save one tensor from
        # every expert, and rescanning all refs at every save and release was quadratic).
        self.live = 0

    def hold(self, packed: _Packed) -> None:
        self.live += 1
        self.refs.append(weakref.ref(packed, self))

    def __call__(self, _ref: object) -> None:
        self.live -= 1
        if self.live or self.released or self.curve is None:
            return
        self.released = True
        self.curve += (time.perf_counter_ns(), -self.nbytes)


class ActivationCounter:
    """Charges saved storages to invocations; holds storage keys and byte counts, no tensors."""

    def __init__(
        self,
        excluded: set[StorageKey],
        current: Callable[[], int],
        on_error: Callable[[Exception], None],
        clock: Clock | None = None,
        curve: bool = False,
    ) -> None:
        self._clock = clock  # our pack-hook bodies run inside the module's window: not its time
        self._excluded = excluded  # parameters and buffers: not activations
        self._current = current
        self._on_error = on_error
        self._saved: dict[StorageKey, _Saved] = {}
        # Flat (perf_counter_ns, signed bytes) pairs: saved bytes added and released over the
        # step (None: not recorded, e.g. on an accelerator, whose allocator gives the curve).
        self.curve: list[int] | None = [] if curve else None
        # Entries outlive `close()`: their releases come during the backward.
        self._entries: list[_Saved] = []
        self.bytes_by_invocation: dict[int, int] = {}
        self._ctx: torch.autograd.graph.saved_tensors_hooks | None = None

    def pack(self, tensor: torch.Tensor) -> _Packed:
        clock = self._clock
        if clock is not None:
            clock.own_enter()
        try:
            return self._pack(tensor)
        finally:
            if clock is not None:
                clock.own_leave_pack()

    def _pack(self, tensor: torch.Tensor) -> _Packed:
        packed = _Packed(tensor.detach(), _version(tensor))
        try:
            owner = self._current()
            if owner >= 0:
                curve = self.curve
                for key, nbytes in storages(tensor):
                    if key in self._excluded:
                        continue
                    entry = self._saved.get(key)
                    if entry is not None and entry.live > 0:
                        entry.hold(packed)  # saved again: counted once, by the first saver
                    else:
                        entry = _Saved(owner, nbytes, curve)
                        entry.hold(packed)
                        self._saved[key] = entry
                        if curve is not None:
                            self._entries.append(entry)
                            curve += (time.perf_counter_ns(), nbytes)
        except Exception as error:  # measurement must never break the user's forward
            self._on_error(error)
        return packed

    def close(self) -> None:
        """End of the forward: charge the storages that are still saved."""
        for entry in self._saved.values():
            if entry.live > 0:
                owner = entry.owner
                self.bytes_by_invocation[owner] = (
                    self.bytes_by_invocation.get(owner, 0) + entry.nbytes
                )
        self._saved = {}

    def stop_curve(self) -> None:
        """The step is over: later releases (a retained graph freed by the next step) are not
        part of this step's curve."""
        for entry in self._entries:
            entry.released = True
        self._entries = []

    # ---- our saved-tensor hooks on the thread's hook stack --------------------------------
    @property
    def pushed(self) -> bool:
        return self._ctx is not None

    def push(self) -> None:
        unpack_hook = unpack if self._clock is None else ledgered_unpack(self._clock)
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self.pack, unpack_hook)
        self._ctx.__enter__()

    def pop(self) -> None:
        """Pop our hooks, whatever is on top (the end of our forward: the stack must balance)."""
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = None

    def pop_if_innermost(self) -> bool:
        """Pop our hooks if they are the innermost ones; True once they are gone.

        The hook stack is global to the thread: popping when someone else's hooks are on top
        would remove theirs, so then we wait until they have left."""
        if self._ctx is None:
            return True
        if tp.top_saved_tensors_pack_hook() != self.pack:
            return False
        self.pop()
        return True
