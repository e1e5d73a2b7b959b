"""Render chosen views of real profiles' tables to PNG, to check the layout by eye and to show
it in the README.

    .venv/bin/python tools/render_layout.py --out docs/images

writes `layout_gpt2.png` (GPT-2 from a random-weight config: the top view, `transformer#0`,
`transformer.h.0#0`) and `layout_resnet.png` (`tests/models.py`'s ResNet: the top view,
`layer2#0`, `layer2.0#0`), each view side by side under its breadcrumb. Boxes are coloured by
backward time (`bwd_ms`) with the Turbo colormap, normalised over the view's nodes (red = most
expensive); inputs and outputs are grey; a node whose `bwd_ms` was not measured is white
with a dashed border. The SVG is ours; `vl-convert-python` turns it into PNG (no browser, no
system cairo). A tool, not part of the package: it reads only `prof.table().resolved()`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

import torch
import vl_convert

import wandb_modprof
from wandb_modprof.view.layout import CHAR_W_PX, FONT_PX, LINE_HEIGHT, SUBLABEL_FONT_PX

Record = dict[str, str | int | float | bool]
ROOT = Path(__file__).resolve().parent.parent
# vl-convert bundles Liberation Sans (Arial's metrics, ~0.48 em per glyph here): the layout's
# 0.62 em per character leaves room to spare, as it does for the browser's sans-serif.
FONT = "Liberation Sans, Arial, Helvetica, sans-serif"
GREY = (0xD9, 0xD9, 0xD9)  # inputs and outputs
CAPTION_FONT_PX = FONT_PX + 2
CAPTION_H_PX = 58  # breadcrumb line + colour bar + its min/max labels
VIEW_GAP_PX = 32
BAR_W_PX = 160

# Turbo, polynomial approximation by its author (Mikhail, Google AI blog, 2019): r, g, b as
# polynomials of degree 5 in x in [0, 1], coefficients from x^0 up.
_TURBO = (
    (0.13572138, 4.61539260, -42.66032258, 132.13108234, -152.94239396, 59.28637943),
    (0.09140261, 2.19418839, 4.84296658, -14.18503333, 4.27729857, 2.82956604),
    (0.10667330, 12.64194608, -60.58204836, 110.36276771, -89.90310912, 27.34824973),
)


def turbo(x: float) -> tuple[int, int, int]:
    x = min(1.0, max(0.0, x))
    r, g, b = (
        round(255 * min(1.0, max(0.0, sum(c * x**i for i, c in enumerate(cs))))) for cs in _TURBO
    )
    return r, g, b


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def text_colour(rgb: tuple[int, int, int]) -> str:
    """Black or white, whichever has the higher WCAG contrast ratio on `rgb`."""
    lin = [(c / 255) / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return "#000000" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#ffffff"


def _num(row: Record, column: str) -> float:
    value = row[column]
    assert isinstance(value, int | float), (column, value)
    return float(value)


def _bwd_ms(node: Record) -> float | None:
    """`bwd_ms` of a coloured node, or None when it is grey (input/output) or not measured."""
    missing = str(node["missing"])
    if node["node_kind"] in ("input", "output") or missing == "*":
        return None
    return None if "bwd_ms" in missing.split(",") else _num(node, "bwd_ms")


def render_view(rows: Sequence[Record], view_key: str, dx: float) -> tuple[str, float, float]:
    """One view as SVG elements shifted right by `dx`; returns (svg, width, height)."""
    # One piece: the SVG is written in drawing order (frame, edges, boxes, labels) in one pass.
    nodes = [r for r in rows if r["row_kind"] == "node" and r["view_key"] == view_key]
    edges = [r for r in rows if r["row_kind"] == "edge" and r["view_key"] == view_key]
    if not nodes:
        raise SystemExit(
            f"view {view_key!r} is not in the table; views: "
            f"{sorted({str(r['view_key']) for r in rows if r['row_kind'] == 'node'})}"
        )
    w, h = _num(nodes[0], "view_w_px"), _num(nodes[0], "view_h_px")
    costs = [c for c in map(_bwd_ms, nodes) if c is not None]
    lo, hi = (min(costs), max(costs)) if costs else (0.0, 0.0)
    out = [f'<g transform="translate({dx:.1f},0)">']
    # the breadcrumbs, as the panel finds them: the views whose subtree holds this one
    views = [r for r in rows if r["row_kind"] == "view"]
    now = next(int(r["view_id"]) for r in views if r["view_key"] == view_key)
    path = [r for r in views if int(r["view_id"]) <= now <= int(r["view_last"])]
    caption = " / ".join(str(r["label"]) for r in sorted(path, key=lambda r: int(r["view_id"])))
    out.append(
        f'<text x="0" y="16" font-size="{CAPTION_FONT_PX}" font-weight="bold">'
        f"{escape(caption)}</text>"
    )
    out.append(f'<rect x="0" y="26" width="{BAR_W_PX}" height="10" fill="url(#turbo)"/>')
    out.append(f'<text x="0" y="50" font-size="{SUBLABEL_FONT_PX}">bwd {lo:.3f} ms</text>')
    out.append(
        f'<text x="{BAR_W_PX}" y="50" font-size="{SUBLABEL_FONT_PX}" '
        f'text-anchor="end">{hi:.3f} ms</text>'
    )
    out.append(f'<g transform="translate(0,{CAPTION_H_PX})">')
    out.append(f'<rect width="{w}" height="{h}" fill="#ffffff" stroke="#eeeeee"/>')
    for node in nodes:
        x, y, bw, bh = (_num(node, c) for c in ("x_px", "y_px", "w_px", "h_px"))
        cost = _bwd_ms(node)
        dash = ""
        if node["node_kind"] in ("input", "output"):
            rgb = GREY
        elif cost is None:
            rgb, dash = (255, 255, 255), ' stroke-dasharray="4 3"'
        else:
            rgb = turbo((cost - lo) / (hi - lo) if hi > lo else 0.5)
        out.append(
            f'<rect x="{x}" y="{y}" width="{bw}" height="{bh}" rx="4" '
            f'fill="{_hex(rgb)}" stroke="#444444"{dash}/>'
        )
        # Two line boxes of LINE_HEIGHT each, centred as a block: baselines sit ~0.8 em down.
        top = y + (bh - (FONT_PX + SUBLABEL_FONT_PX) * LINE_HEIGHT) / 2
        base1 = top + FONT_PX * LINE_HEIGHT * 0.8
        base2 = top + FONT_PX * LINE_HEIGHT + SUBLABEL_FONT_PX * LINE_HEIGHT * 0.8
        fg = text_colour(rgb)
        out.append(
            f'<text x="{x + bw / 2}" y="{base1:.1f}" font-size="{FONT_PX}" fill="{fg}" '
            f'text-anchor="middle">{escape(str(node["label"]))}</text>'
        )
        out.append(
            f'<text x="{x + bw / 2}" y="{base2:.1f}" font-size="{SUBLABEL_FONT_PX}" '
            f'fill="{fg}" text-anchor="middle">{escape(str(node["sublabel"]))}</text>'
        )
    for edge in edges:
        out.append(
            f'<path d="{escape(str(edge["edge_path"]))}" fill="none" stroke="#333333" '
            'stroke-width="1.2" marker-end="url(#arrow)"/>'
        )
    out.append("</g></g>")
    caption_w = len(caption) * CHAR_W_PX * CAPTION_FONT_PX / FONT_PX  # the layout's estimate
    return "\n".join(out), max(w, BAR_W_PX, caption_w), h + CAPTION_H_PX


def render(table: Sequence[Record], view_keys: Sequence[str]) -> str:
    """The chosen views side by side, as one SVG document."""
    parts, x, height = [], 0.0, 0.0
    for key in view_keys:
        svg, w, h = render_view(table, key, x)
        parts.append(svg)
        x, height = x + w + VIEW_GAP_PX, max(height, h)
    width = x - VIEW_GAP_PX
    stops = "".join(
        f'<stop offset="{i / 16:.4f}" stop-color="{_hex(turbo(i / 16))}"/>' for i in range(17)
    )
    pad = 16
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 2 * pad:.0f}" '
        f'height="{height + 2 * pad:.0f}" font-family="{FONT}">\n'
        f'<defs><linearGradient id="turbo">{stops}</linearGradient>'
        '<marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="8" '
        'markerHeight="8" orient="auto"><path d="M0,0L8,4L0,8z" fill="#333333"/></marker>'
        "</defs>\n"
        f'<rect width="100%" height="100%" fill="#ffffff"/>\n'
        f'<g transform="translate({pad},{pad})">\n' + "\n".join(parts) + "\n</g></svg>\n"
    )


def profile_table(model: torch.nn.Module, step: Callable[[], torch.Tensor]) -> list[Record]:
    """Three training steps inside `profile` (the first is the untimed structure pass)."""
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            step().backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
    return prof.table().resolved()


def gpt2_table() -> list[Record]:
    os.environ["HF_HUB_OFFLINE"] = "1"  # a config, random weights: nothing to download
    import transformers

    config = transformers.GPT2Config(
        vocab_size=2048, n_positions=128, n_embd=256, n_layer=4, n_head=4
    )
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, config.vocab_size, (4, 64))
    # A copy for `labels`: one tensor passed as two arguments cannot be told apart, and the
    # top view would show input_ids feeding the loss and labels feeding the transformer.
    labels = ids.clone()
    return profile_table(model, lambda: model(input_ids=ids, labels=labels).loss)


def resnet_table() -> list[Record]:
    sys.path.insert(0, str(ROOT / "tests"))
    from models import ResNet, resnet_input  # type: ignore[import-not-found]  # tests/, above

    model, x = ResNet().train(), resnet_input(8, 32)
    return profile_table(model, lambda: model(x).sum())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--svg", action="store_true", help="also keep the SVG beside each PNG")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    jobs = {
        "gpt2": (gpt2_table, ["transformer#0", "transformer.h.0#0"]),
        "resnet": (resnet_table, ["layer2#0", "layer2.0#0"]),
    }
    for name, (build, views) in jobs.items():
        table = build()
        root = next(str(r["meta_value"]) for r in table if r["meta_key"] == "root_view")
        svg = render(table, [root, *views])
        if args.svg:
            (args.out / f"layout_{name}.svg").write_text(svg)
        path = args.out / f"layout_{name}.png"
        path.write_bytes(vl_convert.svg_to_png(svg, scale=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
