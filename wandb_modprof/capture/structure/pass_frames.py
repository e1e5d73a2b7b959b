"""The structure pass's bookkeeping per call: the open call's tensors (`Frame`) and what the
pass found about each call (`CallBuilder`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from wandb_modprof.capture.forward.invocation import tensors_in
from wandb_modprof.capture.structure.known_calls import KnownCall, Meta
from wandb_modprof.records.calls import CallInfo, DataEdge

# Python-level in-place operators: they return their first argument (or None for
# `__setitem__`), which now carries what was written into it.
_INPLACE_DUNDERS = frozenset(
    {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
     "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
     "__imatmul__"}
)  # fmt: skip


class Follower(Protocol):
    """What the dataflow mode tells (a `structure_pass.StructurePass`)."""

    failed: bool

    def follow(
        self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any
    ) -> None: ...

    def fail(self, error: Exception) -> None: ...


class Dataflow(TorchFunctionMode):
    """The pass's `TorchFunctionMode`: every Python-level torch call, run as called, then
    followed (`Frame.follow_op`)."""

    def __init__(self, pass_: Follower) -> None:
        super().__init__()
        self.pass_ = pass_

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # the user's op runs exactly as without us
        if not self.pass_.failed:
            try:
                self.pass_.follow(func, args, kwargs, out)
            except Exception as error:  # never let the pass break the forward
                self.pass_.fail(error)
        return out


class Frame:
    """One open invocation: where its tensors came from, and the edges found in its view.
    A frame the pass does not follow (`followed=False`: its results are known from an
    earlier pass, `known_calls`) tracks no tensors; it lists the calls it makes instead, to
    check that they are the ones it made before."""

    __slots__ = ("children", "followed", "index", "key", "sources")

    def __init__(self, index: int, key: str, followed: bool = True) -> None:
        self.index = index
        self.key = key
        self.followed = followed
        self.children: list[str] = []
        # tensor -> the node keys (of this view) it derives from
        self.sources: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def sources_of(self, tensors: Iterable[torch.Tensor]) -> set[str]:
        """Sources of the tensors, and of the bases of views (a write through another view
        of the same base reaches them too)."""
        found: set[str] = set()
        for t in tensors:
            s = self.sources.get(t)
            if s:
                found |= s
            base = t._base
            if base is not None:
                s = self.sources.get(base)
                if s:
                    found |= s
        return found

    def follow_op(
        self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any
    ) -> None:
        """Record where the tensors an op produced or wrote into came from."""
        written = kwargs.get("out")
        inputs = _op_tensors(args)
        if kwargs:
            inputs += _op_tensors(tuple(v for k, v in kwargs.items() if k != "out"))
        found = self.sources_of(inputs)
        if not found:
            return
        name = getattr(func, "__name__", "")
        if written is not None:  # `out=`: the old contents are gone
            targets, replace = list(tensors_in(written)), True
        elif name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("_")):
            first = args[0] if args else None
            targets, replace = ([first] if isinstance(first, torch.Tensor) else []), False
        else:
            targets, replace = [], False
        for t in targets:  # written in place: so is the base of a view
            self.add(t, found, replace)
            if t._base is not None:
                self.add(t._base, found)
        for t in tensors_in(out):
            self.add(t, found)

    def add(self, t: torch.Tensor, found: set[str], replace: bool = False) -> None:
        old = None if replace else self.sources.get(t)
        self.sources[t] = found | old if old else set(found)


def _op_tensors(values: tuple[Any, ...]) -> list[torch.Tensor]:
    """The tensors among an op's arguments, as `tensors_in` finds them, with the usual shapes
    (tensors, and lists or tuples of them) read without a generator per value: every op of
    the pass's forward asks."""
    found: list[torch.Tensor] = []
    tensor = torch.Tensor
    for value in values:
        if isinstance(value, tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, tensor):
                    found.append(item)
                elif not isinstance(item, (int, float, bool, str, type(None))):
                    found.extend(tensors_in(item, 2))
        elif not isinstance(value, (int, float, bool, str, type(None))):
            found.extend(tensors_in(value, 1))
    return found


class CallBuilder:
    __slots__ = (
        "bwd_flops", "bytes", "call_index", "depth", "flops", "followed", "inputs", "key",
        "known", "linear", "meta", "module_id", "module_name", "module_type", "ops", "outputs",
        "parent", "rows", "seq", "twin",
    )  # fmt: skip

    def __init__(
        self,
        module_id: int,
        name: str,
        module_type: str,
        key: str,
        call_index: int,
        parent: int,
        depth: int,
    ) -> None:
        self.module_id = module_id
        self.module_name = name
        self.module_type = module_type
        self.call_index = call_index
        self.key = key  # the timed session's key for the same call (`capture.call_keys`)
        self.parent = parent
        self.depth = depth
        self.inputs: tuple[str, ...] = ()
        self.outputs: tuple[str, ...] = ()
        self.flops = 0  # of ops in the call's own code (children's are theirs)
        self.bwd_flops = 0
        self.bytes = 0
        self.ops = 0
        # autograd sequence numbers of the nodes created in the call: [start, end)
        self.seq = (-1, -1)
        self.meta: Meta = ()
        self.followed = True
        # not followed: what an earlier pass found (None: nobody knows yet, the pass is partial)
        self.known: KnownCall | None = None
        self.rows: int | None = None  # its first tensor input's (`invocation.rows_of`)
        self.linear = True  # every op of its own code so far linear in the rows (`flops`)
        self.twin: str | None = None  # its class among identical list members (`known_calls`)


def rolled_up(own: Sequence[int], parents: Sequence[int]) -> list[int]:
    """Inclusive counts from each call's own (`parents[i]`: the index of call i's parent, -1
    for the root; children come after their parent, as calls are entered)."""
    inclusive = list(own)
    for i in range(len(parents) - 1, 0, -1):
        inclusive[parents[i]] += inclusive[i]
    return inclusive


def call_infos(calls: Sequence[CallBuilder]) -> tuple[CallInfo, ...]:
    """The calls of a finished pass, with their counts summed up the tree."""
    parents = [c.parent for c in calls]
    inclusive, bwd, nbytes, ops = (
        rolled_up([getattr(c, name) for c in calls], parents)
        for name in ("flops", "bwd_flops", "bytes", "ops")
    )
    linear = rolled_up([int(not c.linear) for c in calls], parents)  # (0: the whole subtree)
    return tuple(
        CallInfo(
            key=c.key,
            module_name=c.module_name,
            module_type=c.module_type,
            call_index=c.call_index,
            parent_key=None if c.parent < 0 else calls[c.parent].key,
            depth=c.depth,
            order=i,
            inputs=c.inputs,
            outputs=c.outputs,
            fwd_flops=inclusive[i],
            fwd_self_flops=c.flops,
            flops_known=True,  # (every op of every call of the pass was counted)
            bwd_flops=bwd[i],
            bwd_self_flops=c.bwd_flops,
            fwd_bytes=nbytes[i],
            fwd_self_bytes=c.bytes,
            fwd_ops=ops[i],
            fwd_self_ops=c.ops,
            work_known=True,
            rows=c.rows,
            rows_linear=c.rows is not None and not linear[i],
        )
        for i, c in enumerate(calls)
    )


def own_results(
    calls: Sequence[CallBuilder], edges: Iterable[DataEdge]
) -> list[tuple[str, KnownCall]]:
    """Per followed call: its own results, as a later pass may reuse them (`known_calls`)."""
    children: list[list[str]] = [[] for _ in calls]
    for c in calls:
        if c.parent >= 0:
            children[c.parent].append(c.key)
    by_view: dict[str, list[DataEdge]] = {}
    for e in edges:
        by_view.setdefault(e.view_key, []).append(e)
    return [
        (
            c.key,
            KnownCall(
                c.meta,
                tuple(children[i]),
                c.flops,
                c.bwd_flops,
                c.bytes,
                c.ops,
                tuple(by_view.get(c.key, ())),
                rows=c.rows,
                linear=c.linear,
                twin=c.twin,
            ),
        )
        for i, c in enumerate(calls)
        if c.followed
    ]
