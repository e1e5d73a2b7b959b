"""The private torch APIs the package depends on exist and still behave as assumed.

`wandb_modprof/capture/step/torch_private.py` holds every one of them (the registry of their
names and purposes: `torch_private_names.py`): each registry entry must resolve on the torch
under test (`make compat` runs this file on the second tested version), and no other module of
the package may reach a private torch name itself (a static scan of the source). If a torch
upgrade breaks one, this file fails loudly (rather than every profile silently reading zero
backward time).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import wandb_modprof
from wandb_modprof._errors import ModProfError
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.sinks.wandb import wandb_private

GROUPS = {"REQUIRED": tp.REQUIRED, "ON_MODULE": tp.ON_MODULE, "INLINE": tp.INLINE}
GROUPS |= {"OPTIONAL": tp.OPTIONAL, "LAZY": tp.LAZY}
ENTRIES = [(group, name) for group, names in GROUPS.items() for name in names]


@pytest.mark.parametrize(("group", "name"), ENTRIES, ids=[name for _, name in ENTRIES])
def test_every_registry_entry_resolves_on_this_torch(group: str, name: str) -> None:
    """LAZY ones included (they import Dynamo and torch.distributed here, not at watch)."""
    assert tp.resolves(name), f"torch {torch.__version__} lacks {group} entry {name}"


def test_the_registry_names_each_api_once_with_what_it_is_for() -> None:
    names = [name for _, name in ENTRIES]
    assert len(names) == len(set(names))
    assert all(name.startswith("torch.") and note for names_ in GROUPS.values()
               for name, note in names_.items())  # fmt: skip


def test_check_passes_on_this_torch() -> None:
    tp.check()
    tp.check(on_module=True)


def test_hot_entry_points_are_torch_s_own_functions() -> None:
    """Per module call and per node: no Python frame of ours between the hook and torch."""
    assert tp.sequence_nr is torch._C._autograd._get_sequence_nr
    assert tp.graph_task_id is torch._C._current_graph_task_id
    assert tp.current_autograd_node is torch._C._current_autograd_node
    assert tp.foreach_norm is torch._foreach_norm


def test_the_wrappers_answer_on_this_torch() -> None:
    """Each wrapper, called (the registry test only looks the names up)."""
    assert not tp.module_calls_observed()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert tp.module_calls_observed()  # a global module hook
    finally:
        handle.remove()
    with torch.profiler.profile():
        assert tp.module_calls_observed()
    assert isinstance(tp.optimizer_step_pre_hooks(), dict)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    assert tp.gradscaler_scale(scaler) is None  # (no `scale()` yet)
    scaler.scale(torch.ones(1))
    assert float(tp.gradscaler_scale(scaler)) == 8.0  # type: ignore[arg-type]
    assert {"step", "_maybe_opt_step"} <= {n for n in dir(torch.amp.GradScaler)}
    callback, skip_code, disable = tp.dynamo_frame_api()  # (imports Dynamo)
    assert callable(callback) and callable(skip_code) and callable(disable)
    assert tp.dynamo_loaded()
    compiled = tp.compiled_module_type()
    assert compiled is not None and isinstance(torch.compile(nn.Identity()), compiled)
    fake_tensor, fake_mode, reparametrize = tp.fake_tensor_api()
    assert issubclass(fake_tensor, torch.Tensor) and callable(fake_mode) and callable(reparametrize)
    assert tp.CALL_IMPL_CODE is nn.Module._call_impl.__code__
    assert len(tp.ATTENTION_OPS) == 4 and len(tp.CONVOLUTION_OPS) == 1


def test_a_missing_required_api_fails_check_naming_torch_s_version_and_the_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(tp.REQUIRED, "torch._C._no_such_api", "a test")
    monkeypatch.setitem(tp.INLINE, "torch.Tensor._no_such_attribute", "a test")
    with pytest.raises(ModProfError) as error:
        tp.check()
    text = str(error.value)
    assert torch.__version__ in text
    assert "torch._C._no_such_api" in text and "torch.Tensor._no_such_attribute" in text
    monkeypatch.setitem(tp.ON_MODULE, "torch._C._no_node_api", "a test")
    monkeypatch.delitem(tp.REQUIRED, "torch._C._no_such_api")
    monkeypatch.delitem(tp.INLINE, "torch.Tensor._no_such_attribute")
    tp.check()  # on_module's own needs are asked for by on_module only
    with pytest.raises(ModProfError, match=r"torch\._C\._no_node_api"):
        tp.check(on_module=True)


def test_a_missing_entry_point_is_a_stand_in_that_raises_when_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(tp.REQUIRED, "torch._C._no_such_api", "a test")
    stand_in = tp._bind("torch._C._no_such_api")
    assert not isinstance(torch.ones(1), stand_in)  # (a class: subclassing works at import)
    with pytest.raises(ModProfError, match=re.escape(f"torch {torch.__version__} has no")):
        stand_in()


def test_a_missing_optional_api_warns_once_naming_what_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(tp.OPTIONAL, "torch._C._no_such_api", "nothing is counted")
    tp._report_optional.cache_clear()
    try:
        with pytest.warns(RuntimeWarning) as seen:
            tp.check()
            tp.check()  # once per process
        assert [str(w.message) for w in seen] == [
            "wandb_modprof: a private torch API is missing from torch "
            f"{torch.__version__}: torch._C._no_such_api; nothing is counted"
        ]
        assert tp._bind("torch._C._no_such_api", optional=True) is None
    finally:
        tp._report_optional.cache_clear()


def test_a_missing_lazy_api_raises_where_it_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tp.LAZY, "torch._dynamo_no_such_module.thing", "a test")
    with pytest.raises(ModProfError, match=r"torch\._dynamo_no_such_module\.thing \(a test\)"):
        tp.load("torch._dynamo_no_such_module.thing")


def test_sequence_numbers_bracket_the_nodes_created_in_between():
    x = torch.randn(4, 4, requires_grad=True)
    lo = tp.sequence_nr()
    y = torch.tanh(x @ x)
    hi = tp.sequence_nr()
    node = y.grad_fn
    seen = []
    while node is not None and lo <= tp.node_sequence_nr(node) < hi:
        seen.append(type(node).__name__)
        node = node.next_functions[0][0]
    assert seen == ["TanhBackward0", "MmBackward0"]
    assert hi - lo == 2


def test_accumulate_grad_nodes_fall_outside_every_range():
    lin = nn.Linear(2, 2)
    out = lin(torch.randn(1, 2))
    acc = [n for n, _ in out.grad_fn.next_functions if n is not None and tp.is_accumulate_grad(n)]
    assert acc
    assert all(tp.node_sequence_nr(n) > tp.sequence_nr() for n in acc)


def test_in_backward_and_end_of_backward_callback():
    events = []
    x = torch.randn(3, requires_grad=True)
    y = (x * 2).sum()

    def pre(grad_outputs):
        events.append(("in_backward", tp.in_backward()))
        tp.queue_end_of_backward(lambda: events.append(("end", tp.in_backward())))

    y.grad_fn.register_prehook(pre)
    assert not tp.in_backward()
    y.backward()
    assert events[0] == ("in_backward", True)
    assert events[-1][0] == "end"


def test_saved_tensors_hooks_detection():
    assert not tp.saved_tensors_hooks_active()
    with torch.autograd.graph.save_on_cpu():
        assert tp.saved_tensors_hooks_active()
    assert not tp.saved_tensors_hooks_active()


def test_functorch_detection() -> None:
    """Not required by `check()`, but present on the tested versions: without it a
    `torch.func` transform over a watched model would warn an internal error again."""
    from torch.func import vmap

    assert tp._PEEK_FUNCTORCH is not None
    assert not tp.functorch_active()
    seen: list[bool] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        seen.append(tp.functorch_active())
        return x * 2

    vmap(f)(torch.ones(3, 2))
    assert seen == [True]
    assert not tp.functorch_active()


def test_a_mode_pushed_for_a_node_ends_with_the_node():
    """`push_mode_for_this_node` (the structure pass's backward count): the node's ops see the
    mode, the next node and the code after the backward do not, even after a node raised."""
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    assert tp.counts_backward()
    seen: list[tuple[str, str]] = []

    class Note(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append((tp.current_autograd_node().name(), str(func)))
            return func(*args, **(kwargs or {}))

    mode = Note()
    stacks: list[int] = []

    def pre(grad_outputs):  # type: ignore[no-untyped-def]
        stacks.append(len(_get_current_dispatch_mode_stack()))
        if tp.current_autograd_node().name() == "TanhBackward0":
            tp.push_mode_for_this_node(mode)

    x = torch.randn(4, requires_grad=True)
    y = (torch.tanh(x) * 3).sum()
    for node in (y.grad_fn, y.grad_fn.next_functions[0][0], y.grad_fn.next_functions[0][0]
                 .next_functions[0][0]):  # fmt: skip
        node.register_prehook(pre)
    y.backward()
    assert stacks == [0, 0, 0]  # sum, mul, tanh: nothing left over from an earlier node
    assert {name for name, _ in seen} == {"TanhBackward0"} and seen
    assert _get_current_dispatch_mode_stack() == []

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):  # type: ignore[no-untyped-def]
            return a.clone()

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            raise ValueError("boom")

    z = Boom.apply(x).sum()
    z.grad_fn.next_functions[0][0].register_prehook(lambda g: tp.push_mode_for_this_node(mode))
    with pytest.raises(ValueError, match="boom"):
        z.backward()
    assert _get_current_dispatch_mode_stack() == []


# ---- no module but torch_private reaches a private torch name --------------------------------
PACKAGE = Path(wandb_modprof.__file__).resolve().parent
HOME = PACKAGE / "capture" / "step" / "torch_private.py"
REGISTRY = HOME.with_name("torch_private_names.py")  # names as strings, reached by HOME
# Private names of Python itself that the package reads (neither torch's nor W&B's).
PYTHON_PRIVATE = {"_getframe": "sys._getframe", "_exit": "os._exit", "_fields": "namedtuples"}
NAME_ARGUMENT = {"getattr", "hasattr", "setattr", "delattr"}


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__") and part[1:2].isalpha()


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _on_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
    }


def _own_names(trees: list[ast.AST]) -> set[str]:
    """Private names the package defines on its own classes and objects (`self._x = ...`, a
    method `_x`, a class attribute or slot `_x`): reading those is not reaching into torch."""
    own = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        own.add(item.name)
                    targets = list(item.targets) if isinstance(item, ast.Assign) else []
                    targets += [item.target] if isinstance(item, ast.AnnAssign) else []
                    for target in targets:
                        own |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                        if isinstance(target, ast.Name) and target.id == "__slots__":
                            own |= {c.value for c in ast.walk(item) if isinstance(c, ast.Constant)}
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and _on_self(node)
            ):
                own.add(node.attr)
    return {name for name in own if isinstance(name, str) and _private(name)}


def _attribute_strings(tree: ast.Module) -> list[ast.Constant]:
    """String literals naming an attribute: `getattr(x, "_a")` & co., `x.__dict__["_a"]` or
    `.get("_a")`, and module-level constants (`ORIG = "_a"`, `_HOOK_DICTS = ("_a", ...)`)."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in NAME_ARGUMENT and len(node.args) > 1:
                found.append(node.args[1])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and (_dotted(node.func.value) or "").endswith("__dict__"):
                found += node.args[:1]
        elif isinstance(node, ast.Subscript) and (_dotted(node.value) or "").endswith("__dict__"):
            found.append(node.slice)
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if not all(isinstance(t, ast.Name) and t.id.isupper() for t in targets):
                continue  # (`__all__`, a TypeVar's own name)
            value = statement.value
            if isinstance(value, ast.Call) and len(value.args) == 1:  # frozenset({...})
                value = value.args[0]
            values = value.elts if isinstance(value, (ast.Tuple, ast.List, ast.Set)) else [value]
            own = {t.id for t in targets if isinstance(t, ast.Name)}  # (`_F = TypeVar("_F")`)
            found += [v for v in values if getattr(v, "value", None) not in own]
    return [c for c in found if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def scan(sources: dict[str, str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(private torch names reached, as "path:line: what"; private attributes of objects the
    package does not own, as (name, "path:line")) in `sources` (path -> text)."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    own = _own_names(list(trees.values()))
    torch_names: list[str] = []
    attributes: list[tuple[str, str]] = []
    for path, tree in trees.items():
        docstrings = _docstrings(tree)
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            where = f"{path}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                torch_names += [f"{where}: import {a.name}" for a in node.names
                                if a.name.split(".")[0] == "torch"
                                and any(map(_private, a.name.split(".")))]  # fmt: skip
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
                names = [*node.module.split("."), *(a.name for a in node.names)]  # type: ignore[union-attr]
                if any(map(_private, names)):
                    torch_names.append(f"{where}: from {node.module} import ...")
            elif isinstance(node, ast.Attribute):
                dotted = _dotted(node) or ""
                if dotted.split(".")[0] == "torch":  # (the whole chain once, not its parts)
                    if id(node) not in inner and any(map(_private, dotted.split("."))):
                        torch_names.append(f"{where}: {dotted}")
                elif _private(node.attr) and node.attr not in own and not _on_self(node):
                    attributes.append((node.attr, where))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts = node.value.split(".")
                if id(node) not in docstrings and parts[0] == "torch" and any(map(_private, parts)):
                    torch_names.append(f"{where}: {node.value!r}")
        for constant in _attribute_strings(tree):
            if _private(constant.value) and constant.value not in own:
                attributes.append((constant.value, f"{path}:{constant.lineno}"))
    return torch_names, attributes


def _registered_attributes() -> set[str]:
    names = [*(name for _, name in ENTRIES), *wandb_private.REGISTRY]
    return {name.rsplit(".", 1)[1] for name in names} | set(PYTHON_PRIVATE)


def test_no_module_but_torch_private_reaches_a_private_torch_name() -> None:
    """Private torch functions, classes and modules are reached through `torch_private`; a
    private attribute of an object (a tensor's `_version`) may be read inline, but only one
    that a registry names (so `check()` or this test finds it gone)."""
    sources = {
        path.relative_to(PACKAGE.parent).as_posix(): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in (HOME, REGISTRY) and path.name != "wandb_private.py"
    }
    torch_names, attributes = scan(sources)
    assert torch_names == [], "reach these through capture/step/torch_private.py"
    registered = _registered_attributes()
    unregistered = sorted({f"{name} ({where})" for name, where in attributes
                           if name not in registered})  # fmt: skip
    assert unregistered == [], "name these in torch_private's (or wandb_private's) registry"


def test_the_scan_finds_each_kind_of_private_use() -> None:
    """Guards the scan: each way the package used to reach private torch is still caught."""
    source = '''
import sys
import torch._dynamo
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import _get_current_function_mode_stack
from torch.utils import _pytree

class Own:
    __slots__ = ("_slot",)
    def _method(self): return self._slot, self._mine
    def __init__(self): self._mine = 1

def f(t, m, node):
    """`torch._C._mentioned` in a docstring is fine."""
    torch._C._get_sequence_nr()
    torch.ops.aten._convolution
    loaded = "torch._dynamo" in sys.modules
    hasattr(m, "_fsdp_wrapped_module")
    m.__dict__.get("_compiled_call_impl")
    return t._version, node._sequence_nr(), Own()._method(), sys._getframe()

NAMES = ("_forward_hooks", "public")
'''
    torch_names, attributes = scan({"x.py": source})
    assert len(torch_names) == 7, torch_names
    assert not any("_mentioned" in t for t in torch_names)
    found = sorted({name for name, _ in attributes})
    expected = ["_compiled_call_impl", "_forward_hooks", "_fsdp_wrapped_module", "_getframe"]
    assert found == sorted([*expected, "_sequence_nr", "_version"])
    assert set(found) <= _registered_attributes()
