"""Pictures of models whose names XML forbids: vl-convert aborts the whole process (a Rust panic,
exit 134) on such a character in the SVG it renders, so each case runs in a subprocess, where
an abort is a failed test instead of a dead pytest. The names are shown escaped, not dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vl_convert")

# Each: a module registered under the name (directly in `_modules`, as `add_module` refuses some),
# of a class whose name (the module type) holds the character too; drawn, saved, loaded, drawn.
SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    import torch
    from torch import nn
    import wandb_modprof

    names = json.loads(sys.argv[1])
    out = sys.argv[2]
    warnings.simplefilter("error")  # a dropped sample would warn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    for name in names:
        model._modules[name] = nn.Linear(4, 4)
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            model(torch.randn(3, 4)).sum().backward()
    assert prof.snapshot().num_samples == 1, prof.snapshot().num_samples
    prof.to_svg(out + ".svg")
    assert prof.to_png()[:8] == b"\\x89PNG\\r\\n\\x1a\\n"

    # a valid file whose model name and module types hold the characters
    def retype(node):
        if isinstance(node, dict):
            if node.get("module_type") == "Linear":
                node["module_type"] = "T" + names[0]
            if "model_name" in node:
                node["model_name"] = "M" + names[0]
            return {k: retype(v) for k, v in node.items()}
        return [retype(v) for v in node] if isinstance(node, list) else node

    from wandb_modprof.sinks.file.profile_file import save_profile

    # (version 7's layout, an object per record, which `retype` walks; version 8 reads the same)
    saved = save_profile(prof.snapshot(), out + ".modprof.json", version=7)
    with open(saved, encoding="utf-8") as f:
        data = retype(json.load(f))
    with open(out + ".typed.modprof.json", "w", encoding="utf-8") as f:
        json.dump(data, f)  # ensure_ascii: a lone surrogate is written as its escape
    loaded = wandb_modprof.load(out + ".typed.modprof.json")
    # tall enough for every node's type line (none is drawn under 9 px)
    loaded.to_svg(out + ".typed.svg", height=2400)
    assert loaded.to_png()[:4] == b"\\x89PNG"
    print("ok")
    """
)

CASES = {
    "controls": ["a\x1bb", "a\x00b", "a\x01b", "a\x08b", "a\x0bb"],
    "noncharacters": ["a\ufffeb", "a\uffffb"],
    "surrogate": ["a\ud800b"],
}


@pytest.mark.parametrize("case", CASES)
def test_pictures_of_names_xml_forbids_show_them_escaped(case: str, tmp_path: Path) -> None:
    names = CASES[case]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(names), str(tmp_path / "p")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, PYTHONIOENCODING="utf-8"),
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.strip() == "ok"
    svg = (tmp_path / "p.svg").read_text(encoding="utf-8")
    typed = (tmp_path / "p.typed.svg").read_text(encoding="utf-8")
    shown = [_escaped(name) for name in names]
    for name, text in zip(names, shown, strict=True):
        assert text in svg, (text, case)  # a node label or the top list: the name, escaped
        assert name not in svg
    assert f">M{shown[0]}<" in typed  # the model name, drawn whole
    assert ">Ta\\" in typed and "T" + names[0] not in typed  # the type (cut to fit its node)


def _escaped(name: str) -> str:
    """`a?b` as drawn: the middle character as its escape, written here independently."""
    code = ord(name[1])
    return f"a\\x{code:02x}b" if code < 0x100 else f"a\\u{code:04x}b"
