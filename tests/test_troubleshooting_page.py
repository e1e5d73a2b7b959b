"""docs/troubleshooting.md has an entry for every warning the package can print.

The warnings are found in the source with `ast` (no torch import): every call of
`warnings.warn`, `warn_safely` or `warn_at_user` (`wandb_modprof/_warn.py`) under
`wandb_modprof/` and in `wandb_modprof_cli.py`. Of each message, the first literal fragment
with at least `MIN_CHARS` characters of stable text (after the common `wandb_modprof: ` prefix;
of a long one, its first words up to `MAX_CHARS` characters) must appear on the page,
whitespace collapsed, so a new warning without an entry fails here.

Messages are followed through the patterns the package uses:

- a local variable (`text = ...; warn_at_user(text, ...)`), each assignment one message;
- `+` concatenation and `a if c else b` (each branch one message);
- a helper function of the same module that returns the text (`_no_sample_text(...)`);
- a wrapper that warns with its parameter inside a fixed frame (`self.warn(why)`,
  `self._warn_once(key, what)`, `self._fail(what, error)`): the frame's own text is one
  message and every literal a caller passes for that parameter is one more.

The page, and every other page of docs/ (and the README), also state facts of the code that
must not drift: the command line's exit statuses (the `EXIT_*` constants of
`wandb_modprof_cli.py`) and the profile file versions the loader reads (`VERSION` and
`SUPPORTED_VERSIONS` of `wandb_modprof/sinks/file/profile_file.py`), both read with `ast` too.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCES = [*sorted((ROOT / "wandb_modprof").rglob("*.py")), ROOT / "wandb_modprof_cli.py"]
# Defines the helpers; the messages it passes on are its callers'.
HELPERS_MODULE = ROOT / "wandb_modprof" / "_warn.py"
WARN_HELPERS = {"warn_safely", "warn_at_user"}
PREFIX = "wandb_modprof:"
MIN_CHARS = 12
MAX_CHARS = 60  # of a long literal, the words within its first MAX_CHARS characters

# Warn calls whose message has no literal fragment of MIN_CHARS characters, by
# "path:function". None today; a new one is listed here with the reason it cannot be read from
# the source, and gets its page entry by hand.
DYNAMIC: dict[str, str] = {}


@dataclass(frozen=True)
class Param:
    """A fragment that is the enclosing function's parameter `name` (a wrapper's message)."""

    name: str


Fragment = str | Param | None  # None: text known only at run time
Message = tuple[Fragment, ...]


@dataclass
class Module:
    path: Path
    tree: ast.Module
    functions: dict[str, ast.FunctionDef]  # top-level functions, for helpers returning text


def _is_warn_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in WARN_HELPERS or func.id == "warn"
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "warn"
        and isinstance(func.value, ast.Name)
        and func.value.id == "warnings"
    )


def _message_arg(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg == "message"), None)


def _calls_in(
    tree: ast.AST, scope: ast.FunctionDef | None = None
) -> Iterator[tuple[ast.Call, ast.FunctionDef | None]]:
    """Every call with its innermost enclosing function (None at module level)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _calls_in(child, child)  # type: ignore[arg-type]
        else:
            if isinstance(child, ast.Call):
                yield child, scope
            yield from _calls_in(child, scope)


def _params(scope: ast.FunctionDef | None) -> list[str]:
    if scope is None:
        return []
    args = scope.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]


def _assigned(scope: ast.FunctionDef, name: str) -> list[ast.expr]:
    values = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            values.append(node.value)
    return values


def _product(parts: list[list[Message]]) -> list[Message]:
    out: list[Message] = [()]
    for alternatives in parts:
        out = [done + more for done in out for more in alternatives]
    return out


def messages(  # noqa: PLR0911 (one return per kind of expression)
    expr: ast.expr,
    scope: ast.FunctionDef | None,
    module: Module,
    helpers: bool = True,
    depth: int = 0,
) -> list[Message]:
    """The messages `expr` can evaluate to, as fragments (alternatives for branches).
    `helpers`: follow a call of a text-building function of the module (not inside a
    placeholder, where a helper gives a value such as a run's name, not message text).
    `depth` ends a chain of names and helpers that refers back to itself (`x = x + "..."`)."""
    if depth > 8:
        return [(None,)]
    depth += 1
    if isinstance(expr, ast.Constant):
        return [(expr.value,)] if isinstance(expr.value, str) else [(None,)]
    if isinstance(expr, ast.JoinedStr):
        parts: list[list[Message]] = []
        for value in expr.values:
            if isinstance(value, ast.Constant):
                parts.append([(str(value.value),)])
            elif (
                isinstance(value, ast.FormattedValue)
                and value.conversion == -1
                and value.format_spec is None
                and isinstance(value.value, ast.Name)
            ):
                parts.append(messages(value.value, scope, module, False, depth))
            else:
                parts.append([(None,)])
        return _product(parts)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = (messages(e, scope, module, helpers, depth) for e in (expr.left, expr.right))
        return _product([left, right])
    if isinstance(expr, ast.IfExp):
        body, orelse = (
            messages(e, scope, module, helpers, depth) for e in (expr.body, expr.orelse)
        )
        return body + orelse
    if isinstance(expr, ast.Name) and scope is not None:
        values = _assigned(scope, expr.id)
        if values:
            return [m for v in values for m in messages(v, scope, module, helpers, depth)]
        if expr.id in _params(scope):
            return [(Param(expr.id),)]
    if helpers and isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        helper = module.functions.get(expr.func.id)
        if helper is not None:  # a function of this module that builds the text
            returns = [n.value for n in ast.walk(helper) if isinstance(n, ast.Return) and n.value]
            return [m for r in returns for m in messages(r, helper, module, True, depth)]
    return [(None,)]


def leading_text(message: Message) -> str | None:
    """The first literal run of at least MIN_CHARS characters, whitespace collapsed, without
    the `wandb_modprof: ` prefix every message starts with; None if there is none."""
    runs: list[str] = []
    text = ""
    for fragment in message:
        if isinstance(fragment, str):
            text += fragment
        else:
            runs.append(text)
            text = ""
    runs.append(text)
    for i, raw in enumerate(runs):
        run = " ".join(raw.split())
        if i == 0 and run.startswith(PREFIX):
            run = run[len(PREFIX) :].strip()
        if len(run) > MAX_CHARS:
            run = run[: MAX_CHARS + 1].rsplit(" ", 1)[0]
        if len(run) >= MIN_CHARS:
            return run
    return None


def _substitute(message: Message, param: str, text: Message) -> Message:
    return tuple(
        part for fragment in message for part in (text if fragment == Param(param) else (fragment,))
    )


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _argument(call: ast.Call, wrapper: ast.FunctionDef, param: str) -> ast.expr | None:
    """The argument `call` passes for the wrapper's `param` (positional or keyword)."""
    for keyword in call.keywords:
        if keyword.arg == param:
            return keyword.value
    params = _params(wrapper)
    if isinstance(call.func, ast.Attribute) and params[:1] == ["self"]:
        params = params[1:]
    index = params.index(param) if param in params else len(call.args)
    return call.args[index] if index < len(call.args) else None


def _location(module: Module, scope: ast.FunctionDef | None, call: ast.Call) -> str:
    where = scope.name if scope is not None else "<module>"
    return f"{module.path.relative_to(ROOT).as_posix()}:{where} (line {call.lineno})"


@functools.cache
def _modules() -> list[Module]:
    modules = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        modules.append(Module(path, tree, functions))
    return modules


@functools.cache
def collect() -> tuple[dict[str, str], list[str]]:
    """{leading text: where it is emitted}, and the warn calls with no leading text."""
    calls = [(m, call, scope) for m in _modules() for call, scope in _calls_in(m.tree)]

    found: dict[str, str] = {}
    unreadable: list[str] = []

    def add(message: Message, where: str, whole: Message | None = None) -> None:
        # A caller's short literal ("publish") is read within the wrapper's message (`whole`).
        text = leading_text(message) or (leading_text(whole) if whole else None)
        if text is None:
            if where.split(" (line", maxsplit=1)[0] not in DYNAMIC:
                unreadable.append(where)
        else:
            found.setdefault(text, where)

    for module, call, scope in calls:
        if module.path == HELPERS_MODULE or not _is_warn_call(call):
            continue
        arg = _message_arg(call)
        if arg is None:
            continue
        where = _location(module, scope, call)
        for message in messages(arg, scope, module):
            add(message, where)
            params = {f.name for f in message if isinstance(f, Param)}
            if not params or scope is None:
                continue
            # A wrapper: every literal its callers pass for these parameters is a message too.
            for caller_module, caller, caller_scope in calls:
                if _callee(caller) != scope.name or _is_warn_call(caller):
                    continue
                for param in params:
                    passed = _argument(caller, scope, param)
                    if passed is None:
                        continue
                    for text in messages(passed, caller_scope, caller_module):
                        if any(isinstance(f, str) for f in text):  # text, not an error object
                            whole = _substitute(message, param, text)
                            add(text, _location(caller_module, caller_scope, caller), whole)
    return found, unreadable


def _page_text() -> str:
    return " ".join(PAGE.read_text(encoding="utf-8").split())


def test_the_source_scan_finds_the_warnings() -> None:
    """Guards the scan itself: a renamed helper must not leave the page test checking nothing."""
    found, _ = collect()
    assert len(found) >= 15, sorted(found)
    assert any("was watched for" in text for text in found)  # through a text-building helper
    assert any("structure passes failed" in text for text in found)  # through a wrapper


def test_every_warning_has_readable_leading_text() -> None:
    _, unreadable = collect()
    assert not unreadable, (
        "warnings with no literal text of at least "
        f"{MIN_CHARS} characters (give them a stable start, or list them in DYNAMIC with the "
        "reason and document them by hand):\n" + "\n".join(unreadable)
    )


def test_every_warning_is_on_the_troubleshooting_page() -> None:
    found, _ = collect()
    page = _page_text()
    missing = [f"{text!r}  ({where})" for text, where in sorted(found.items()) if text not in page]
    assert not missing, (
        f"{PAGE.relative_to(ROOT)} lacks an entry for these warnings (their leading text):\n"
        + "\n".join(missing)
    )


def test_no_logging_calls_outside_the_warning_helpers() -> None:
    """Messages reach users through the warn helpers only (their `-W error` fallback logs);
    a direct logger call would be a message this test does not see."""
    levels = {"debug", "info", "warning", "warn", "error", "exception", "critical"}
    offenders = []
    for module in _modules():
        if module.path == HELPERS_MODULE:
            continue
        for node in ast.walk(module.tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in levels
                and isinstance(node.func.value, ast.Name)
                and "log" in node.func.value.id.lower()
            ):
                offenders.append(f"{module.path.relative_to(ROOT).as_posix()}:{node.lineno}")
    assert not offenders, offenders


# ---- facts of the code the pages state -----------------------------------------------------
CLI = ROOT / "wandb_modprof_cli.py"
PROFILE_FILE = ROOT / "wandb_modprof" / "sinks" / "file" / "profile_file.py"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def _constants(path: Path) -> dict[str, object]:
    """The module-level `NAME = <literal>` assignments of a source file."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    continue  # not a literal
    return found


def _exit_statuses() -> set[int]:
    """What the command line can exit with: its `EXIT_*` constants."""
    statuses = {v for k, v in _constants(CLI).items() if k.startswith("EXIT_")}
    assert statuses and all(type(v) is int for v in statuses), statuses
    return statuses  # type: ignore[return-value]


def _versions() -> tuple[int, tuple[int, ...]]:
    """The profile file version written, and those read."""
    constants = _constants(PROFILE_FILE)
    written, read = constants["VERSION"], constants["SUPPORTED_VERSIONS"]
    assert type(written) is int and isinstance(read, tuple) and written == max(read), read
    return written, read


def _section(text: str, heading: str) -> str:
    """The lines under a markdown heading, up to the next heading of any level."""
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = re.search(r"^#", text[start:], re.MULTILINE)
    return text[start : start + end.start()] if end else text[start:]


def test_the_command_line_help_lists_exactly_its_exit_statuses() -> None:
    epilog = _constants(CLI)["EPILOG"]
    assert isinstance(epilog, str)
    assert {int(s) for s in re.findall(r"^  (\d+) ", epilog, re.MULTILINE)} == _exit_statuses()


def test_the_page_lists_exactly_the_exit_statuses_of_the_command_line() -> None:
    text = PAGE.read_text(encoding="utf-8")
    table = _section(text, "### Error format and exit status")
    rows = [int(s) for s in re.findall(r"^\| *(\d+) *\|", table, re.MULTILINE)]
    assert sorted(rows) == sorted(_exit_statuses()), rows
    named = {int(s) for s in re.findall(r"Exit status (\d+)", text)}
    assert named and named <= _exit_statuses(), named


def test_every_page_names_only_exit_statuses_of_the_command_line() -> None:
    """`exit 2`, `Exit status 3`, `exits 1` anywhere in the docs, and the list of statuses in
    the command line's section of docs/reports.md."""
    statuses = _exit_statuses()
    wrong = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"\bexit(?:s| status| code)? (\d+)\b", text, re.IGNORECASE):
            if int(match.group(1)) not in statuses:
                wrong.append(f"{page.relative_to(ROOT)}: {match.group(0)!r}")
    assert not wrong, f"exit statuses the command line does not use ({sorted(statuses)}): {wrong}"
    reports = (ROOT / "docs" / "reports.md").read_text(encoding="utf-8")
    listed = reports.split("\nExit status:\n", 1)[1].split("\n\n", 1)[0]
    assert {int(s) for s in re.findall(r"^- `(\d+)`", listed, re.MULTILINE)} == statuses, listed


def test_the_pages_name_the_profile_file_versions_the_loader_reads() -> None:
    written, read = _versions()
    page = _page_text()
    (reads,) = re.findall(r"reads version ([\d, ]+);", page)
    assert tuple(int(v) for v in reads.split(",")) == read, reads
    formats = " ".join((ROOT / "docs" / "formats.md").read_text(encoding="utf-8").split())
    assert re.findall(r'`"version": (\d+)`', formats) == [str(written)]
    assert re.findall(r"saved again it is version (\d+)", formats) == [str(written)]
    # what each version added: every version after the first, once, in order
    added = [int(v) for v in re.findall(r"- version (\d+):", formats)]
    assert added == list(read[1:]), added
    wrong = []
    for path in PAGES:
        text = " ".join(path.read_text(encoding="utf-8").split())
        for match in re.finditer(r"\b[Vv]ersions? (\d+)(?:-(\d+))?\b|\b[Vv]ersion-(\d+)\b", text):
            numbers = [int(n) for n in match.groups() if n is not None]
            if match.group(0).lower().startswith("version ") and re.match(
                r"\.\d", text[match.end() :]
            ):
                continue  # a dotted version number (a package's), not a file version
            if not set(numbers) <= set(read):
                wrong.append(f"{path.relative_to(ROOT)}: {match.group(0)!r}")
    assert not wrong, f"file versions the loader does not read ({read}): {wrong}"
