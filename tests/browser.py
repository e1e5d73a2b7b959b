"""Real Vega 5 in real Chromium, fed the way W&B's custom-chart panel feeds it.

W&B's panel (vega ^5.24.0, which W&B's lockfile pins to 5.25.0, the version used here; through
react-vega) takes the spec, applies its patches and only then parses it; rows arrive later, as
the dataset `wandb`, after a first render without them. This harness does the same, so a spec
that passes here has met the panel's actual conditions:

- every JSON `null` becomes `{}` (W&B's `deepMapArraysAndValues`), then any `"scale"` whose
  value is empty becomes `null` again (W&B's `patchScaleToNull`);
- `autosize` is forced to `{"type": "fit", "contains": "padding"}`, width/height are the panel's;
- the spec is deep-frozen (immer's `produce` freezes what it returns), so a spec that Vega
  would need to mutate (inline `data.values`, wandb#6766) fails here as it fails there;
- `vega.parse` + `new vega.View(..., {hover: true})`, one `runAsync()` with `wandb` empty, then
  `view.change("wandb", changeset().remove(truthy).insert(rows))`, `view.resize()` (react-vega
  re-fits the view after every data update) and `runAsync()` again.

Nothing is fetched: every request the page makes is aborted and reported as an error.

    >>> with launch() as browser:                                   # doctest: +SKIP
    ...     panel = browser.open_panel(spec, rows)
    ...     panel.click("mode_entry", lambda i: i.datum["key"] == "act")
    ...     assert panel.signal("mode") == "act" and panel.errors() == []
    ...     assert panel.warnings() == []

Chromium is Debian's (`/usr/bin/chromium`, never `playwright install`); Vega is the file
`make vendor` puts in `tests/.vendor/`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb_modprof.view.columns import RESOLVED_COLUMNS

VEGA_VERSION = "5.25.0"
VEGA_JS = Path(__file__).parent / ".vendor" / f"vega-{VEGA_VERSION}.min.js"
CHROMIUM = Path(os.environ.get("MODPROF_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
)
MARGIN_PX = 16  # the panel sits off the page origin so that offsets are really summed
TIMEOUT_MS = 15_000


def stored(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`rows` as the table stores them: without what `ProfileTable.resolved()` adds (tests
    read full keys; the panel must find them itself from the refs, as in W&B)."""
    out = []
    for row in rows:
        kept = {k: v for k, v in row.items() if k not in RESOLVED_COLUMNS}
        if row.get("row_kind") in ("node", "edge"):
            kept["view_key"] = ""
        out.append(kept)
    return out


class BrowserUnavailableError(RuntimeError):
    """Chromium, playwright or the vendored Vega is missing (tests skip, or fail in CI)."""


@dataclass(frozen=True)
class Item:
    """One scenegraph item of a named mark, with page-pixel geometry.

    `x`/`y`/`width`/`height` are the item's bounds (stroke included) on the page; `cx`/`cy`
    is the centre of the part not clipped away by enclosing groups (where a click lands);
    `visible` is False when clipping hides all of it or its opacity is 0.
    """

    mark: str
    marktype: str
    datum: dict[str, Any]
    fill: Any
    stroke: Any
    text: Any
    font_weight: Any
    opacity: float | None
    fill_opacity: float | None
    x: float
    y: float
    width: float
    height: float
    cx: float
    cy: float
    visible: bool
    props: dict[str, Any] = field(default_factory=dict)  # other scalar item properties

    @property
    def center(self) -> tuple[float, float]:
        return (self.cx, self.cy)


@dataclass(frozen=True)
class Picked:
    """What Vega itself picked for a pointer event: the item's mark name ("" for none)."""

    mark: str
    datum: dict[str, Any]


Predicate = Callable[[Item], bool]


def parse_color(color: str) -> tuple[int, int, int]:
    """`"#rrggbb"`, `"#rgb"` or `"rgb(r, g, b)"` (what Vega and d3 write) as an RGB triple."""
    c = color.strip().lower()
    if c.startswith("#") and len(c) == 7:
        return (int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16))
    if c.startswith("#") and len(c) == 4:
        return (int(c[1] * 2, 16), int(c[2] * 2, 16), int(c[3] * 2, 16))
    m = re.fullmatch(r"rgba?\(\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*(?:,\s*[\d.]+\s*)?\)", c)
    if m:
        r, g, b = (round(float(v)) for v in m.groups())
        return (r, g, b)
    raise ValueError(f"not a colour Vega writes: {color!r}")


# The page side. `window.__mp` is the harness's handle; everything returns JSON-able values.
_HARNESS_JS = r"""
(() => {
  const state = {errors: [], warnings: [], view: null, events: [], lastMove: null};
  window.__mp = state;
  const fmt = (args) => args.map((a) => a instanceof Error ? (a.stack || String(a))
    : typeof a === 'string' ? a : JSON.stringify(a)).join(' ');
  const logger = {
    _level: vega.Warn,
    level(l) { if (arguments.length) { this._level = l; return this; } return this._level; },
    error(...a) { state.errors.push('vega error: ' + fmt(a)); return this; },
    warn(...a) { state.warnings.push('vega warning: ' + fmt(a)); return this; },
    info() { return this; },
    debug() { return this; },
  };

  // W&B's patches (CustomPanelRenderer + vegaSpecPatches), in W&B's order.
  const nullsToObjects = (v) => {
    if (v === null) return {};
    if (Array.isArray(v)) return v.map(nullsToObjects);
    if (typeof v === 'object') {
      const o = {};
      for (const k of Object.keys(v)) o[k] = nullsToObjects(v[k]);
      return o;
    }
    return v;
  };
  const lodashIsEmpty = (v) => {  // _.isEmpty: numbers and booleans count as empty too
    if (v == null) return true;
    if (Array.isArray(v) || typeof v === 'string') return v.length === 0;
    if (typeof v === 'object') return Object.keys(v).length === 0;
    return true;
  };
  const scaleToNull = (o) => {
    for (const k of Object.keys(o)) {
      if (k === 'scale' && lodashIsEmpty(o[k])) o[k] = null;
      else if (o[k] !== null && typeof o[k] === 'object') scaleToNull(o[k]);
    }
  };
  const deepFreeze = (o) => {
    Object.freeze(o);
    for (const v of Object.values(o)) {
      if (v !== null && typeof v === 'object' && !Object.isFrozen(v)) deepFreeze(v);
    }
    return o;
  };
  state.patch = (specText, width, height) => {
    const spec = nullsToObjects(JSON.parse(specText));
    scaleToNull(spec);
    spec.autosize = {type: 'fit', contains: 'padding'};
    spec.width = width;
    spec.height = height;
    return deepFreeze(spec);
  };

  const safe = (d) => {
    if (d === null || d === undefined) return {};
    if (typeof d !== 'object') return {value: d};
    const o = {};
    for (const k of Object.keys(d)) {
      const v = d[k];
      if (v === null || typeof v === 'string' || typeof v === 'boolean') o[k] = v;
      else if (typeof v === 'number') o[k] = Number.isFinite(v) ? v : String(v);
      else {
        try {
          const s = JSON.stringify(v);
          if (s !== undefined && s.length < 100000) o[k] = JSON.parse(s);
        } catch (e) { /* cyclic or exotic: left out */ }
      }
    }
    return o;
  };
  const pickedOf = (item) => ({
    mark: item && item.mark && item.mark.name ? item.mark.name : '',
    datum: item ? safe(item.datum) : {},
  });
  state.settle = async () => {
    if (state.view) await state.view.runAsync();
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  };

  state.open = async (specText, width, height, renderer, withRows, rows) => {
    try {
      const spec = state.patch(specText, width, height);
      const view = new vega.View(vega.parse(spec), {
        renderer, container: '#panel', hover: true, logger, logLevel: vega.Warn,
      });
      state.view = view;
      window.VIEW = view;  // as W&B does; handy in a debugger
      for (const type of ['click', 'dblclick', 'pointerdown', 'pointerup', 'wheel']) {
        view.addEventListener(type, (e, item) => { state.events.push({type, ...pickedOf(item)}); });
      }
      view.addEventListener('pointermove', (e, item) => { state.lastMove = pickedOf(item); });
      await view.runAsync();  // first render: W&B has no rows yet
      if (withRows) await state.setRows(JSON.parse(rows));
      await state.settle();
    } catch (e) {
      state.errors.push('open: ' + (e && e.stack ? e.stack : String(e)));
    }
  };
  // a view made elsewhere (the HTML report's own): listen as `open` does for its views
  state.attach = (view) => {
    state.view = view;
    for (const type of ['click', 'dblclick', 'pointerdown', 'pointerup', 'wheel']) {
      view.addEventListener(type, (e, item) => { state.events.push({type, ...pickedOf(item)}); });
    }
    view.addEventListener('pointermove', (e, item) => { state.lastMove = pickedOf(item); });
  };
  state.setRows = async (rows) => {
    state.view.change('wandb', vega.changeset().remove(vega.truthy).insert(rows));
    // react-vega (W&B's renderer) re-fits the view after every data update: `autosize` fit
    // is computed again for the rows' layout (without it the panel drew 1 px shorter here)
    state.view.resize();
    await state.view.runAsync();
  };

  const surface = () => document.querySelector('#panel > svg, #panel > canvas');
  const intersect = (a, b) => ({
    x1: Math.max(a.x1, b.x1), y1: Math.max(a.y1, b.y1),
    x2: Math.min(a.x2, b.x2), y2: Math.min(a.y2, b.y2),
  });
  const SKIP = new Set(['mark', 'datum', 'bounds', 'items', 'text', 'fill', 'stroke',
    'fontWeight', 'opacity', 'fillOpacity', '_svg', 'tooltip']);
  state.items = (name) => {
    const out = [];
    const view = state.view;
    const el = surface();
    if (!view || !el) return out;
    const rect = el.getBoundingClientRect();
    // the renderer draws at origin + padding (vega-view's `offset`), origin alone is [0, 0]
    const origin = view.origin();
    const pad = view.padding();
    const page = {x1: rect.left, y1: rect.top, x2: rect.right, y2: rect.bottom};
    const describe = (item, mark, ox, oy, clip) => {
      const b = item.bounds;
      const box = {x1: ox + b.x1, y1: oy + b.y1, x2: ox + b.x2, y2: oy + b.y2};
      const seen = intersect(box, clip);
      const props = {};
      for (const k of Object.keys(item)) {
        const v = item[k];
        if (!SKIP.has(k) && (typeof v === 'string' || typeof v === 'boolean'
            || (typeof v === 'number' && Number.isFinite(v)))) props[k] = v;
      }
      const shown = seen.x2 > seen.x1 && seen.y2 > seen.y1;
      return {
        mark: mark.name, marktype: mark.marktype, datum: safe(item.datum),
        fill: item.fill ?? null, stroke: item.stroke ?? null, text: item.text ?? null,
        font_weight: item.fontWeight ?? null, opacity: item.opacity ?? null,
        fill_opacity: item.fillOpacity ?? null,
        x: box.x1, y: box.y1, width: box.x2 - box.x1, height: box.y2 - box.y1,
        cx: shown ? (seen.x1 + seen.x2) / 2 : (box.x1 + box.x2) / 2,
        cy: shown ? (seen.y1 + seen.y2) / 2 : (box.y1 + box.y2) / 2,
        visible: shown && item.opacity !== 0, props,
      };
    };
    const walk = (mark, ox, oy, clip) => {
      for (const item of mark.items || []) {
        if (mark.name === name && item.bounds) out.push(describe(item, mark, ox, oy, clip));
        if (mark.marktype === 'group') {
          const gx = ox + (item.x || 0);
          const gy = oy + (item.y || 0);
          const c = item.clip === true
            ? intersect(clip, {x1: gx, y1: gy, x2: gx + (item.width || 0),
                               y2: gy + (item.height || 0)})
            : clip;
          for (const child of item.items || []) walk(child, gx, gy, c);
        }
      }
    };
    const x0 = rect.left + origin[0] + pad.left;
    walk(view.scenegraph().root, x0, rect.top + origin[1] + pad.top, page);
    return out;
  };
  state.pick = (x, y) => {
    const el = surface();
    if (el && el.tagName === 'CANVAS') {  // the canvas handler picks by geometry, as on events
      const h = state.view._handler;
      const r = el.getBoundingClientRect();
      const px = x - r.left - h._origin[0];
      const py = y - r.top - h._origin[1];
      return pickedOf(h.pick(state.view.scenegraph().root, px, py, px, py));
    }
    // SVG: the element under the point carries its item in __data__ (marks that are not
    // interactive get pointer-events: none, as Vega's own SVG handler sees them)
    let hit = document.elementFromPoint(x, y);
    while (hit && !(hit.__data__ && hit.__data__.mark)) hit = hit.parentElement;
    return pickedOf(hit ? hit.__data__ : null);
  };
})();
"""

_PAGE_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><style>
  html, body {{ margin: 0; padding: 0; background: #fff; }}
  #panel {{ position: absolute; left: {m}px; top: {m}px; width: {w}px; height: {h}px; }}
</style></head><body><div id="panel"></div></body></html>
"""


class Panel:
    """One W&B-like panel on its own page. Interactions wait until Vega has settled."""

    def __init__(self, context: Any, page: Any, blocked: list[str], console: list[str]) -> None:
        self._context = context
        self.page = page
        self._blocked = blocked
        self._console = console
        self._closed = False

    # ---- state -------------------------------------------------------------------------------
    def errors(self) -> list[str]:
        """What broke: Vega errors, page errors, console errors and blocked requests."""
        state = self.page.evaluate("() => __mp.errors")
        return [
            *state,
            *(c for c in self._console if not c.startswith("console warning")),
            *(f"request blocked: {u}" for u in self._blocked),
        ]

    def warnings(self) -> list[str]:
        """Vega's and the console's warnings (W&B runs Vega at log level Error and hides
        these, but they usually point at a real problem of the spec)."""
        state = self.page.evaluate("() => __mp.warnings")
        return [*state, *(c for c in self._console if c.startswith("console warning"))]

    def signal(self, name: str) -> Any:
        return self.page.evaluate("(n) => __mp.view.signal(n)", name)

    def set_signal(self, name: str, value: Any) -> None:
        self.page.evaluate("([n, v]) => __mp.view.signal(n, v)", [name, value])
        self.settle()

    def data(self, name: str) -> list[dict[str, Any]]:
        """The current tuples of a dataset (as the spec derived them)."""
        return list(
            self.page.evaluate("(n) => __mp.view.data(n).map((d) => ({...d}))", name)  # copies
        )

    def scale(self, name: str, value: Any) -> Any:
        """`scale(name, value)` as the spec's expressions would compute it (e.g. a colour)."""
        return self.page.evaluate("([n, v]) => __mp.view.scale(n)(v)", [name, value])

    def evaluate(self, js: str, arg: Any = None) -> Any:
        """Escape hatch: `js` is a function of (view, arg)."""
        return self.page.evaluate(f"([a]) => ({js})(__mp.view, a)", [arg])

    def set_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Replace the `wandb` rows, as W&B does when new data arrives."""
        # as JSON text: playwright's per-value serialisation takes seconds for 10,000 rows
        self.page.evaluate("(rows) => __mp.setRows(JSON.parse(rows))", json.dumps(stored(rows)))
        self.settle()

    def settle(self) -> None:
        self.page.evaluate("() => __mp.settle()")

    # ---- scenegraph --------------------------------------------------------------------------
    def items(self, mark: str, predicate: Predicate | None = None) -> list[Item]:
        """Every item of the marks named `mark` (all facets), in scenegraph order."""
        found = [Item(**raw) for raw in self.page.evaluate("(n) => __mp.items(n)", mark)]
        return [i for i in found if predicate is None or predicate(i)]

    def item(self, mark: str, predicate: Predicate | None = None) -> Item:
        """The first visible item of `mark` matching `predicate`; AssertionError if none."""
        for i in self.items(mark, predicate):
            if i.visible:
                return i
        raise AssertionError(f"no visible {mark!r} item matches; items: {self._brief(mark)}")

    def pick(self, x: float, y: float) -> Picked:
        """The item under page point (x, y), as pointer events would find it."""
        return Picked(**self.page.evaluate("([x, y]) => __mp.pick(x, y)", [x, y]))

    def _brief(self, mark: str) -> str:
        items = self.items(mark)
        return f"{len(items)} ({[i.datum for i in items[:5]]}{' ...' if len(items) > 5 else ''})"

    # ---- pointer -----------------------------------------------------------------------------
    def click(self, mark: str, predicate: Predicate | None = None, strict: bool = True) -> Picked:
        """Click the centre of the first visible matching item with the real mouse.

        With `strict`, the item Vega picked must belong to `mark` (a label drawn on top of a
        node would steal the click in W&B too)."""
        target = self.item(mark, predicate)
        picked = self.click_at(target.cx, target.cy)
        if strict and picked.mark != mark:
            raise AssertionError(
                f"clicked {mark!r} {target.datum} at ({target.cx:.0f}, {target.cy:.0f}) "
                f"but Vega picked {picked.mark or 'nothing'!r} {picked.datum}"
            )
        return picked

    def click_at(self, x: float, y: float) -> Picked:
        count = self.page.evaluate("() => __mp.events.length")
        self.page.mouse.click(x, y)
        self.settle()
        clicks = self.page.evaluate(
            "(n) => __mp.events.slice(n).filter((e) => e.type === 'click')", count
        )
        return (
            Picked(mark=clicks[-1]["mark"], datum=clicks[-1]["datum"]) if clicks else Picked("", {})
        )

    def hover(self, mark: str, predicate: Predicate | None = None) -> Picked:
        """Move the mouse onto the centre of the first visible matching item."""
        target = self.item(mark, predicate)
        return self.hover_at(target.cx, target.cy)

    def hover_at(self, x: float, y: float) -> Picked:
        self.page.mouse.move(x, y, steps=4)
        self.settle()
        last = self.page.evaluate("() => __mp.lastMove")
        return Picked(**last) if last else Picked("", {})

    def move_away(self) -> None:
        """Move the mouse off the panel (Vega sees pointerout / mouseout)."""
        self.page.mouse.move(1, 1, steps=4)
        self.settle()

    def drag(self, start: tuple[float, float], end: tuple[float, float], steps: int = 10) -> None:
        self.page.mouse.move(*start)
        self.page.mouse.down()
        self.page.mouse.move(*end, steps=steps)
        self.page.mouse.up()
        self.settle()

    def wheel(self, x: float, y: float, delta_y: float) -> None:
        self.page.mouse.move(x, y)
        self.page.mouse.wheel(0, delta_y)
        self.settle()

    def screenshot(self, path: str | os.PathLike[str]) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        self.page.locator("#panel").screenshot(path=str(out))
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._context.close()


class Report(Panel):
    """A report page (`Browser.open_report`): a Panel plus the URLs the page requested and the
    dialogs it opened (alert, confirm, ...), which a report must never do."""

    def __init__(
        self,
        context: Any,
        page: Any,
        blocked: list[str],
        console: list[str],
        requests: list[str],
        dialogs: list[str],
    ) -> None:
        super().__init__(context, page, blocked, console)
        self.requests = requests
        self.dialogs = dialogs


class Browser:
    """One Chromium for the whole session; every panel gets a fresh context and page."""

    def __init__(self, browser: Any, vega_js: str) -> None:
        self._browser = browser
        self._vega_js = vega_js
        self._panels: list[Panel] = []

    def open_panel(
        self,
        spec: Mapping[str, Any],
        rows: Sequence[Mapping[str, Any]] | None = (),
        width: int = 900,
        height: int = 600,
        renderer: str = "svg",
    ) -> Panel:
        """A panel of `width` x `height` showing `spec` with `rows` (None: rows never arrive,
        the panel stays as W&B shows it while loading; `()`: an empty table arrives)."""
        if renderer not in ("svg", "canvas"):
            raise ValueError(f"renderer must be 'svg' or 'canvas', got {renderer!r}")
        context, page, blocked, console = self._page(
            width + 2 * MARGIN_PX, height + 2 * MARGIN_PX, allowed=""
        )
        panel = Panel(context, page, blocked, console)
        self._panels.append(panel)
        page.set_content(_PAGE_HTML.format(m=MARGIN_PX, w=width, h=height))
        page.add_script_tag(content=self._vega_js)
        page.add_script_tag(content=_HARNESS_JS)
        # The spec travels as JSON text: W&B patches the parsed JSON, not a Python dict.
        page.evaluate(
            "([s, w, h, r, has, rows]) => __mp.open(s, w, h, r, has, rows)",
            [
                json.dumps(spec),
                width,
                height,
                renderer,
                rows is not None,
                json.dumps(stored(rows or [])),
            ],
        )
        return panel

    def open_report(
        self, path: str | os.PathLike[str], width: int = 1280, height: int = 860
    ) -> Report:
        """The HTML report at `path` (`wandb_modprof.sinks.report.html`) loaded from file:// in a
        window of `width` x `height`, as a Panel over the report's own Vega view
        (`window.__modprof_view`): every request except the file itself is aborted and reported
        as an error, and `requests` lists every URL the page asked for."""
        url = Path(path).resolve().as_uri()
        context, page, blocked, console = self._page(width, height, allowed=url)
        requests: list[str] = []
        dialogs: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.on("dialog", lambda d: (dialogs.append(f"{d.type}: {d.message}"), d.dismiss()))
        report = Report(context, page, blocked, console, requests, dialogs)
        self._panels.append(report)
        page.goto(url)
        page.wait_for_function("() => window.__modprof_ready || window.__modprof_error")
        # the harness's page side, over the report's view; the report exposes vegaEmbed only,
        # so the harness gets the one constant of `vega` it reads at start (vega.Warn = 2)
        page.add_script_tag(content="window.vega = window.vega || {Warn: 2};")
        page.add_script_tag(content=_HARNESS_JS)
        page.evaluate(
            "() => { if (window.__modprof_view) __mp.attach(window.__modprof_view); "
            "if (window.__modprof_error) __mp.errors.push(window.__modprof_error); }"
        )
        report.settle()
        return report

    def _page(self, width: int, height: int, allowed: str) -> tuple[Any, Any, list[str], list[str]]:
        """A fresh context and page of `width` x `height` where every request but `allowed`
        is aborted and recorded (`blocked`), and console errors / warnings and page errors
        are collected (`console`)."""
        context = self._browser.new_context(
            viewport={"width": width, "height": height}, device_scale_factor=1
        )
        blocked: list[str] = []
        console: list[str] = []

        def block(route: Any) -> None:
            if allowed and route.request.url == allowed:
                route.continue_()
            else:
                blocked.append(route.request.url)
                route.abort()

        context.route("**/*", block)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.on(
            "console",
            lambda m: (
                console.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        page.on("pageerror", lambda e: console.append(f"page error: {e}"))
        return context, page, blocked, console

    def close(self) -> None:
        for panel in self._panels:
            panel.close()
        self._panels.clear()
        self._browser.close()


@contextmanager
def launch(chromium: Path = CHROMIUM, vega_js: Path = VEGA_JS) -> Iterator[Browser]:
    """Start Chromium once (headless, no network) with the vendored Vega 5."""
    if not vega_js.is_file():
        raise BrowserUnavailableError(f"{vega_js} is missing: run `make vendor`")
    if not chromium.is_file():
        raise BrowserUnavailableError(f"{chromium} is missing: `apt-get install chromium`")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise BrowserUnavailableError("playwright is missing: pip install -e '.[dev]'") from None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=list(CHROMIUM_ARGS))
        wrapped = Browser(browser, vega_js.read_text("utf-8"))
        try:
            yield wrapped
        finally:
            wrapped.close()
