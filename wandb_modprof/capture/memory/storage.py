"""Storage identity and size of tensors, so views, tied weights and shared buffers count once.

Two questions, two answers:
* `storages`: which allocations does this tensor keep alive? Whole storages: a saved view keeps
  its entire base alive, so activation memory is counted by storage.
* `extents`: how many bytes does this tensor itself occupy? Parameters and gradients that are
  slices of one flat buffer (DDP `gradient_as_bucket_view`, Megatron, FSDP1 flat params) are
  each charged their own slice, keyed by address so that tied weights still count once.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from wandb_modprof.capture.step.torch_private import is_traceable_wrapper_subclass

StorageKey = tuple[str, int, int]


def _components(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The dense tensors holding a tensor's data: unwrap subclasses and sparse layouts."""
    if is_traceable_wrapper_subclass(tensor):
        attrs, _ = tensor.__tensor_flatten__()
        for attr in attrs:
            yield from _components(getattr(tensor, attr))
        return
    layout = tensor.layout
    if layout == torch.sparse_coo:
        yield tensor._indices()
        yield tensor._values()
    elif layout in (torch.sparse_csr, torch.sparse_bsr):
        yield tensor.crow_indices()
        yield tensor.col_indices()
        yield tensor.values()
    elif layout in (torch.sparse_csc, torch.sparse_bsc):
        yield tensor.ccol_indices()
        yield tensor.row_indices()
        yield tensor.values()
    elif tensor.device.type != "meta":
        yield tensor


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_DEVICE_NAMES: dict[torch.device, str] = {}  # str(device) took a fifth of a saved tensor's count


def _device_name(device: torch.device) -> str:
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


def storages(tensor: torch.Tensor) -> list[tuple[StorageKey, int]]:
    """`(key, nbytes)` of the whole storages backing `tensor`."""
    if type(tensor) in _PLAIN and tensor.layout == torch.strided and not tensor.is_meta:
        # a plain dense tensor (every saved activation but a few): one storage, read directly
        try:
            storage = tensor.untyped_storage()
            key = (_device_name(tensor.device), storage.data_ptr(), 0)
            return [(key, storage.nbytes())]
        except (RuntimeError, NotImplementedError):
            pass
    return list(_storages(tensor))


def _storages(tensor: torch.Tensor) -> Iterator[tuple[StorageKey, int]]:
    for part in _components(tensor):
        try:
            storage = part.untyped_storage()
            yield (str(part.device), storage.data_ptr(), 0), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # no storage (e.g. functional tensors)
            yield ("id", id(part), 0), part.numel() * part.element_size()


def extents(tensor: torch.Tensor) -> Iterator[tuple[StorageKey, int]]:
    """Yield `(key, nbytes)` of the memory `tensor` itself spans (its slice of a storage)."""
    for part in _components(tensor):
        nbytes = part.numel() * part.element_size()
        try:
            yield (str(part.device), part.data_ptr(), nbytes), nbytes
        except (RuntimeError, NotImplementedError):
            yield ("id", id(part), nbytes), nbytes
