"""The self-contained HTML report: the panel's Vega spec, its rows and Vega itself in one file.

>>> wandb_modprof.write_report("gpt.html", [("gpt", prof)])         # doctest: +SKIP
PosixPath('gpt.html')
>>> prof.to_html("gpt.html")                                         # the same, one profile

The page works from `file://` with the network cut: Vega's JavaScript is inlined (bundled by
vl-convert, Vega 6, once per process, about 0.9 MB: vl-convert's bundle always carries
vega-embed and vega-lite too, and its bare `vega` binding is null, so the page builds its view
with `vegaEmbed(..., {mode: "vega"})`). The spec is the panel's own (`sinks.spec.filled`), changed
only where a page differs from a W&B panel: its size follows the window (`width`, `height`,
`autosize`; a resize listener updates `view.width()/height()`), initial signal values
(compare mode, the runs shown), and no `$schema` (vega-embed would warn that the spec says
Vega 5 while it runs Vega 6; the spec is tested on both). Its rows travel as JSON columns +
data in a `<script type="application/json">` element and become the `wandb` dataset's values
before the view is parsed (outside W&B the spec is not frozen, so inline values are fine and
the first render already has them).

Every interaction of the panel (legend clicks, drill-down, breadcrumbs, hover card, top list,
runs, compare, pan, zoom, Fit) is a mark event in the spec, so all of them work here.

For tests and tools the page sets `window.__modprof_view` (the Vega `View`) and
`window.__modprof_ready` (`performance.now()` after the first render); on failure
`window.__modprof_error` holds the message, which the page also shows.

The page is the jinja2 template `templates/report.html.j2` with its style sheet
(`report.css`) and boot script (`report.js`), files of the package. Several profiles are the
page's runs (`runs.py`: their rows joined, the header's totals).

Escaping: every string that comes from the model or the caller (module and class names,
labels, the title) is page text (the templates' autoescape), or JSON inside `<script>`
(`script_json`: `<`, `>`, `&`, U+2028 and U+2029 written as `\\u` escapes), so no name can close
the script element or inject markup; Vega draws names as text.

A profile without samples still gives a page: it says "no samples" at the top and the graph
shows whatever structure was captured (nothing, for a profile that never ran).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wandb_modprof._errors import ModProfError
from wandb_modprof._validate import check_choice
from wandb_modprof.records.modes import DEFAULT_MODE, DEFAULT_SCALE, MODE_KEYS, SCALES
from wandb_modprof.records.snapshot import ProfileData, SupportsSnapshot, as_data
from wandb_modprof.sinks import spec as _spec
from wandb_modprof.sinks.escape import encodable
from wandb_modprof.sinks.files import check_path, missing_directory, write_atomic
from wandb_modprof.sinks.report.runs import joined_runs, run_id, totals_table
from wandb_modprof.sinks.report.table_notes import table_notes
from wandb_modprof.sinks.report.vega_bundle import vega_bundle
from wandb_modprof.view.checkpoint_cells import DEFAULT_BUDGET, check_budget

if TYPE_CHECKING:
    import jinja2
    import markupsafe

    from wandb_modprof.view.table import ProfileTable

_PROFILE_TYPES = (ProfileData, SupportsSnapshot)
SPEC_ID = "modprof-spec"
ROWS_ID = "modprof-rows"
_JSON_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}

_HOW_TO_READ = (
    "How to read it: each box is one module call of the view shown, coloured (Turbo, red = "
    "most expensive) by the analysis mode picked on the left; click a box marked + to open it, "
    "a breadcrumb to go back, hover for every value; drag to pan, wheel to zoom, Fit to reset."
)

# The page's parts as files in the package (wandb_modprof/sinks/report/templates): the page
# itself, its style sheet and its boot script, which runs after the bundle (module scripts run
# in document order), builds records from the columnar JSON, puts them into the `wandb` dataset
# and sizes the view to the chart element. report.js reads the two JSON elements by SPEC_ID and
# ROWS_ID.
_TEMPLATES = "templates"


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    """The report's templates; autoescape on, so every value is page text unless it is Markup
    (the style sheet, the scripts and `script_json`'s output)."""
    import jinja2  # when a report is written: `import wandb_modprof` stays free of it
    import markupsafe

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("wandb_modprof.sinks.report", _TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["script_json"] = lambda value: markupsafe.Markup(script_json(value))
    return env


def _trusted(text: str) -> markupsafe.Markup:
    import markupsafe

    return markupsafe.Markup(text)


@functools.lru_cache(maxsize=2)
def _asset(name: str) -> markupsafe.Markup:
    """A file of the package's templates folder, trusted as it is (the style sheet, the boot
    script)."""
    import markupsafe

    text = (resources.files("wandb_modprof.sinks.report") / _TEMPLATES / name).read_text("utf-8")
    return markupsafe.Markup(text)


def script_json(value: Any) -> str:
    """`value` as JSON that is safe inside a `<script>` element (and still the same JSON)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, escaped in _JSON_ESCAPES.items():
        text = text.replace(char, escaped)
    return text


def check_profiles(profiles: Any, where: str) -> list[tuple[str, ProfileData]]:
    """The (label, profile) pairs as (label, snapshot): each profile is read once, here."""
    if isinstance(profiles, (str, bytes)) or not isinstance(profiles, Sequence):
        raise ModProfError(
            f"{where} expected a sequence of (label, Profile) pairs; got {type(profiles).__name__}"
        )
    out: list[tuple[str, ProfileData]] = []
    for i, pair in enumerate(profiles):
        ok = isinstance(pair, tuple) and len(pair) == 2
        if not ok or not isinstance(pair[0], str) or not isinstance(pair[1], _PROFILE_TYPES):
            raise ModProfError(
                f"{where} expected (label: str, Profile) pairs; item {i} is {pair!r:.80}"
            )
        out.append((pair[0], as_data(pair[1], where)))
    if not out:
        raise ModProfError(f"{where} expected at least one (label, Profile) pair; got none")
    return out


def report_spec(
    mode: str = DEFAULT_MODE,
    scale: str = DEFAULT_SCALE,
    *,
    compare: bool = False,
    runs: int = 1,
    view: str = "",
) -> dict[str, Any]:
    """The panel's spec as the page (or a picture) starts it: mode, scale, compare, view."""
    spec = _spec.filled({"mode": mode, "scale": scale})
    spec["autosize"] = {"type": "fit", "contains": "padding"}
    initial = {"view_pick": view}
    if runs >= 2:
        # run ids are run_id(0), run_id(1), ...: the first profile is the baseline, the
        # second is shown
        initial["run_pick"] = run_id(1 if compare else 0, runs)
        initial["baseline_pick"] = run_id(0, runs)
    for signal in spec["signals"]:
        if signal["name"] in initial:
            signal["value"] = initial[signal["name"]]
        elif signal["name"] == "compare":
            signal["value"] = bool(compare and runs >= 2)
    return spec


def report_html(
    profiles: Sequence[tuple[str, ProfileData | SupportsSnapshot]],
    *,
    title: str | None = None,
    mode: str = DEFAULT_MODE,
    scale: str = DEFAULT_SCALE,
    compare: bool = False,
    checkpoint_budget: int | float | str | None = DEFAULT_BUDGET,
) -> str:
    """One self-contained HTML page showing `profiles` in the panel (see the module docstring).

    >>> page = report_html([("baseline", a), ("fused", b)], compare=True)  # doctest: +SKIP

    Args:
        profiles: (label, profile) pairs. One profile is drawn as the panel draws one run;
            several are listed as runs (row `id` = index as a string, zero-padded from 11 on,
            `name` = label), one drawn at a time.
        title: the page title (default: the first model's name + " profile").
        mode: the analysis mode the page opens with (`records.modes.MODE_KEYS`).
        scale: "linear" or "log".
        compare: open in compare mode, coloured by the ratio of the second profile to the
            first (the baseline); needs at least two profiles.
        checkpoint_budget: the checkpoint plan the "Checkpoint value" mode shows (bytes, a
            share or "50%", as `Profile.checkpoint_plan` takes; None: no plan).
    """
    pairs = check_profiles(profiles, "report_html()")
    budget = check_budget(checkpoint_budget, "report_html(checkpoint_budget=...)")
    mode = check_choice("mode", mode, MODE_KEYS)
    scale = check_choice("scale", scale, SCALES)
    if not isinstance(compare, bool):
        raise ModProfError(f"compare must be True or False; got {compare!r}")
    if compare and len(pairs) < 2:
        raise ModProfError(
            f"compare=True expected at least two profiles (baseline, compared); got {len(pairs)}"
        )
    if title is not None and not isinstance(title, str):
        raise ModProfError(f"title expected a str or None; got {type(title).__name__}")

    from wandb_modprof.view.table import build_table  # with the layout (igraph): lazily

    tables = [
        (label, prof.model_name, build_table(prof, checkpoint_budget=budget))
        for label, prof in pairs
    ]
    return tables_html(tables, mode, scale, compare=compare, title=title)


def tables_html(
    tables: Sequence[tuple[str, str, ProfileTable]],
    mode: str,
    scale: str,
    *,
    compare: bool = False,
    title: str | None = None,
) -> str:
    """`report_html` from (label, model name, table) triples already built (checked by the
    caller; `WandbLog` reuses the table it logs)."""
    from wandb_modprof._version import __version__

    columns, data, summaries = joined_runs(tables)
    models = list(dict.fromkeys(model for _, model, _ in summaries))
    page_title = title if title is not None else f"{models[0]} profile"
    spec = report_spec(mode, scale, compare=compare, runs=len(tables))
    spec.pop("$schema", None)  # vega-embed warns "spec uses Vega v5" under Vega 6
    notes = [
        f"{label}: no samples in this profile, so nothing was measured "
        "(watch samples every log_freq-th training step; a profile block times its second "
        "forward onwards)."
        for label, _, meta in summaries
        if not meta.get("num_samples")
    ]
    notes += [
        f"{label}: {note}" if len(tables) > 1 else note
        for (label, _, table) in tables
        for note in table_notes(table)
    ]
    written = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z").strip()
    heads, totals = totals_table(summaries, len(tables) > 1)
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            title=page_title,
            meta=f"model {', '.join(models)} · written {written} · wandb_modprof {__version__}",
            heads=heads,
            totals=totals,
            notes=notes,
            how_to_read=_HOW_TO_READ,
            css=_asset("report.css"),
            boot=_asset("report.js"),
            spec_id=SPEC_ID,
            rows_id=ROWS_ID,
            spec=spec,
            rows_json={"columns": columns, "data": data},
            vega=_trusted(vega_bundle()),
        )
    )


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (surrogateescape'd bytes) become U+FFFD
        return encodable(text).encode("utf-8")


def write_file(path: str | os.PathLike[str], data: str | bytes, what: str) -> Path:
    """Write `data` to `path` atomically (`sinks/files.py`: a failed write leaves the old file,
    a symlink is written through, a device, FIFO or directory refused); a ModProfError says
    what could not be written and why."""
    target = check_path(path, what)
    # Encoded before the file is opened: undecodable names (lone surrogates from a file name
    # or argument that is not UTF-8) become U+FFFD instead of failing half-way, leaving a
    # truncated file.
    payload = _utf8(data) if isinstance(data, str) else data
    try:
        write_atomic(target, payload, f"{what} cannot write {str(target)!r}")
    except OSError as error:
        why = missing_directory(error, target) or error.strerror or str(error)
        if isinstance(error, PermissionError):
            why = "permission denied"
        raise ModProfError(f"{what} cannot write {str(target)!r}: {why}") from None
    return target


def write_report(
    path: str | os.PathLike[str],
    profiles: Sequence[tuple[str, ProfileData | SupportsSnapshot]],
    **kw: Any,
) -> Path:
    """Write `report_html(profiles, **kw)` to `path` (UTF-8) and return the path.

    Examples:
        >>> write_report("compare.html", [("a", a), ("b", b)], compare=True)  # doctest: +SKIP
        PosixPath('compare.html')
    """
    return write_file(path, report_html(profiles, **kw), "write_report()")


def iframe_html(page: str, height_px: int = 650) -> str:
    """`page` inside a sandboxed `<iframe srcdoc>`: its scripts run in a notebook output
    without trusting the notebook, isolated from it (no same-origin access)."""
    frame = _environment().get_template("iframe.html.j2").render(page=page, height_px=height_px)
    return frame.removesuffix("\n")  # the template file's last newline
