"""The README's main job: train a small real model on CPU under `watch` and show the profile."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any, TextIO

import torch

from wandb_modprof._errors import ModProfError
from wandb_modprof.api.profile import Profile
from wandb_modprof.api.watch import watch
from wandb_modprof.api.watch_handle import WatchHandle
from wandb_modprof.sinks.text.summary import mode_summary

# The demo's tables: (analysis mode, what its ranking says)
DEMO_MODES = (
    ("self", "Top modules by their own work (self time, forward + backward; no children)"),
    ("bwd", "Top module calls by backward time (inclusive: a container includes its children)"),
    ("act", "Top module calls by activation memory (inclusive)"),
)


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


class _Progress:
    """One `\\r`-redrawn bar on a terminal; one line per step otherwise (logs, CI, pipes)."""

    def __init__(self, steps: int, log_freq: int, out: TextIO) -> None:
        self.steps, self.log_freq, self.out = steps, log_freq, out
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self.samples = 0
        if self.tty:  # the first step (the structure pass) takes a while: show the bar now
            self._draw(0, "")

    def step(self, step: int, loss: float) -> None:
        # watch() spends the first training step on the structure pass (graph, FLOPs).
        # Steps log_freq, 2 * log_freq, ... are sampled; with log_freq=1 all but the first.
        sampled = step > 1 and step % self.log_freq == 0
        self.samples += sampled
        note = " (structure pass)" if step == 1 else " (sampled)" if sampled else ""
        if not self.tty:
            print(f"  step {step:3d}/{self.steps}  loss {loss:.4f}{note}", file=self.out)
            return
        self._draw(step, f"loss {loss:.4f}  ")
        if step == self.steps:
            self.out.write("\n")
            self.out.flush()

    def _draw(self, step: int, loss: str) -> None:
        width = 30
        done = width * step // self.steps
        bar = "#" * done + "-" * (width - done)
        elapsed = time.perf_counter() - self.start
        self.out.write(
            f"\r  [{bar}] {step}/{self.steps}  {loss}samples {self.samples}  {elapsed:5.1f} s "
        )
        self.out.flush()


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
    with warnings.catch_warnings():
        # The demo says itself, at the end, what an offline run without an entity gets.
        warnings.filterwarnings("ignore", message=r".*has no W&B entity.*")
        handle = watch(model, log_freq=log_freq, optimizer=optimizer, run=run)
    batch = torch.randint(0, vocab, (8, 128))
    n_params = sum(p.numel() for p in model.parameters())
    sampled = "every later step"
    if log_freq > 1:
        sampled = f"every {log_freq} steps (steps {log_freq}, {2 * log_freq}, ...)"
    print(
        f"Training GPT-2 ({n_params / 1e6:.1f} M parameters, random weights) on CPU for "
        f"{steps} steps; step 1 is wandb_modprof's structure pass, it samples {sampled}.",
        file=out,
        flush=True,
    )
    progress = _Progress(steps, log_freq, out)
    for step in range(1, steps + 1):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.log({"loss": loss.item()})  # wandb_modprof's logs join this row (commit=False)
        progress.step(step, loss.item())
    elapsed = time.perf_counter() - progress.start
    profile = handle.unwatch()
    print(f"Done in {elapsed:.1f} s.\n", file=out)
    _write_outputs(handle, profile, run, top, save, out)
    return 0


def _write_outputs(
    handle: WatchHandle, profile: Profile, run: Any, top: int, save: str, out: TextIO
) -> None:
    """The top modules, the profile file, the report, the trace, and where the W&B run went."""
    target = Path(save)
    target.parent.mkdir(parents=True, exist_ok=True)
    stem = target.name.split(".")[0]
    path = profile.save(target)
    data = profile.snapshot()
    # The tables `wandb-modprof summary PROFILE --mode M` prints, so the demo and the command
    # it suggests rank alike: `self` by each module's own work, `bwd` and `act` inclusive.
    for key, what in DEMO_MODES:
        print(f"{what}: `wandb-modprof summary {path} --mode {key}`", file=out)
        print(mode_summary(data, key, top), file=out)
    print(
        f"Profile written to {path} (load it with wandb_modprof.load({str(path)!r}); the tables "
        "above are `wandb-modprof summary` of it, one --mode each).",
        file=out,
    )
    html = profile.to_html(target.with_name(stem + ".html"))
    print(
        f"HTML report written to {html} (open it in a browser: the panel, offline, no server).",
        file=out,
    )
    trace = profile.export_chrome_trace(target.with_name(stem + ".trace.json"))
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
