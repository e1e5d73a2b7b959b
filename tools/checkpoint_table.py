"""The table of docs/checkpointing.md: what a checkpoint plan predicts against what the planned
model realises, on CPU (bytes, not time: the speed benchmarks are in benchmarks/).

Run (a few seconds; ``--quick``: one model, one budget):

    .venv/bin/python tools/checkpoint_table.py [--quick]

Method: each model (TinyGPT, a stack of MLP blocks and the test ResNet from tests/models.py, as
`tests/api/checkpoint_runs.py` builds them, and a two-layer GPT-2 from its transformers config)
is profiled for an untimed step and two timed ones, planned at 75, 50 and 25 % of its
activation memory (`Profile.checkpoint_plan`), the plan applied (`apply_checkpoint_plan`), and
one timed step profiled again: the root call's `act_bytes` then is the realised activation
memory. Printed as the Markdown table of docs/checkpointing.md, with the date, machine and
torch version. Step times are not compared: on a shared CPU they vary by several times.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "api")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from checkpoint_runs import MODELS, profiled, realised  # noqa: E402
from models import gpt2_from_config  # noqa: E402

import wandb_modprof  # noqa: E402

BUDGETS = ("75%", "50%", "25%")


class _Logits(torch.nn.Module):
    """GPT-2 returning its logits, so the runs' loss (`checkpoint_runs.loss`) applies; no
    KV cache, as in training (a call given one is not checkpointed)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = gpt2_from_config()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.gpt(input_ids=ids, use_cache=False).logits  # training: no KV cache


def _models(quick: bool) -> dict[str, object]:
    models = dict(MODELS)
    models["gpt2_from_config"] = lambda: (_Logits(), torch.randint(0, 512, (4, 64)))
    return {"TinyGPT": models["TinyGPT"]} if quick else models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one model, one budget")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, "
        f"`.venv/bin/python tools/checkpoint_table.py`\n"
    )
    print("| model | budget | today (B) | predicted (B) | realised (B) | error | margin (B) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, make in _models(args.quick).items():
        for budget in BUDGETS[:1] if args.quick else BUDGETS:
            torch.manual_seed(0)
            model, x = make()  # type: ignore[operator]
            plan = profiled(model, x).checkpoint_plan(budget)
            with wandb_modprof.apply_checkpoint_plan(model, plan):
                got = realised(model, x)
            error = got - plan.predicted_activation_bytes
            share = 100 * error / plan.predicted_activation_bytes
            shown = "0" if error == 0 else f"{error:+,} ({share:+.2f} %)"
            print(
                f"| {name} | {budget.replace('%', ' %')} | {plan.activation_bytes_now:,} | "
                f"{plan.predicted_activation_bytes:,} | {got:,} | {shown} | "
                f"{plan.margin_bytes:,} |"
            )
            if abs(error) > plan.margin_bytes:
                raise SystemExit(f"{name} {budget}: realised outside the plan's margin")


if __name__ == "__main__":
    main()
