"""The pixel geometry after placement (see `wandb_modprof.view.layout`): the layer bands top
to bottom, and each edge's polyline. Takes the boxes, their layers, the oriented edges and
each placed edge's lane x (already shifted into the view); gives one point sequence per edge,
through its lane slots, ending at a port on the top of its destination box.

>>> simplify([(0.0, 0.0), (0.0, 5.0), (0.0, 10.0), (3.0, 10.0)])
((0.0, 0.0), (0.0, 10.0), (3.0, 10.0))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from wandb_modprof.view.geometry import LAYER_GAP_PX, MARGIN_PX, NodeBox, Point


@dataclass(frozen=True)
class Bands:
    """Per layer its band's top y and height (the tallest box in it), and the view's height."""

    top: list[float]
    height: list[float]
    view_h_px: float


def bands(layer: Sequence[int], sizes: Sequence[tuple[float, float]]) -> Bands:
    """One band per layer, LAYER_GAP_PX apart, inside a MARGIN_PX margin."""
    n_layers = max(layer) + 1
    band_h = [0.0] * n_layers
    for i, (_, h) in enumerate(sizes):
        band_h[layer[i]] = max(band_h[layer[i]], h)
    band_top = [0.0] * n_layers
    y = float(MARGIN_PX)
    for k in range(n_layers):
        band_top[k] = y
        y += band_h[k] + LAYER_GAP_PX
    return Bands(band_top, band_h, y - LAYER_GAP_PX + MARGIN_PX)


def _centre_top(box: NodeBox) -> Point:
    return box.x_px + box.w_px / 2, box.y_px


def _centre_bottom(box: NodeBox) -> Point:
    return box.x_px + box.w_px / 2, box.y_px + box.h_px


def route(
    edges: Sequence[tuple[int, int]],
    down: Sequence[tuple[int, int] | None],
    flipped: Sequence[bool],
    layer: Sequence[int],
    band: Bands,
    boxes: Sequence[NodeBox],
    lanes: Sequence[Sequence[float]],
) -> list[tuple[Point, ...]]:
    """The path of every edge (`edges[i]` as given, `down[i]` as placed, None: inside one
    layer); `lanes[j]` is the slot x per crossed layer of the j-th placed edge."""
    placed = [(i, e) for i, e in enumerate(down) if e is not None]
    port_x = _ports(placed, flipped, boxes, lanes)
    paths: list[tuple[Point, ...]] = [()] * len(edges)
    for j, (i, (u, v)) in enumerate(placed):
        (ux, uy), (vx, vy) = _centre_bottom(boxes[u]), _centre_top(boxes[v])
        vx = port_x.get(j, vx)
        a, b = layer[u], layer[v]
        pts = [(ux, uy), (ux, band.top[a] + band.height[a])]
        for k, dx in zip(range(a + 1, b), lanes[j], strict=True):
            x = round(dx, 2)
            pts += [(x, band.top[k]), (x, band.top[k] + band.height[k])]
        pts += [(vx, band.top[b]), (vx, vy)]
        paths[i] = simplify(pts[::-1] if flipped[i] else pts)
    for i, (s, d) in enumerate(edges):
        if down[i] is None:  # same layer: over the band, through the gap (or margin) above it
            k = layer[s]
            lane = band.top[k] - (LAYER_GAP_PX if k else MARGIN_PX) / 2
            (sx, sy), (dx, dy) = _centre_top(boxes[s]), _centre_top(boxes[d])
            paths[i] = simplify([(sx, sy), (sx, lane), (dx, lane), (dx, dy)])
    return paths


def _ports(
    placed: Sequence[tuple[int, tuple[int, int]]],
    flipped: Sequence[bool],
    boxes: Sequence[NodeBox],
    lanes: Sequence[Sequence[float]],
) -> dict[int, float]:
    """The x where each placed edge that runs with the flow ends on its destination's top.

    Edges into one box end at ports spread over its top, in the order they arrive from (left
    to right), so arrowheads do not pile up on one point and no two edges cross there."""
    arrivals: dict[int, list[tuple[float, int]]] = {}
    for j, (i, (u, v)) in enumerate(placed):
        if not flipped[i]:
            before = lanes[j][-1] if lanes[j] else _centre_bottom(boxes[u])[0]
            arrivals.setdefault(v, []).append((before, j))
    port_x: dict[int, float] = {}
    for v, incoming in arrivals.items():
        incoming.sort()
        box = boxes[v]
        for k, (_, j) in enumerate(incoming):
            port_x[j] = round(box.x_px + box.w_px * (0.15 + 0.7 * (k + 0.5) / len(incoming)), 2)
    return port_x


def simplify(points: list[Point]) -> tuple[Point, ...]:
    """Drop repeated points and the middle of three points on one vertical/horizontal line."""
    out: list[Point] = []
    for p in points:
        if out and out[-1] == p:
            continue
        if len(out) >= 2 and (out[-2][0] == out[-1][0] == p[0] or out[-2][1] == out[-1][1] == p[1]):
            out[-1] = p
        else:
            out.append(p)
    if len(out) == 1:  # src and dst touch (cannot happen with gaps > 0); keep two points
        out.append(out[0])
    return tuple(out)
