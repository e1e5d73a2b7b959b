"""The README's main job: train a small real model on CPU under `watch` and show the profile."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, TextIO

import torch

from ._errors import ModProfError
from ._watch import watch


def _gpt2(layers: int, dim: int) -> tuple[torch.nn.Module, int]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from a config: nothing to download
    try:
        import transformers
    except ImportError:
        raise ModProfError(
            "the demo trains GPT-2 from Hugging Face transformers, which is not installed; "
            "install it with: pip install 'wandb-modprof[demo]'"
        ) from None
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    config = transformers.GPT2Config(
        vocab_size=2048, n_positions=128, n_embd=dim, n_layer=layers, n_head=4
    )
    return transformers.GPT2LMHeadModel(config), config.vocab_size


def _wandb_run(directory: Path) -> Any:
    """An offline W&B run in `directory` (WANDB_MODE, when set, decides instead)."""
    import wandb

    directory.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(silent=True, console="off")
    if os.environ.get("WANDB_MODE"):
        return wandb.init(project="wandb-modprof-demo", dir=str(directory), settings=settings)
    return wandb.init(
        mode="offline", project="wandb-modprof-demo", dir=str(directory), settings=settings
    )


def run_demo(steps: int, log_freq: int, top: int, save: str, out: TextIO) -> int:
    torch.manual_seed(0)
    model, vocab = _gpt2(layers=4, dim=256)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = _wandb_run(Path(save).parent)
    try:
        return _train(model, vocab, optimizer, run, steps, log_freq, top, save, out)
    finally:
        run.finish()


def _train(
    model: torch.nn.Module,
    vocab: int,
    optimizer: torch.optim.Optimizer,
    run: Any,
    steps: int,
    log_freq: int,
    top: int,
    save: str,
    out: TextIO,
) -> int:
    handle = watch(model, log_freq=log_freq, optimizer=optimizer, run=run)
    batch = torch.randint(0, vocab, (8, 128))
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"Training GPT-2 ({n_params / 1e6:.1f} M parameters, random weights) on CPU for "
        f"{steps} steps; wandb_modprof samples every {log_freq}th step.",
        file=out,
    )
    start = time.perf_counter()
    for step in range(1, steps + 1):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.log({"loss": loss.item()})  # wandb_modprof's logs join this row (commit=False)
        # watch() spends the first training step on the structure pass (graph, FLOPs).
        sampled = " (structure pass)" if step == 1 else ""
        sampled = sampled or (" (sampled)" if step % log_freq == 0 else "")
        print(f"  step {step:3d}/{steps}  loss {loss.item():.4f}{sampled}", file=out)
    elapsed = time.perf_counter() - start
    profile = handle.unwatch()
    print(f"Done in {elapsed:.1f} s.\n", file=out)
    print(profile.summary(n=top), file=out)
    Path(save).parent.mkdir(parents=True, exist_ok=True)
    path = profile.save(save)
    table = profile.table()
    print(
        f"Profile written to {path} ({len(table.rows)} table rows; "
        f"load it with wandb_modprof.load({str(path)!r})).",
        file=out,
    )
    trace = profile.export_chrome_trace(
        Path(save).with_name(Path(save).name.split(".")[0] + ".trace.json")
    )
    print(
        f"Trace of the last sampled step written to {trace} (open it in ui.perfetto.dev).", file=out
    )
    if run.offline:
        where = run.settings.sync_dir
        if handle.chart is None:
            then = "Tables only: the run has no W&B entity; set WANDB_ENTITY to get the panel."
        else:
            entity = handle.chart.split("/")[0]
            then = f"First, once: wandb-modprof register-chart --entity {entity}"
        print(
            f"W&B offline run ({handle.key}) written to {where}; upload it with "
            f"`wandb sync {where}`. {then}",
            file=out,
        )
    elif not run.disabled:
        print(f"W&B run: {run.url}", file=out)
    return 0
