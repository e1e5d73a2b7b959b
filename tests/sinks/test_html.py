"""The HTML report and the pictures without a browser: page structure, escaping, errors,
to_svg / to_png, and the report logged to W&B at unwatch() (test_report_browser.py runs the
page in Chromium)."""

from __future__ import annotations

import html
import json
import os
import re
import struct
import warnings
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch
import wandb
from helpers import disabled_run, profiled, reused_layer_profile, run_double, train_step
from models import ResNet, TinyGPT, gpt_input, resnet_input
from torch import nn

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.sinks.report import html as _html
from wandb_modprof.sinks.report.html import ROWS_ID, SPEC_ID, report_html, script_json, write_report

XSS = "</script><img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def resnet() -> wandb_modprof.Profile:
    torch.manual_seed(0)
    return profiled(ResNet(), resnet_input())


@pytest.fixture(scope="module")
def gpt() -> wandb_modprof.Profile:
    torch.manual_seed(0)
    return profiled(TinyGPT(), gpt_input())


class _Page(HTMLParser):
    """Tags, attributes and text of a page; script contents by element id."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: dict[str, str] = {}
        self.text: list[str] = []
        self._script: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._script = dict(attrs).get("id") or f"#{len(self.scripts)}"
            self.scripts[self._script] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self.scripts[self._script] += data
        else:
            self.text.append(data)


# ---- the page ----------------------------------------------------------------------------------
def test_page_holds_the_spec_the_rows_and_vega_and_nothing_external(
    resnet: wandb_modprof.Profile,
) -> None:
    text = report_html([("resnet", resnet)], mode="act", scale="log")
    page = _Page(text)
    assert [t for t, _ in page.tags if t in ("img", "link", "iframe", "object", "embed")] == []
    for tag, attrs in page.tags:
        assert "src" not in attrs and "href" not in attrs, (tag, attrs)
    scripts = [a for t, a in page.tags if t == "script"]
    assert [a.get("type") for a in scripts] == ["application/json"] * 2 + ["module"] * 2
    body = " ".join(page.text)
    assert "http://" not in body and "https://" not in body
    assert "ResNet" in body and "How to read it" in body and wandb_modprof.__version__ in body

    spec = json.loads(page.scripts[SPEC_ID])
    signals = {s["name"]: s for s in spec["signals"]}
    assert signals["mode"]["value"] == "act" and signals["scale_type"]["value"] == "log"
    assert signals["compare"]["value"] is False
    assert "$schema" not in spec and spec["autosize"] == {"type": "fit", "contains": "padding"}
    assert {"name": "wandb"} in spec["data"]  # filled in by the page, not here
    rows = json.loads(page.scripts[ROWS_ID])
    table = resnet.table()
    assert rows["columns"] == list(table.columns)
    assert [tuple(r) for r in rows["data"]] == list(table.rows)
    boot = list(page.scripts.values())[-1]
    assert "window.__modprof_view = view" in boot and "addEventListener('resize'" in boot
    vega = list(page.scripts.values())[-2]
    assert vega == _html.vega_bundle() and "vegaEmbed" in vega and len(vega) > 300_000


def test_vega_bundle_is_cached_and_cannot_close_its_script() -> None:
    bundle = _html.vega_bundle()
    assert _html.vega_bundle() is bundle
    lowered = bundle.lower()
    assert "</script" not in lowered and "<!--" not in lowered and "<script" not in lowered


def test_vega_bundle_is_bundled_once_per_version_and_read_back_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vl_convert

    from wandb_modprof.sinks.report import vega_bundle as bundles

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bundles.vega_bundle.cache_clear()
    first = bundles.vega_bundle()
    (cached,) = (tmp_path / "wandb_modprof" / "vega").glob("bundle-*.js")
    assert cached.read_text(encoding="utf-8") == first

    def no_bundler(snippet: str) -> str:
        raise AssertionError("bundled again although the cache holds it")

    monkeypatch.setattr(vl_convert, "javascript_bundle", no_bundler)
    bundles.vega_bundle.cache_clear()  # a fresh process: the file, not the bundler
    assert bundles.vega_bundle() == first
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached.write_text("half a bun", encoding="utf-8")  # a damaged file is bundled again
    bundles.vega_bundle.cache_clear()
    try:
        assert bundles.vega_bundle() == first
        assert cached.read_text(encoding="utf-8") == first
    finally:
        bundles.vega_bundle.cache_clear()


def test_script_json_escapes_what_html_would_read() -> None:
    value = {"a": "</script><!-- & \u2028\u2029 >", "µ": [1.5, True]}
    text = script_json(value)
    for bad in ("<", ">", "&", "\u2028", "\u2029"):
        assert bad not in text
    assert json.loads(text) == value


def test_hostile_names_are_text(tmp_path: Path) -> None:
    class Hostile(nn.Linear):
        pass

    Hostile.__name__ = Hostile.__qualname__ = XSS
    model = nn.Sequential(nn.Linear(4, 4))
    model.add_module(XSS, Hostile(4, 4))
    prof = profiled(model, torch.randn(2, 4))
    text = report_html([(XSS, prof)], title=XSS)
    assert "<img" not in text.replace(_html.vega_bundle(), "")
    page = _Page(text)
    assert [t for t, _ in page.tags if t == "img"] == []
    assert XSS in " ".join(page.text)  # the title, as text
    rows = json.loads(page.scripts[ROWS_ID])
    records = [dict(zip(rows["columns"], r, strict=True)) for r in rows["data"]]
    # stored relative to the view: the root view's own child keeps its full name
    assert any(r["name_ref"] == XSS and r["module_type"] == XSS for r in records)
    wrapped = resnet_like = prof._repr_html_()
    assert resnet_like.startswith('<iframe srcdoc="') and 'sandbox="allow-scripts"' in wrapped
    assert "<script" not in wrapped and "<img" not in wrapped


def test_several_profiles_are_runs_and_compare_starts_with_the_second(
    resnet: wandb_modprof.Profile, gpt: wandb_modprof.Profile
) -> None:
    page = _Page(report_html([("base", resnet), ("new", gpt)], compare=True))
    rows = json.loads(page.scripts[ROWS_ID])
    assert rows["columns"][-2:] == ["id", "name"]
    runs = {(r[-2], r[-1]) for r in rows["data"]}
    assert runs == {("0", "base"), ("1", "new")}
    signals = {s["name"]: s.get("value") for s in json.loads(page.scripts[SPEC_ID])["signals"]}
    assert (signals["compare"], signals["run_pick"], signals["baseline_pick"]) == (True, "1", "0")
    many = _Page(report_html([(f"r{i}", resnet) for i in range(11)]))
    ids = {r[-2] for r in json.loads(many.scripts[ROWS_ID])["data"]}
    assert sorted(ids) == [f"{i:02d}" for i in range(11)]  # sorted as strings = given order
    plain = _Page(report_html([("base", resnet), ("new", gpt)]))
    signals = {s["name"]: s.get("value") for s in json.loads(plain.scripts[SPEC_ID])["signals"]}
    assert (signals["compare"], signals["run_pick"]) == (False, "0")


def test_a_profile_without_samples_still_gives_a_page(tmp_path: Path) -> None:
    path = wandb_modprof.Profile("Empty").to_html(tmp_path / "empty.html")
    page = _Page(path.read_text("utf-8"))
    assert "no samples" in " ".join(page.text)
    assert json.loads(page.scripts[ROWS_ID])["data"]  # the meta rows


def test_to_html_writes_and_repr_html_wraps_the_report(
    resnet: wandb_modprof.Profile, tmp_path: Path
) -> None:
    path = resnet.to_html(tmp_path / "r.html", mode="bwd", title="My run")
    assert path == tmp_path / "r.html"
    page = _Page(path.read_text("utf-8"))
    assert "My run" in " ".join(page.text)
    wrapped = resnet._repr_html_()
    inner = html.unescape(wrapped.split('srcdoc="', 1)[1].split('" sandbox=', 1)[0])
    assert inner.startswith("<!doctype html>") and "__modprof_view" in inner
    assert 'style="width: 100%; height: 650px' in wrapped
    assert len(wrapped) < 2_500_000  # Vega (~0.9 MB) and a small table, escaped


# ---- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"mode": "speed"}, "mode expected one of 'fwd', 'bwd'"),
        ({"scale": "sqrt"}, "scale expected one of 'linear', 'log'; got 'sqrt'"),
        ({"compare": True}, "compare=True expected at least two profiles (baseline, compared)"),
        ({"compare": "yes"}, "compare must be True or False; got 'yes'"),
        ({"title": 3}, "title expected a str or None; got int"),
    ],
)
def test_bad_options_are_clear_errors(
    resnet: wandb_modprof.Profile, kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ModProfError, match=message.replace("(", r"\(").replace(")", r"\)")):
        report_html([("r", resnet)], **kw)


def test_bad_profiles_are_clear_errors(resnet: wandb_modprof.Profile) -> None:
    with pytest.raises(ModProfError, match="expected at least one"):
        report_html([])
    with pytest.raises(ModProfError, match=r"expected \(label: str, Profile\) pairs; item 0"):
        report_html([resnet])  # type: ignore[list-item]
    with pytest.raises(ModProfError, match="expected a sequence of"):
        report_html(resnet)  # type: ignore[arg-type]


def test_unwritable_paths_are_clear_errors(resnet: wandb_modprof.Profile, tmp_path: Path) -> None:
    with pytest.raises(ModProfError, match=r"cannot write .*: directory .* does not exist"):
        resnet.to_html(tmp_path / "missing" / "r.html")
    with pytest.raises(ModProfError, match="it is a directory"):
        resnet.to_html(tmp_path)
    with pytest.raises(ModProfError, match="to_svg\\(\\) cannot write"):
        resnet.to_svg(tmp_path / "missing" / "r.svg")
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ModProfError, match="permission denied"):
            write_report(locked / "r.html", [("r", resnet)])


# ---- pictures ----------------------------------------------------------------------------------
def test_to_svg_draws_the_chosen_view(resnet: wandb_modprof.Profile, tmp_path: Path) -> None:
    svg = resnet.to_svg(tmp_path / "root.svg", mode="bwd")
    assert svg.startswith("<svg") and (tmp_path / "root.svg").read_text("utf-8") == svg
    assert 'width="1100" height="640"' in svg
    records = resnet.table().resolved()

    def labels(view: str) -> list[str]:
        return [
            str(r["label"]) for r in records if r["row_kind"] == "node" and r["view_key"] == view
        ]

    assert {"conv1", "layer1", "layer2", "avgpool"} <= set(labels("<root>#0"))
    for label in labels("<root>#0"):
        assert f">{label}</text>" in svg, label
    inner = resnet.to_svg(view="layer2", width=800, height=500)  # a module name: its first call
    assert 'width="800" height="500"' in inner
    for label in labels("layer2#0"):
        assert f">{html.escape(label)}</text>" in inner, label
    same = resnet.to_svg(view="layer2#0", width=800, height=500)
    ids = re.compile(r"(clip|gradient_)\d+")  # vl-convert numbers these per process
    assert ids.sub("", same) == ids.sub("", inner)


def test_pictures_carry_no_interactive_hints(resnet: wandb_modprof.Profile) -> None:
    # the interactive panel has them (so hiding them below is not vacuous) ...
    page_spec = json.dumps(_html.report_spec())
    for hint in ("ANALYSIS MODE (click)", "drag to pan", '"Fit"'):
        assert hint in page_spec
    # ... a static picture has none: no pan/zoom hint, no Fit button, no "(click)"
    svg = resnet.to_svg(width=1100, height=640)
    assert "drag to pan" not in svg and "(click)" not in svg and ">Fit</text>" not in svg
    assert ">ANALYSIS MODE</text>" in svg and ">conv1</text>" in svg  # the rest is drawn


def test_to_png_has_the_requested_size(resnet: wandb_modprof.Profile, tmp_path: Path) -> None:
    png = resnet.to_png(tmp_path / "p.png", mode="act", width=600, height=400, scale_factor=1.5)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (900, 600)
    assert (tmp_path / "p.png").read_bytes() == png


def test_to_wandb_image_logs_the_picture_to_an_offline_run(
    resnet: wandb_modprof.Profile, tmp_path: Path
) -> None:
    # wandb.Image refuses PNG bytes (it wants a path, PIL image or array) and needs Pillow for
    # any picture: the documented use is prof.to_wandb_image(), logged as an image file.
    image = resnet.to_wandb_image(mode="bwd", width=500, height=300, scale_factor=1.0, caption="c")
    assert isinstance(image, wandb.Image)
    assert (image._width, image._height) == (500, 300)
    run = wandb.init(project="picture", dir=str(tmp_path), mode="offline")
    try:
        run.log({"modprof/graph": image})
    finally:
        run.finish()
    files = list(Path(run.settings.files_dir).rglob("modprof/graph_*.png"))
    assert len(files) == 1
    assert struct.unpack(">II", files[0].read_bytes()[16:24]) == (500, 300)
    with pytest.raises(ModProfError, match="caption expected a str"):
        resnet.to_wandb_image(caption=3)  # type: ignore[arg-type]


def test_picture_options_are_checked(resnet: wandb_modprof.Profile) -> None:
    with pytest.raises(
        ModProfError, match=r"view expected one of the drawn views of ResNet \("
    ) as e:
        resnet.to_svg(view="layer9")
    assert "'<root>#0', 'layer1#0'" in str(e.value) and "got 'layer9'" in str(e.value)
    with pytest.raises(ModProfError, match="mode expected one of"):
        resnet.to_png(mode="nope")
    with pytest.raises(ModProfError, match="width expected an int from 100"):
        resnet.to_svg(width=10)
    with pytest.raises(ModProfError, match="scale_factor expected a number"):
        resnet.to_png(scale_factor=0)


# ---- W&B: the report at unwatch() --------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:wandb_modprof. run .* is offline")
def test_unwatch_logs_the_report_to_an_offline_run(tmp_path: Path) -> None:
    run = wandb.init(project="report", dir=str(tmp_path), mode="offline")
    model = TinyGPT()
    x = gpt_input()
    handle = wandb_modprof.watch(model, log_freq=2, run=run)
    for _ in range(5):
        train_step(model, x)
    prof = handle.unwatch()
    run.log({"loss": 1.0})
    run.finish()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    files = sorted((run_dir / "files" / "media" / "html").rglob("*.html"))
    assert [f.relative_to(run_dir / "files" / "media" / "html").parts[:2] for f in files] == [
        ("modprof", "TinyGPT")
    ]
    assert files[0].name.startswith("report_")
    page = _Page(files[0].read_text("utf-8"))
    assert "vegaEmbed" in list(page.scripts.values())[-2]  # Vega inlined
    rows = json.loads(page.scripts[ROWS_ID])
    assert [tuple(r) for r in rows["data"]] == list(prof.table().rows)
    assert [t for t, a in page.tags if t == "link" or "src" in a] == []  # inject=False


def _recorder() -> Any:
    """A `run_double` whose `log` keeps each dict in `.logged` (and checks commit=False)."""
    run = run_double()
    run.logged = []

    def log(data: dict[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        assert commit is False
        run.logged.append(data)

    run.log.side_effect = log
    return run


def test_the_report_joins_the_last_log_and_disabled_runs_skip_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = _recorder()
    model = TinyGPT()
    handle = wandb_modprof.watch(model, log_freq=2, run=run, structure=False)
    for _ in range(4):
        train_step(model, gpt_input())
    handle.unwatch()
    assert [sorted(k for k in d if k.endswith("/report")) for d in run.logged] == [
        [],
        ["modprof/TinyGPT/report"],
    ]
    assert "modprof/TinyGPT" in run.logged[-1]  # with the last sample
    assert isinstance(run.logged[-1]["modprof/TinyGPT/report"], wandb.Html)
    # and the profile file as an artifact, once (a fake without log_artifact only warned)
    ((artifact,), _) = run.log_artifact.call_args
    assert run.log_artifact.call_count == 1 and artifact.type == "modprof-profile"

    def fail(*args: Any, **kw: Any) -> str:
        raise AssertionError("no report is built for a disabled run")

    monkeypatch.setattr(_html, "tables_html", fail)
    real = disabled_run()
    handle = wandb_modprof.watch(model, log_freq=1, run=real, structure=False)
    train_step(model, gpt_input())
    handle.unwatch()
    assert "modprof/TinyGPT/report" not in dict(real.summary)


def test_a_failing_report_warns_once_and_the_sample_is_still_logged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kw: Any) -> str:
        raise RuntimeError("no bundle")

    monkeypatch.setattr(_html, "tables_html", broken)
    run = _recorder()
    model = TinyGPT()
    handle = wandb_modprof.watch(model, log_freq=1, run=run, structure=False)
    train_step(model, gpt_input())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle.unwatch()
    messages = [str(w.message) for w in caught if "wandb_modprof" in str(w.message)]
    assert len(messages) == 1 and "RuntimeError: no bundle" in messages[0]
    assert "modprof/TinyGPT" in run.logged[-1] and "modprof/TinyGPT/report" not in run.logged[-1]


def test_the_page_is_rendered_from_the_package_templates(gpt: wandb_modprof.Profile) -> None:
    from importlib import resources

    folder = resources.files("wandb_modprof.sinks.report") / "templates"
    boot = (folder / "report.js").read_text("utf-8")
    assert f"read('{SPEC_ID}')" in boot and f"read('{ROWS_ID}')" in boot
    text = report_html([("gpt", gpt)])
    assert f"<style>\n{(folder / 'report.css').read_text('utf-8')}</style>" in text
    assert list(_Page(text).scripts.values())[-1] == "\n" + boot


def test_the_header_writes_numbers_as_units_does(gpt: wandb_modprof.Profile) -> None:
    from test_summary import with_big_values

    text = report_html([("gpt", with_big_values(gpt.snapshot()))])
    totals = text.split('<table class="totals">', 1)[1].split("</table>", 1)[0]
    cells = re.findall(r"<td>(.*?)</td>", totals)
    assert cells[1] == "1000 ms" and cells[3] == "2.5 TiB" and cells[4] == "2.5 TiB", cells


def test_undecodable_text_is_written_as_replacement_characters(tmp_path) -> None:
    prof = reused_layer_profile()
    path = prof.to_html(tmp_path / "r.html", title="bad\udcffname")  # a non-UTF-8 argv byte
    text = path.read_text("utf-8")
    assert "bad\ufffdname" in text and len(text) > 100_000
