"""A training script for `test_run_endings.py`: watched into an offline run, it ends by an
exception, a Ctrl-C (SIGINT inside a sampled forward) or a SIGTERM (turned into `SystemExit`
by the script's own handler, as a job's preemption handler does), then calls `run.finish()`.
Prints the samples taken as JSON on its last line."""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
import wandb
from torch import nn

import wandb_modprof

ending, out, offload = sys.argv[1], sys.argv[2], sys.argv[3] == "worker"
run = wandb.init(mode="offline", project="modprof-test", dir=out, entity="me")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
handle = wandb_modprof.watch(
    model, log_freq=1, run=run, settings=wandb_modprof.Settings(offload=offload or False)
)
if ending == "sigterm":
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))


def interrupt(module: nn.Module, args: object) -> None:
    os.kill(os.getpid(), signal.SIGINT if ending == "ctrl-c" else signal.SIGTERM)


try:
    for step in range(40):
        if step == 30:
            if ending == "exception":
                raise RuntimeError("the data loader failed")
            model[2].register_forward_pre_hook(interrupt)  # inside the sampled forward
        model(torch.randn(8, 16)).pow(2).mean().backward()
        run.log({"loss": float(step)})
finally:
    samples = handle.profile().num_samples
    run.finish()
    print(json.dumps({"samples": samples}), flush=True)
