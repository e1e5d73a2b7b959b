"""Storage identity and size of tensors, so views and tied weights are counted once."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

StorageKey = tuple[str, int]


def storages(tensor: torch.Tensor) -> Iterator[tuple[StorageKey, int]]:
    """Yield `(key, nbytes)` of the storages backing `tensor`.

    Wrapper subclasses (DTensor, quantised wrappers) are unwrapped into their inner tensors;
    tensors without storage (sparse, meta, fake) fall back to their logical size, keyed by id.
    """
    if is_traceable_wrapper_subclass(tensor):
        attrs, _ = tensor.__tensor_flatten__()
        for attr in attrs:
            yield from storages(getattr(tensor, attr))
        return
    if tensor.device.type == "meta":
        return
    try:
        storage = tensor.untyped_storage()
        yield (str(tensor.device), storage.data_ptr()), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        yield ("id", id(tensor)), tensor.numel() * tensor.element_size()


def storage_keys(tensors: Iterator[torch.Tensor]) -> set[StorageKey]:
    return {key for t in tensors for key, _ in storages(t)}
