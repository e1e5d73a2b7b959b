"""Bytes each module invocation keeps alive for backward, via saved-tensor hooks.

`pack` runs whenever autograd saves a tensor during the sampled forward and charges its storage
to the innermost running invocation (first saver wins, so a storage counts once).

Two deliberate choices keep training unchanged:
* `pack` stores `tensor.detach()`, not the tensor: packing the tensor itself makes
  output -> grad_fn -> saved output a reference cycle that Python cannot collect, so a forward
  without backward would leak its whole graph (checked in tests/test_no_leaks.py).
* autograd skips its in-place modification check for tensors packed by hooks; `unpack`
  performs the same version-counter check, so `x.add_(1)` after `sigmoid(x)` still raises.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._storage import StorageKey, storages


class _Packed:
    __slots__ = ("tensor", "version")

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


class ActivationCounter:
    """Charges saved storages to invocations; holds storage keys and byte counts, no tensors."""

    def __init__(
        self,
        excluded: set[StorageKey],
        current: Callable[[], int],
        on_error: Callable[[Exception], None],
    ) -> None:
        self._excluded = excluded  # parameters and buffers: not activations
        self._seen: set[StorageKey] = set()
        self._current = current
        self._on_error = on_error
        self.bytes_by_invocation: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> _Packed:
        try:
            owner = self._current()
            if owner >= 0:
                for key, nbytes in storages(tensor):
                    if key in self._excluded or key in self._seen:
                        continue
                    self._seen.add(key)
                    total = self.bytes_by_invocation.get(owner, 0) + nbytes
                    self.bytes_by_invocation[owner] = total
        except Exception as error:  # measurement must never break the user's forward
            self._on_error(error)
        return _Packed(tensor.detach(), _version(tensor))

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, unpack)
