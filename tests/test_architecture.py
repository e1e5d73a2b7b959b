"""The package's import graph, built from the source: data flows one way.

Every import counts, also those inside functions and under `TYPE_CHECKING`: a lazy import
still couples two modules, and a cycle hidden in a function is still a cycle. Stages, lowest
first (a module may import its own stage or a lower one, never a higher one):

    base (_errors, _warn, _validate, _version, _lookup) < records < capture < stats < view < sinks
    < api < integrations < the package itself (__init__, __main__)

Inside `capture/` the sub-packages are layered the same way (`CAPTURE_LAYERS`), and no module
of the package is longer than `MAX_LINES`: a reader should take in a module at one sitting. The
cap is a smell detector, not a size to fill: no module comes within a tenth of it
(`HEADROOM_LINES`), so a module is split where its meaning splits, before a line count forces it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "wandb_modprof"
STAGES = ("base", "records", "capture", "stats", "view", "sinks", "api", "integrations", "top")
BASE = {"_errors", "_warn", "_validate", "_version", "_lookup"}
COMPAT = {"_capture"}  # old import paths kept loadable for pickles: at the top, like __init__
# capture's sub-packages, lowest first; below them the leaves `options` and `inert_hook`, above
# them the modules at the top of capture/ (hooks, session, resolve, ...), which put them together
CAPTURE_LAYERS = ("step", "model", "forward", "memory", "structure", "backward")
CAPTURE_LEAVES = {"options", "inert_hook"}
# sinks/ holds one sub-package per destination and, at its top, the helpers more than one of
# them uses; a destination imports those helpers, itself, and the destinations named here
# (the W&B log carries the HTML report and the profile file), a helper imports no destination
SINK_HELPERS = {"spec", "escape", "files"}
SINK_DESTINATIONS: dict[str, set[str]] = {
    "wandb": {"report", "file"},
    "file": set(),
    "traces": set(),
    "report": set(),
    "text": set(),
}
MAX_LINES = 400
# Over MAX_LINES before the limit was checked, and not split yet: each may not grow, and leaves
# this list once it is under the limit.
OVER_MAX_LINES: dict[str, int] = {}
HEADROOM_LINES = MAX_LINES * 9 // 10  # 360: no module within 10 % of the cap
# Over HEADROOM_LINES when the headroom was first checked, each being split by someone now: this
# list may only shrink. Each may not grow, and leaves the list once it is at most HEADROOM_LINES.
NEAR_MAX_LINES: dict[str, int] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__init__", "__main__") or parts[1] in COMPAT:
        return "top"
    if parts[1] in BASE:
        return "base"
    assert parts[1] in STAGES, f"{module} is in no stage: add its folder to STAGES"
    return parts[1]


def imports(path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, resolved to package modules."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:  # `from pkg import module` imports the module
                yield f"{target}.{alias.name}", node.lineno


def graph() -> dict[str, dict[str, int]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, dict[str, int]] = {m: {} for m in modules}
    for name, path in modules.items():
        for target, line in imports(path):
            if target in modules and target != name:
                edges[name].setdefault(target, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root, targets in edges.items():
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(targets))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_graph_is_read_from_the_source():
    edges = graph()
    assert len(edges) > 40  # every module of the package was found
    # function-level imports (`Profile.save` imports its sink when called) and TYPE_CHECKING
    # imports are edges too
    assert "wandb_modprof.sinks.file.profile_file" in edges["wandb_modprof.api.profile"]
    assert "wandb_modprof.records.snapshot" in edges["wandb_modprof.view.table"]


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_imports_point_down_the_stages():
    upward = [
        f"{src} ({stage(src)}) line {line} imports {dst} ({stage(dst)})"
        for src, targets in graph().items()
        for dst, line in targets.items()
        if STAGES.index(stage(dst)) > STAGES.index(stage(src))
    ]
    assert upward == []


def reached(edges: dict[str, dict[str, int]], sources: list[str]) -> set[str]:
    """Every module imported by `sources`, directly or through others."""
    seen: set[str] = set()
    stack = list(sources)
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack.extend(edges[module])
    return seen


def test_stats_never_reaches_the_live_step_session():
    """The capture hands the statistics stage plain records (`capture.session_record`), never
    its live `StepSession`: no module of stats/ imports `capture.session`, nor anything that
    does, and none names it."""
    edges = graph()
    stats = [m for m in edges if stage(m) == "stats"]
    assert "wandb_modprof.capture.session_record" in reached(edges, stats)
    assert "wandb_modprof.capture.session" not in reached(edges, stats)
    assert "wandb_modprof.capture.session" in reached(edges, ["wandb_modprof.capture.hooks"])
    named = [p.name for p in (PACKAGE / "stats").rglob("*.py") if "StepSession" in p.read_text()]
    assert named == []


def capture_layer(module: str) -> int | None:
    """0 for a leaf, 1.. for the sub-packages lowest first, above them the top of capture/;
    None outside capture/ (and for the package `wandb_modprof.capture` itself)."""
    parts = module.split(".")
    if parts[1:2] != ["capture"] or len(parts) < 3:
        return None
    if parts[2] in CAPTURE_LEAVES:
        return 0
    if parts[2] in CAPTURE_LAYERS:
        return 1 + CAPTURE_LAYERS.index(parts[2])
    return 1 + len(CAPTURE_LAYERS)


def test_capture_sub_packages_import_down_their_layers():
    upward = []
    for src, targets in graph().items():
        for dst, line in targets.items():
            a, b = capture_layer(src), capture_layer(dst)
            if a is not None and b is not None and b > a:
                upward.append(f"{src} line {line} imports {dst}")
    assert upward == []


def test_every_capture_module_is_in_a_layer():
    folders = {p.name for p in (PACKAGE / "capture").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(CAPTURE_LAYERS)


def sink_room(module: str) -> str | None:
    """The destination of a module of sinks/ ("helpers" for the shared ones at its top); None
    outside sinks/ (and for the package `wandb_modprof.sinks` itself)."""
    parts = module.split(".")
    if parts[1:2] != ["sinks"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in SINK_DESTINATIONS else "helpers"


def test_every_sink_is_in_a_destination_or_shared():
    folders = {p.name for p in (PACKAGE / "sinks").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(SINK_DESTINATIONS)
    helpers = {p.stem for p in (PACKAGE / "sinks").glob("*.py")} - {"__init__"}
    assert helpers == SINK_HELPERS


def test_sinks_import_only_shared_helpers_and_named_destinations():
    crossing = []
    for src, targets in graph().items():
        a = sink_room(src)
        for dst, line in targets.items():
            b = sink_room(dst)
            if a is None or b is None or b in (a, "helpers"):
                continue
            if a == "helpers" or b not in SINK_DESTINATIONS[a]:
                crossing.append(f"{src} line {line} imports {dst}")
    assert crossing == []


def module_lines() -> dict[str, int]:
    """Lines per module of the package, by path from the repository root."""
    return {
        path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }


def test_no_module_is_longer_than_max_lines():
    lines = module_lines()
    long = {name: n for name, n in lines.items() if n > OVER_MAX_LINES.get(name, MAX_LINES)}
    assert long == {}
    assert {name for name in OVER_MAX_LINES if lines.get(name, 0) <= MAX_LINES} == set()


def test_no_module_comes_within_a_tenth_of_max_lines():
    lines = module_lines()
    near = {name: n for name, n in lines.items() if n > NEAR_MAX_LINES.get(name, HEADROOM_LINES)}
    assert near == {}, (
        f"over {HEADROOM_LINES} lines (a tenth below MAX_LINES = {MAX_LINES}), or grown past "
        f"their entry in NEAR_MAX_LINES: {near}. Split each where its meaning splits (one object "
        "or one stage of the data flow per module), not at a line count."
    )
    done = sorted(name for name in NEAR_MAX_LINES if lines.get(name, 0) <= HEADROOM_LINES)
    assert done == [], f"{done}: at most {HEADROOM_LINES} lines now (or gone), off NEAR_MAX_LINES"


@pytest.mark.parametrize("folder", [s for s in STAGES if s not in ("base", "top")])
def test_each_stage_says_what_it_takes_and_gives(folder: str):
    init = PACKAGE / folder / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc is not None and len(doc.split()) >= 25, f"{init} needs a docstring paragraph"


def test_no_subpackage_shadows_a_public_name():
    import wandb_modprof

    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders & set(wandb_modprof.__all__) == set()


def test_no_module_imports_another_modules_private_names():
    private = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (
                node.level or "wandb_modprof" in (node.module or "")
            ):
                for alias in node.names:
                    name = alias.name
                    is_module = (PACKAGE / f"{name}.py").exists() or (PACKAGE / name).is_dir()
                    if name.startswith("_") and not name.startswith("__") and not is_module:
                        private.append(f"{module_name(path)} line {node.lineno}: {name}")
    assert private == []


def test_no_module_reads_another_modules_private_attributes():
    """`obj._name` where `_name` is one of ours but defined in another module (the accessing
    module defines no such name): a stage reaching into another's internals. Receivers that
    are `self`, `cls`, torch itself (`torch._C`) or the standard library's `os` and `sys`
    (`os._exit`, `sys._getframe`: documented there) are not ours to police."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in PACKAGE.rglob("*.py")}
    defined = {p: private_names(tree) for p, tree in trees.items()}
    ours = set().union(*defined.values())
    reads = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            receiver = ast.unparse(node.value)
            if node.attr.startswith("__") or receiver in ("self", "cls"):
                continue
            if receiver in ("torch", "os", "sys") or receiver.startswith("torch."):
                continue
            if node.attr in ours and node.attr not in defined[path]:
                reads.append(f"{module_name(path)} line {node.lineno}: {receiver}.{node.attr}")
    assert reads == []


def private_names(tree: ast.Module) -> set[str]:
    """Every `_name` a module defines: functions, classes, assigned names and attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {name for name in names if name.startswith("_")}
