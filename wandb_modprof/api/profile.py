"""The profile users hold: the reading API over a `ProfileAccumulator` (running statistics per
module call, the last sample, the structure passes), with the sinks as convenience methods.

Every sink takes a frozen `ProfileData` (`snapshot()`), never this class; `load` reads a saved
one back (`api/profile_load.py`).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wandb_modprof._errors import ModProfError
from wandb_modprof.records.modes import DEFAULT_MODE, DEFAULT_SCALE
from wandb_modprof.records.sample import METRICS, InvocationRecord, ModuleStats, Sample
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.sinks.text.summary import format_summary
from wandb_modprof.stats.accumulator import ProfileAccumulator

if TYPE_CHECKING:
    from wandb_modprof.records.calls import Structure
    from wandb_modprof.records.checkpoint import CheckpointPlan
    from wandb_modprof.view.table import ProfileTable


class Profile:
    """Per-module measurements of the sampled steps.

    `invocations()` returns the records of the last sample (one per module call);
    `stats()` the running statistics (count, mean, std, min, max, last) of every metric per
    call key across all samples.

    Examples:
        >>> with wandb_modprof.profile(model) as prof:          # doctest: +SKIP
        ...     model(x).sum().backward()
        >>> print(prof.summary())                                # doctest: +SKIP
        >>> prof.invocations()[0].bwd_ms                         # doctest: +SKIP
    """

    def __init__(self, model_name: str, accumulator: ProfileAccumulator | None = None) -> None:
        self.model_name = model_name
        self._acc = accumulator if accumulator is not None else ProfileAccumulator(model_name)

    @classmethod
    def from_data(cls, data: ProfileData) -> Profile:
        """A read-only profile holding `data` (what `wandb_modprof.load` returns)."""
        return cls(data.model_name, ProfileAccumulator.restored(data))

    @property
    def accumulator(self) -> ProfileAccumulator:
        """The live statistics this profile reads (what the capture and `watch` feed)."""
        return self._acc

    def snapshot(self) -> ProfileData:
        """Every sample resolved (waiting for the device if needed), frozen: what sinks take."""
        self._acc.resolve_pending(force=True)
        return self._acc.snapshot()

    # ---- public --------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Number of sampled steps folded into the statistics."""
        self._acc.resolve_pending(force=True)
        return self._acc.num_samples

    @property
    def last_sample(self) -> Sample | None:
        self._acc.resolve_pending(force=True)
        return self._acc.last

    def invocations(self) -> list[InvocationRecord]:
        """Records of the most recent sample, in forward order (parents before children)."""
        sample = self.last_sample
        return [] if sample is None else list(sample.invocations)

    def stats(self) -> dict[str, ModuleStats]:
        """Running statistics per call key, in forward order of their last sample."""
        self._acc.resolve_pending(force=True)
        return self._acc.stats()

    def structures(self) -> list[Structure]:
        """The captured structure passes (call tree, dataflow edges, FLOPs), oldest first: one
        per distinct sequence of module calls seen."""
        return list(self._acc.structures())

    @property
    def flops_unknown(self) -> int:
        """How many module calls that ran have no FLOP count (`CallInfo.flops_known` False):
        no structure pass ran them (a route first taken past the cap of graphs, a module no
        pass and no identical list member counted; every call with `structure=False`). Their
        table rows list the FLOP columns in `missing`. 0 when every call was counted."""
        from wandb_modprof.view.graphs import merge
        from wandb_modprof.view.meta import calls_without_flops

        data = self.snapshot()
        return calls_without_flops(merge(data.structures, data.stats.values()), data.stats)

    def top(
        self, metric: str = "bwd_self_ms", n: int = 10, include_root: bool = False
    ) -> list[ModuleStats]:
        """The `n` call keys with the largest `metric`: its median over the samples (the mean
        for a profile read from a version-1 file; `RunningStat.typical`)."""
        if metric not in METRICS:
            raise ModProfError(f"metric must be one of {', '.join(METRICS)}; got {metric!r}")
        if not isinstance(n, int) or n < 1:
            raise ModProfError(f"n must be a positive int; got {n!r}")
        rows = [
            s
            for s in self.stats().values()
            if s.typical(metric) is not None and (include_root or s.parent_key is not None)
        ]
        rows.sort(key=lambda s: s.typical(metric) or 0.0, reverse=True)
        return rows[:n]

    def checkpoint_plan(self, budget: int | float | str) -> CheckpointPlan:
        """The modules to checkpoint so that activation memory fits `budget` at the least
        recompute time: `budget` in bytes (int), as a share of today's (float in (0, 1]) or
        a percentage ("50%"). `wandb_modprof.apply_checkpoint_plan` applies the result; how
        bytes and times are predicted: `wandb_modprof.view.checkpoint_plan`.

        Examples:
            >>> plan = prof.checkpoint_plan("50%")                     # doctest: +SKIP
            >>> plan.module_names, plan.predicted_activation_bytes     # doctest: +SKIP
            (('blocks.0', 'blocks.1.mlp'), 531456)
        """
        from wandb_modprof.view.checkpoint_plan import checkpoint_plan

        return checkpoint_plan(self.snapshot(), budget)

    def summary(self, n: int = 10) -> str:
        """A terminal table of the top modules by forward, backward and activation memory."""
        from wandb_modprof.view.graphs import merge
        from wandb_modprof.view.regions import regions

        data = self.snapshot()
        return format_summary(data, n, regions(merge(data.structures, data.stats.values())))

    def step_phases(self) -> dict[str, float]:
        """Where the sampled steps' time goes around the modules: phase name -> median ms
        over the samples, in step order ("between" steps, "forward", "loss", "backward",
        "optimizer"; `docs/measurement.md`). A phase that was not measured is left out; why:
        `snapshot().phases.unmeasured`."""
        phases = self.snapshot().phases
        return dict(phases.median_ms) if phases is not None else {}

    def to_dict(self) -> dict[str, Any]:
        """Plain builtins: model name, sample count, last sample's records, and statistics."""
        sample = self.last_sample
        return {
            "model_name": self.model_name,
            "num_samples": self._acc.num_samples,
            "invocations": [] if sample is None else [r.to_dict() for r in sample.invocations],
            "stats": {
                key: {
                    "module_name": s.module_name,
                    "module_type": s.module_type,
                    "parent_key": s.parent_key,
                    "metrics": {m: asdict(st) for m, st in s.metrics.items()},
                }
                for key, s in self.stats().items()
            },
        }

    def table(
        self, max_rows: int = 10_000, checkpoint_budget: int | float | str | None = "50%"
    ) -> ProfileTable:
        """The flat table every view draws: view / node / edge / meta rows, at most `max_rows`.
        `checkpoint_budget`: the checkpoint plan its "Checkpoint value" mode shows (as
        `checkpoint_plan` takes it; None: no plan). Like every table, it prices checkpointing
        itself only where this process measured that already (`checkpoint_plan()` does);
        otherwise its plan says "checkpointing not priced". It takes no measurement itself, so
        it equals the table `watch` logged of the same profile.

        Examples:
            >>> table = prof.table()                                      # doctest: +SKIP
            >>> [r for r in table.records() if r["row_kind"] == "meta"]  # doctest: +SKIP
        """
        from wandb_modprof.stats.quiet_gc import paused_gc
        from wandb_modprof.view.checkpoint_cells import check_budget
        from wandb_modprof.view.table import build_table

        if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 100:
            raise ModProfError(f"max_rows must be an int >= 100; got {max_rows!r}")
        budget = check_budget(checkpoint_budget, "Profile.table(checkpoint_budget=...)")
        with paused_gc():  # many short-lived rows, no cycles (`stats/quiet_gc.py`)
            return build_table(self.snapshot(), max_rows, checkpoint_budget=budget)

    def export_chrome_trace(self, path: str | os.PathLike[str], torch_profiler: Any = None) -> Path:
        """Write the last sample as a Chrome / Perfetto trace: a `<module>.forward` span per
        call on the forward thread, `<module>.backward` spans on the thread(s) that ran its
        autograd nodes (one span per stretch of consecutive nodes; they nest), and the nodes.

        With `torch_profiler=` (a finished `torch.profiler.profile`, or its exported trace
        file) that recorded the sampled step, the result is the profiler's trace with the
        module spans added on its clock, above its ops and kernels: `layer3.backward` contains
        exactly the `evaluate_function` events of layer3's autograd nodes.

        Examples:
            >>> prof.export_chrome_trace("modules.json")           # open in ui.perfetto.dev
            PosixPath('modules.json')
        """
        from wandb_modprof.sinks.traces.trace import (
            load_profiler_trace,
            merged_trace,
            standalone_trace,
            write_trace,
        )

        sample = self.last_sample
        if sample is None:
            raise ModProfError(
                "export_chrome_trace() needs a sample; none was taken yet (watch samples every "
                "log_freq-th training step; a profile block times its forwards after `warmup`, "
                "all but the untimed structure pass)"
            )
        if torch_profiler is None:
            trace = standalone_trace(sample, self.model_name)
        else:
            trace = merged_trace(sample, self.model_name, load_profiler_trace(torch_profiler))
        return write_trace(trace, path)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile to a versioned JSON file (`*.modprof.json`); `load` reads it back.

        Examples:
            >>> prof.save("run.modprof.json")                     # doctest: +SKIP
            >>> wandb_modprof.load("run.modprof.json").summary()  # doctest: +SKIP
        """
        from wandb_modprof.sinks.file.profile_file import save_profile
        from wandb_modprof.sinks.files import check_path

        return save_profile(self.snapshot(), check_path(path, "save()"))

    # ---- the HTML report and pictures (`sinks.report.html`, `sinks.report.images`) -------------
    def to_html(
        self,
        path: str | os.PathLike[str],
        *,
        mode: str = DEFAULT_MODE,
        scale: str = DEFAULT_SCALE,
        title: str | None = None,
        checkpoint_budget: int | float | str | None = "50%",
    ) -> Path:
        """Write the panel as one self-contained HTML file (Vega inlined: opens from disk with
        no network; every click, hover, drag and zoom of the panel works).

        `mode` / `scale` set how it opens (`records.modes.MODE_KEYS`, "linear" / "log"); a profile
        without samples gives a page saying so. `checkpoint_budget`: the plan its "Checkpoint
        value" mode shows (as `checkpoint_plan` takes it; None: no plan). See
        `wandb_modprof.sinks.report.html.report_html` for several profiles and compare mode.

        Examples:
            >>> prof.to_html("profile.html", mode="bwd")           # doctest: +SKIP
            PosixPath('profile.html')
        """
        from wandb_modprof.sinks.report.html import write_report

        return write_report(
            path,
            [(self.model_name, self.snapshot())],
            mode=mode,
            scale=scale,
            title=title,
            checkpoint_budget=checkpoint_budget,
        )

    def _repr_html_(self) -> str:
        """Jupyter: the report in a sandboxed `<iframe srcdoc>` (scripts run without trusting
        the notebook), 650 px high; about 1 MB (Vega) plus the table."""
        from wandb_modprof.sinks.report.html import iframe_html, report_html

        return iframe_html(report_html([(self.model_name, self.snapshot())]))

    def to_svg(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        mode: str = DEFAULT_MODE,
        scale: str = DEFAULT_SCALE,
        view: str | None = None,
        width: int = 1100,
        height: int = 640,
    ) -> str:
        """The panel as SVG text (written to `path` too when given), rendered without a
        browser: opened at `mode`, `scale` and `view` (a view key such as "layer2#0", or a
        module name for its first call; default the model's top view).

        Examples:
            >>> prof.to_svg("bwd.svg", mode="bwd", view="layer2")  # doctest: +SKIP
        """
        from wandb_modprof.sinks.report.images import to_svg

        return to_svg(
            self.snapshot(), path, mode=mode, scale=scale, view=view, width=width, height=height
        )

    def to_png(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        mode: str = DEFAULT_MODE,
        scale: str = DEFAULT_SCALE,
        view: str | None = None,
        width: int = 1100,
        height: int = 640,
        scale_factor: float = 2.0,
    ) -> bytes:
        """The panel as PNG bytes of `width * scale_factor` x `height * scale_factor` pixels
        (written to `path` too when given); arguments as `to_svg`.

        For W&B use `to_wandb_image` (`wandb.Image` does not take PNG bytes).

        Examples:
            >>> open("graph.png", "wb").write(prof.to_png(scale="log"))  # doctest: +SKIP
        """
        from wandb_modprof.sinks.report.images import to_png

        return to_png(
            self.snapshot(),
            path,
            mode=mode,
            scale=scale,
            view=view,
            width=width,
            height=height,
            scale_factor=scale_factor,
        )

    def to_wandb_image(
        self,
        *,
        mode: str = DEFAULT_MODE,
        scale: str = DEFAULT_SCALE,
        view: str | None = None,
        width: int = 1100,
        height: int = 640,
        scale_factor: float = 2.0,
        caption: str | None = None,
    ) -> Any:
        """The panel as a `wandb.Image` (the PNG of `to_png`, opened with Pillow), to log.

        Examples:
            >>> run.log({"modprof/graph": prof.to_wandb_image(mode="bwd")})  # doctest: +SKIP
        """
        from wandb_modprof.sinks.report.images import to_wandb_image

        png = self.to_png(
            mode=mode, scale=scale, view=view, width=width, height=height, scale_factor=scale_factor
        )
        return to_wandb_image(png, caption)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return f"<wandb_modprof.Profile model={self.model_name!r} samples={self._acc.num_samples}>"
