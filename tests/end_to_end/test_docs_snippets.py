"""The Python snippets of README.md and docs/, run as a new user runs them: each fenced
```python block, copied into a script outside the package, in its own process, offline (W&B
offline, HF_HUB_OFFLINE=1), against small models.

A snippet names things it does not define (`model`, `loader`, `step()`): each case below gives
them in a prelude, makes the few substitutions a snippet needs to run here (listed, each must
match the snippet's text exactly) and checks what the page says happens. Every block must have a
case: a new snippet without one fails `test_every_snippet_has_a_case`, so none is left out
silently. A snippet shown on two pages (the README's quick start is also on Getting started)
must read the same on both, and runs once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DONE = "DOCS-SNIPPET-OK"


def pages() -> list[Path]:
    """README.md and every page of the documentation site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def snippets() -> list[tuple[str, str]]:
    """(page, code) of every fenced python block, in page order."""
    found = []
    for page in pages():
        text = page.read_text("utf-8")
        for code in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M):
            found.append((str(page.relative_to(ROOT)), code))
    return found


@dataclass(frozen=True)
class Case:
    marker: str  # a line of the snippet that identifies it
    prelude: str  # what the snippet expects to exist
    check: str  # runs after the snippet: what the page says happens
    substitutions: tuple[tuple[str, str], ...] = ()
    launcher: tuple[str, ...] = ()  # e.g. torchrun; default: python
    stderr_has: tuple[str, ...] = ()  # warnings the page promises
    warned_at: tuple[str, ...] = ()  # the snippet lines our warnings must point at
    needs: tuple[str, ...] = ()  # modules the snippet imports (dev extras)
    # timings compared across runs: run with the `accuracy` tests, serially, the cores to itself
    serial: bool = False


MLP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4, 8)
"""
TRAIN_LOOP = """for _ in range(200):
    loss = model(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
    run.log({"loss": loss.item()})"""
RESNET = """
import torch, wandb, wandb_modprof
from models import ResNet, resnet_input
torch.manual_seed(0)
model = ResNet()
x = resnet_input()
def step():
    model(x).sum().backward()
"""

CASES = {
    "quickstart": Case(
        marker="handle = wandb_modprof.watch(model, log_freq=100)",
        prelude=MLP,
        substitutions=(
            (
                "...                                                 # train as usual "
                "(run.log(...) as always)",
                TRAIN_LOOP,
            ),
        ),
        check="""
assert prof.num_samples == 2, prof.num_samples   # steps 100 and 200
assert "Top modules by forward time" in prof.summary()
run.finish()
""",
        # offline without an entity: the two-line notice of the panel page, at the watch() line
        stderr_has=("is offline and has no W&B entity", "wandb.init(entity=E) or WANDB_ENTITY=E"),
        warned_at=("handle = wandb_modprof.watch(",),
    ),
    "quickstart, a short run": Case(
        marker="handle = wandb_modprof.watch(model, log_freq=100)",
        prelude=MLP,
        substitutions=(
            (
                "...                                                 # train as usual "
                "(run.log(...) as always)",
                TRAIN_LOOP.replace("range(200)", "range(12)"),
            ),
        ),
        check="""
assert prof.num_samples == 0
run.finish()
""",
        stderr_has=(
            "UserWarning: wandb_modprof: Sequential was watched for 12 training step(s) with "
            "log_freq=100",
            "e.g. watch(model, log_freq=4).",
        ),
        warned_at=("handle = wandb_modprof.watch(", "prof = handle.unwatch()"),
    ),
    "what to checkpoint": Case(
        marker='plan = prof.checkpoint_plan("50%")                        # half of today\'s '
        "activation memory",
        prelude="""
import torch, wandb_modprof
from models import TinyGPT
torch.manual_seed(0)
model = TinyGPT()
batch = torch.randint(0, 64, (2, 16))
def loss_fn(out):
    return out.float().pow(2).mean()
""",
        # the page's table: realised within the plan's stated margin, and within the budget
        check="""
assert plan.calls and plan.predicted_activation_bytes <= plan.budget_bytes
assert abs(realised - plan.predicted_activation_bytes) <= plan.margin_bytes, realised
assert realised <= plan.budget_bytes + plan.margin_bytes
assert all("forward" not in m.__dict__ for m in model.modules())   # removed on exit
""",
    ),
    "a regression gate in a test suite": Case(
        marker="def test_no_module_got_slower():",
        # modules of known time (tests/phantom.py): the baseline is the same model, so the
        # gate passes; the same model with one module 6x slower must fail it (the gate's
        # sensitivity to a 1.5x change is tests/sinks/test_regression.py's). Serial: beside
        # the parallel suite the unchanged model's busy-waits slow down between its profiles
        serial=True,
        prelude="""
import os, torch, wandb_modprof
from torch import nn
from phantom import Cost, Phantom
class Weighted(Phantom):  # a parameter: its first sample is not taken for start-up
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
    def forward(self, x):
        return super().forward(x * self.scale)
build_model = Weighted
def example_batch():
    return torch.ones(4, requires_grad=True)
""",
        check="""
os.makedirs("perf", exist_ok=True)
profile_steps(build_model(), example_batch()).save("perf/base.modprof.json")
test_no_module_got_slower()
slow = build_model()
slow.plain.cells[0].cost = Cost(12.0, 18.0)
build_model = lambda: slow
try:
    test_no_module_got_slower()
except AssertionError as failed:
    # the cell (x6) counted among the offenders, not set aside as noise (its stage and the
    # model may or may not count: the cell is a small part of them, and their spread is wider)
    text = str(failed)
    offenders = text.split("in their medians but not in their fastest samples")[0]
    assert "FAILED: " in offenders and "plain.cells.0#0" in offenders, text
else:
    raise AssertionError("the slowed module passed the gate")
""",
    ),
    "one step, no W&B": Case(
        marker="with wandb_modprof.profile(model) as prof:\n    for _ in range(3):",
        prelude="",
        check="""
from pathlib import Path
assert prof.num_samples == 2, prof.num_samples   # the first and third forward; the second: FLOPs
assert "Top modules by forward time" in prof.summary()
assert wandb_modprof.load("run.modprof.json").num_samples == 2
assert Path("report.html").read_text().startswith("<!doctype html>")
import json
names = {e.get("name") for e in json.load(open("trace.json"))["traceEvents"]}
assert "0.forward" in names and "0.backward" in names, sorted(map(str, names))[:20]
""",
    ),
    "silence a warning": Case(
        marker='warnings.filterwarnings("ignore", message=r"wandb_modprof: run .* is offline")',
        prelude=MLP,
        # the filter must match the offline notice watch() gives (the quick start's case shows
        # it printed without the filter): no warning of ours may reach stderr
        check="""
import wandb, wandb_modprof
run = wandb.init(project="docs", mode="offline")
handle = wandb_modprof.watch(model, log_freq=100)
for _ in range(100):
    model(x).sum().backward()
assert handle.unwatch().num_samples == 1
run.finish()
""",
    ),
    "report and pictures": Case(
        marker='prof.to_html("profile.html", mode="bwd")',
        prelude=RESNET
        + """
def profiled(seed):
    torch.manual_seed(seed)
    m = ResNet()
    with wandb_modprof.profile(m) as p:
        for _ in range(2):
            m(x).sum().backward()
    return p
prof = a = profiled(0)
b = profiled(1)
run = wandb.init(project="readme", mode="offline")
""",
        check="""
from pathlib import Path
assert Path("profile.html").read_text().startswith("<!doctype html>")
assert "baseline" in Path("ab.html").read_text()
assert Path("layer2.svg").read_text().startswith("<svg")
assert png[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
files = Path(run.settings.files_dir)
run.finish()
assert len(list(files.rglob("modprof/graph_*.png"))) == 1
""",
    ),
    "Lightning": Case(
        marker="import lightning as L",
        needs=("lightning",),
        prelude="""
import torch
from torch.utils.data import DataLoader, TensorDataset
import lightning as L
class Lit(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
    def forward(self, x):
        return self.net(x)
    def training_step(self, batch, batch_idx):
        return self(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
lit_module = Lit()
loader = DataLoader(TensorDataset(torch.randn(48, 8)), batch_size=2)  # 24 batches: 12 steps
""",
        # Lightning's default is 1000 epochs; one epoch is the 12 optimizer steps of a try-out
        substitutions=(("accumulate_grad_batches=2,", "accumulate_grad_batches=2, max_epochs=1,"),),
        check="""
assert trainer.global_step == 12
callback = next(c for c in trainer.callbacks if isinstance(c, ModProfCallback))
assert callback.handle.steps == 12 and callback.handle.profile().num_samples == 0
""",
        # the integrations page: both at the user's fit() line, the fix named for Lightning
        stderr_has=(
            "WandbLogger(entity=E) or WANDB_ENTITY=E",
            "was watched for 12 optimizer step(s) with log_freq=100",
            "ModProfCallback(log_freq=4)",
        ),
        warned_at=("trainer.fit(lit_module, loader)",),
    ),
    "Hugging Face Trainer": Case(
        marker="from wandb_modprof.integrations.huggingface import ModProfCallback",
        needs=("transformers", "accelerate"),
        prelude="""
import torch
from transformers import Trainer, TrainingArguments
from models import gpt2_from_config
torch.manual_seed(0)
model = gpt2_from_config()
ds = [{"input_ids": row, "labels": row} for row in torch.randint(0, 512, (24, 16))]
""",
        check="",
        stderr_has=(
            "WANDB_ENTITY=E in the environment (report_to='wandb' reads it)",
            "optimizer step(s) with log_freq=100",
        ),
        warned_at=(".train()",),
    ),
    "torchrun": Case(
        marker='dist.init_process_group("gloo")',
        prelude="",
        launcher=("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
        check="""
assert prof.num_samples == 3, prof.num_samples   # steps 4, 8, 12 (1 is the structure pass)
""",
        warned_at=("handle = wandb_modprof.watch(ddp",),  # rank 0's offline notice
    ),
    "merged with torch.profiler": Case(
        marker='prof.export_chrome_trace("merged.json", torch_profiler=tp)',
        prelude=RESNET + "import torch.profiler\n",
        check="""
import json
names = {e.get("name") for e in json.load(open("merged.json"))["traceEvents"]}
assert "layer3.backward" in names and "layer3.forward" in names
assert any(str(n).startswith("autograd::engine::evaluate_function") for n in names)
""",
    ),
    "one module's backward": Case(
        marker="with wandb_modprof.on_module(model.layer3,",
        prelude=RESNET
        + """
from torch.profiler import ProfilerActivity
def train(steps):
    for _ in range(steps):
        step()
""",
        check="""
tp.export_chrome_trace("layer3.json")
import json
names = {e.get("name") for e in json.load(open("layer3.json"))["traceEvents"]}
assert any("ConvolutionBackward0" in str(n) for n in names), sorted(map(str, names))[:20]
assert not any("AddmmBackward0" in str(n) for n in names)  # the fc head is outside layer3
""",
    ),
}


def _snippet(case: Case) -> str:
    found = {code for _, code in snippets() if case.marker in code}
    assert len(found) == 1, f"{case.marker!r}: {len(found)} different snippets hold it"
    return found.pop()


def test_every_snippet_has_a_case():
    for page, text in snippets():
        assert any(case.marker in text for case in CASES.values()), (
            f"a python block of {page} has no case in {__file__}:\n{text}"
        )


def test_the_pages_hold_snippets():
    """The finder itself: the README's quick start and the reports page's snippets are found."""
    found = {page for page, _ in snippets()}
    assert {"README.md", "docs/getting-started.md", "docs/reports.md"} <= found, found


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.accuracy] if case.serial else [])
        for name, case in CASES.items()
    ],
)
def test_snippet_runs_as_documented(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    for module in case.needs:
        pytest.importorskip(module)
    code = _snippet(case)
    for old, new in case.substitutions:
        assert old in code, f"substitution {old!r} no longer matches the snippet"
        code = code.replace(old, new)
    # The snippet's own lines first (warnings name their line numbers), then the prelude is
    # run before them through a sitecustomize-free import: a module the script imports first.
    (tmp_path / "snippet_prelude.py").write_text(case.prelude, encoding="utf-8")
    script = tmp_path / "docs_snippet.py"
    script.write_text(
        "from snippet_prelude import *  # noqa: F403  (the snippet's free names)\n"
        + code
        + "\n"
        + case.check
        + f"\nprint({DONE!r})\n",
        encoding="utf-8",
    )
    env = dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    env.pop("WANDB_ENTITY", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path), str(TESTS), str(ROOT), env.get("PYTHONPATH", "")]
    )
    proc = subprocess.run(
        [sys.executable, *case.launcher, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert DONE in proc.stdout
    for text in case.stderr_has:
        assert text in proc.stderr, (text, proc.stderr[-4000:])
    # every warning of ours is reported at the user's line, never at ours or a framework's
    lines = script.read_text("utf-8").splitlines()
    expected = {n for n, line in enumerate(lines, 1) if any(t in line for t in case.warned_at)}
    # (a progress bar may share the warning's line: the path starts after its last "]")
    ours = re.findall(r"([^\s\]]+\.py):(\d+): \w*Warning: wandb_modprof", proc.stderr)
    assert bool(ours) == bool(case.warned_at), proc.stderr[-4000:]
    for path, line in ours:
        assert (path, int(line) in expected) == (str(script), True), (path, line, expected)
