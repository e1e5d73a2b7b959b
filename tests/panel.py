"""Shared by the panel tests: tables of real profiles, W&B's row decoration and spec patches, a
reference Turbo colormap, and a walk over vl-convert's scenegraph."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from models import MoEStack, ResNet, TinyGPT, gpt2_from_config, moe_input

import wandb_modprof
from wandb_modprof.view.table import ProfileTable


def resnet_table(steps: int = 3, seed: int = 0, **table_kw: Any) -> ProfileTable:
    torch.manual_seed(seed)
    model = ResNet()
    x = torch.randn(2, 3, 32, 32)
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            model(x).sum().backward()
    return prof.table(**table_kw)


def gpt_table(steps: int = 3, seed: int = 0) -> ProfileTable:
    torch.manual_seed(seed)
    model = TinyGPT()
    tokens = torch.randint(0, 64, (2, 16))
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            model(tokens).sum().backward()
    return prof.table()


def gpt2_profile(layers: int = 4, steps: int = 3) -> wandb_modprof.Profile:
    """A GPT-2 from transformers' config (random weights), its language-model loss."""
    torch.manual_seed(0)
    model = gpt2_from_config(layers=layers)
    ids = torch.randint(0, 512, (2, 64))
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
    return prof


def moe_profile(steps: int = 2) -> wandb_modprof.Profile:
    """`tests/models.py`'s MoEStack (2 layers of 128 experts), every expert of the first hit."""
    torch.manual_seed(0)
    model = MoEStack()
    x = moe_input(model)
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            model(x).square().mean().backward()
    return prof


def records(table: ProfileTable) -> list[dict[str, Any]]:
    """The rows with their refs resolved (full keys to compare with); whatever feeds them to
    the spec strips those again (`browser.stored`)."""
    return table.resolved()


def as_run(rows: list[dict[str, Any]], run_id: str, name: str, index: int) -> list[dict[str, Any]]:
    """The rows as W&B hands them to a spec when several runs are visible: with the run's
    `id`, `name`, `color` and `_defaultColorIndex` added to every row."""
    palette = ["rgb(83, 135, 221)", "rgb(229, 116, 57)", "rgb(71, 176, 123)"]
    extra = {"id": run_id, "name": name, "color": palette[index % 3], "_defaultColorIndex": index}
    return [{**row, **extra} for row in rows]


def wandb_patched(spec: dict[str, Any], width: int, height: int) -> dict[str, Any]:
    """What W&B does to a spec before rendering it (its panel code, vegaSpecPatches): every
    JSON null value becomes {} (then an empty `scale` goes back to null), autosize is forced
    to fit, and react-vega sets the top-level size from the panel."""

    def patch(value: Any, key: str = "") -> Any:
        if value is None:
            return {}
        if isinstance(value, dict):
            out = {k: patch(v, k) for k, v in value.items()}
            if "scale" in out and out["scale"] == {}:
                out["scale"] = None
            return out
        if isinstance(value, list):
            return [patch(v) for v in value]
        return value

    patched: dict[str, Any] = patch(json.loads(json.dumps(spec)))
    patched["autosize"] = {"type": "fit", "contains": "padding"}
    patched["width"] = width
    patched["height"] = height
    return patched


# ---- Turbo -----------------------------------------------------------------------------------
def turbo(t: float) -> tuple[int, int, int]:
    """Google's Turbo colormap, polynomial fit as published with d3-scale-chromatic
    (interpolateTurbo); Vega samples the same map into a palette, so compare with a tolerance."""
    t = max(0.0, min(1.0, t))

    def channel(value: float) -> int:
        return max(0, min(255, round(value)))

    r = 34.61 + t * (1172.33 - t * (10793.56 - t * (33300.12 - t * (38394.49 - t * 14825.05))))
    g = 23.31 + t * (557.33 + t * (1225.33 - t * (3574.96 - t * (1073.77 + t * 707.56))))
    b = 27.2 + t * (3211.1 - t * (15327.97 - t * (27814 - t * (22569.18 - t * 6838.66))))
    return channel(r), channel(g), channel(b)


def vega_turbo(ts: Sequence[float]) -> list[str]:
    """Vega's own Turbo colours at `ts`, from a minimal spec (one scale, no wandb_modprof code):
    the exact reference for what the panel's fills must be."""
    import vl_convert as vlc

    spec = {
        "$schema": "https://vega.github.io/schema/vega/v5.json",
        "data": [{"name": "t", "values": [{"t": t, "i": i} for i, t in enumerate(ts)]}],
        "scales": [{"name": "c", "type": "linear", "domain": [0, 1], "range": {"scheme": "turbo"}}],
        "marks": [
            {
                "type": "text",
                "name": "probe",
                "from": {"data": "t"},
                "encode": {"update": {"text": {"signal": "scale('c', datum.t)"}}},
            }
        ],
    }
    return texts(vlc.vega_to_scenegraph(spec), "probe")


def parse_color(text: str) -> tuple[int, int, int]:
    text = text.strip()
    if text.startswith("#") and len(text) == 7:
        return int(text[1:3], 16), int(text[3:5], 16), int(text[5:7], 16)
    match = re.fullmatch(r"rgb\((\d+),\s*(\d+),\s*(\d+)\)", text)
    if match is None:
        raise ValueError(f"not a colour: {text!r}")
    r, g, b = (int(v) for v in match.groups())
    return r, g, b


def color_distance(a: str | tuple[int, int, int], b: str | tuple[int, int, int]) -> int:
    ca = parse_color(a) if isinstance(a, str) else a
    cb = parse_color(b) if isinstance(b, str) else b
    return max(abs(x - y) for x, y in zip(ca, cb, strict=True))


def normalised(values: Sequence[float], scale: str) -> list[float]:
    """Where each value sits between the view's min and max (what the spec must compute)."""
    if scale == "log":
        positive = [v for v in values if v > 0]
        lo, hi = min(positive), max(positive)
        if hi <= lo:
            return [1.0 if v > 0 else 0.0 for v in values]
        return [
            0.0 if v <= 0 else (math.log(max(v, lo)) - math.log(lo)) / (math.log(hi) - math.log(lo))
            for v in values
        ]
    lo, hi = min(values), max(values)
    return [1.0 if hi <= lo else (v - lo) / (hi - lo) for v in values]


# ---- scenegraph ------------------------------------------------------------------------------
def marks(scene: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """All items of the marks called `name` in a vl-convert scenegraph, in drawing order."""
    out: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("name") == name and "marktype" in node:
                out.extend(node.get("items", []))
            for item in node.get("items", []):
                walk(item)

    walk(scene["scenegraph"])
    return out


def texts(scene: dict[str, Any], name: str) -> list[str]:
    return [str(item.get("text", "")) for item in marks(scene, name)]


# ---- the ranked list's names -----------------------------------------------------------------
def ranked_names(entries: Sequence[tuple[str, str]], chars: int = 16) -> list[str]:
    """The names the ranked list shows for its `entries` ((module name, node key), in rank
    order), computed here as `tools/spec/ranked.py` (`top`) describes them: the end of the
    name within `chars` characters, cut at a dot, where that tells the entry apart from the
    others listed; else its shortest unique dotted suffix (an index with its container's name
    before it), up to `chars + 4` characters, a longer one keeping the part that differs and
    the name's end; entries of one module (called twice) get their call ("enc #1")."""
    most = chars + 4

    def cut(tail: str) -> str:
        dot = tail.find(".")
        return tail[dot + 1 :] if 0 <= dot < len(tail) - 1 else tail

    splits = [name.split(".") for name, _ in entries]
    count = Counter(".".join(p[-d:]) for p in splits for d in range(1, len(p) + 1))
    out = []
    for (name, key), parts in zip(entries, splits, strict=True):
        n = len(parts)
        suffixes = {d: ".".join(parts[-d:]) for d in range(1, n + 1)}
        fit = max(
            (d for d, s in suffixes.items() if len(s) < chars or (d == n and len(name) <= chars)),
            default=0,
        )
        uniq = min((d for d, s in suffixes.items() if count[s] == 1), default=n)
        need = uniq + 1 if uniq < n and re.fullmatch("[0-9]+", parts[n - uniq]) else uniq
        lead = "…" if need < n else ""
        head, rest = ".".join(parts[n - need : n - uniq + 1]), ".".join(parts[n - uniq + 1 :])
        room = most - len(head) - 1
        rest_tail = rest[-max(1, room) :]
        end = (
            rest
            if len(rest) <= room
            else cut(rest_tail)
            if 2 * len(cut(rest_tail)) >= room
            else rest_tail
        )
        if len(name) <= chars:
            shown = name
        elif need <= fit or (fit == 0 and need == 1):
            shown = "…" + cut(name[-chars:])
        elif len(suffixes[need]) <= most:
            shown = lead + suffixes[need]
        elif rest == "":
            shown = "…" + head[-(most - 1) :]
        elif room >= 3:
            shown = lead + head + "…" + end
        else:
            shown = "…" + head[-(most - 2) :] + "…"
        out.append(shown + (" #" + key.rsplit("#", 1)[1] if count[name] > 1 else ""))
    return out
