"""Terminal rendering of a profile: `Profile.summary()` (totals, then the top modules by forward,
backward and memory, from the statistics), and the top module calls of one analysis mode
(`wandb-modprof summary`, from `values.ModeValues`). Text only; every number is written by
`units.format_value`; every name (model, module, type, label) is escaped by `escape.escape_text`
(a name from a file is never a terminal escape sequence), and columns are aligned on the
escaped text."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from wandb_modprof.records.modes import CHECKPOINT_MODE
from wandb_modprof.records.roofline import BOUND_TEXT
from wandb_modprof.sinks.escape import escape_text
from wandb_modprof.sinks.text.phase_line import phases_line
from wandb_modprof.view.regions import Region, note
from wandb_modprof.view.units import format_value

if TYPE_CHECKING:
    from wandb_modprof.records.sample import ModuleStats, Sample
    from wandb_modprof.records.snapshot import Overhead, ProfileData
    from wandb_modprof.sinks.text.values import ModeValues, ModuleValue


def _section(
    title: str, rows: list[ModuleStats], self_metric: str, incl_metric: str, unit: str
) -> list[str]:
    """One top list: module, type, self and incl values (right-aligned, written by units)."""
    cells = [
        [
            r.key,
            r.module_type[:18],
            format_value(unit, r.typical(self_metric)),
            format_value(unit, r.typical(incl_metric)),
        ]
        for r in rows
    ]
    return [title, *render_columns(["module", "type", "self", "incl"], cells, {2, 3})]


def overhead_line(overhead: Overhead) -> str:
    """What sampling cost the run, as measured on its training thread (`api.overhead`)."""
    cost, wall = (format_value("ms", 1e3 * s) for s in (overhead.cost_s, overhead.wall_s))
    line = (
        f"watch overhead: {100 * overhead.share:.2f} % of this run's training time ({cost} of "
        f"{wall} over {overhead.steps} steps, {overhead.samples} sampled; measured)"
    )
    if overhead.step_s > 0:
        floor_pct = 100 * overhead.floor_s / overhead.step_s
        line += (
            f": {format_value('ms', 1e3 * overhead.floor_s)} per step on every step "
            f"({floor_pct:.2f} % of a {format_value('ms', 1e3 * overhead.step_s)} step)"
        )
        if overhead.sample_s > 0:
            line += f", {format_value('ms', 1e3 * overhead.sample_s)} per sample"
        if overhead.once_s > 0:
            line += f", {format_value('ms', 1e3 * overhead.once_s)} once (the structure pass)"
        if overhead.worker_s > 0:
            line += f", the worker's CPU {format_value('ms', 1e3 * overhead.worker_s)}"
        line += f"; in a long run at log_freq=100 about {100 * overhead.at_log_freq(100):.2f} %"
    if overhead.passes:
        passes = "pass" if overhead.passes == 1 else "passes"
        line += (
            f"; {overhead.passes} structure {passes} ({overhead.partial_passes} over part of "
            f"the model), their forwards {format_value('ms', 1e3 * overhead.pass_s)}"
        )
    if overhead.lost or overhead.dropped:
        line += (
            f"; {overhead.lost} sample(s) lost when the worker process ended, "
            f"{overhead.dropped} dropped by an error"
        )
    return line


def cold_lines(cold_left_out: int, last: Sample, num_samples: int) -> list[str]:
    """What became of the model's first step in its process (`Sample.cold_start`)."""
    if cold_left_out:
        return [
            "first step left out of the statistics: the model's first step in this process, "
            "mostly one-time start-up (allocator growth, kernel selection)"
        ]
    if last.cold_start and num_samples == 1:
        return [
            "WARNING: the only sample is the model's first step in this process: its times are "
            "mostly one-time start-up (allocator growth, kernel selection), not the model's "
            "cost; run one step before profiling, or pass warmup=1"
        ]
    return []


def per_step_line(stats: Mapping[str, ModuleStats]) -> str:
    """The figures the panel's totals and the report's header show (the root call's median,
    the mean for a version-1 file), named as such: "per step (median of 3 samples): ..."."""
    roots = [s for s in stats.values() if s.parent_key is None]
    root = min(roots, key=lambda s: s.order) if roots else None
    if root is None:
        return "per step: no sampled steps"
    stat = "median" if root.medians_known() else "mean"
    fwd = root.metrics.get("fwd_ms")
    counted = fwd.count if fwd is not None else 0
    return (
        f"per step ({stat} of {counted} sample{'' if counted == 1 else 's'}): forward "
        f"{format_value('ms', root.typical('fwd_ms'))}, backward "
        f"{format_value('ms', root.typical('bwd_ms'))}, activations "
        f"{format_value('bytes', root.typical('act_bytes'))}"
    )


def format_summary(data: ProfileData, n: int, regions: Sequence[Region] = ()) -> str:
    stats, last, num_samples = data.stats, data.last, data.num_samples
    model_name = escape_text(data.model_name)
    if last is None or not stats:
        return f"wandb_modprof profile of {model_name}: no sampled steps yet."
    totals = last.totals
    head = (
        f"wandb_modprof profile of {model_name}: {num_samples} sampled step(s), "
        f"{len(last.invocations)} module invocations in the last one"
    )
    per_step = per_step_line(stats)
    totals_line = (
        f"last sample (step {last.step}): forward {format_value('ms', totals.fwd_ms)}, backward "
        f"{format_value('ms', totals.bwd_ms)}, "
        f"activations {format_value('bytes', totals.act_bytes)}"
    )
    children = [s for s in stats.values() if s.parent_key is not None]

    def top(metric: str) -> list[ModuleStats]:
        rows = [s for s in children if s.typical(metric) is not None]
        rows.sort(key=lambda s: s.typical(metric) or 0.0, reverse=True)
        return rows[:n]

    kind = statistic_words(stats.values())
    lines = [head, per_step, totals_line, f"({kind} over samples; self = excluding child modules)"]
    phases = phases_line(data.phases)
    if phases is not None:
        lines.insert(3, phases)
    if data.overhead is not None:
        lines.append(overhead_line(data.overhead))
    lines += cold_lines(data.cold_left_out, last, num_samples)
    lines += gc_notes(list(stats.values()), n)
    lines += region_notes(regions, n)
    lines.append("")
    lines += _section(
        "Top modules by forward time", top("fwd_self_ms"), "fwd_self_ms", "fwd_ms", "ms"
    )
    lines.append("")
    if any(s.mean("bwd_ms") is not None for s in children):
        lines += _section(
            "Top modules by backward time", top("bwd_self_ms"), "bwd_self_ms", "bwd_ms", "ms"
        )
        lines.append("")
    if any(s.mean("act_bytes") is not None for s in children):
        lines += _section(
            "Top modules by activation memory (saved for backward)",
            top("act_self_bytes"),
            "act_self_bytes",
            "act_bytes",
            "bytes",
        )
    return "\n".join(lines).rstrip() + "\n"


def statistic_words(stats: Iterable[ModuleStats]) -> str:
    """ "medians", or "means (...)" where a statistic has no median (a version-1 file)."""
    if all(m.medians_known() for m in stats):
        return "medians"
    return "means: this profile file (version 1) kept no medians"


def gc_notes(stats: Sequence[ModuleStats], n: int) -> list[str]:
    """A line per module call (innermost first, at most `n`) in which a sample held a
    garbage collection: its time is in that sample's values, which the median leaves out when
    the other samples outnumber it. A collection inside a child is in its ancestors' times too,
    so only calls without such a child are named."""
    held = [s for s in stats if s.gc_samples]
    parents = {s.parent_key for s in held}
    innermost = [s for s in held if s.key not in parents]
    innermost.sort(key=lambda s: -(s.metrics["gc_ms"].max if "gc_ms" in s.metrics else 0.0))
    lines = []
    for s in innermost[:n]:
        count = s.metrics["fwd_ms"].count if "fwd_ms" in s.metrics else 0
        longest = s.metrics["gc_ms"].max if "gc_ms" in s.metrics else None
        lines.append(
            f"garbage collection in {s.gc_samples} of {count} sample(s) of {escape_text(s.key)} "
            f"(longest {format_value('ms', longest)}): in that sample's times, not the median's"
        )
    if len(innermost) > n:
        lines.append(f"(and {len(innermost) - n} more module calls held a garbage collection)")
    return lines


def region_notes(regions: Sequence[Region], n: int) -> list[str]:
    """A line per compiled region (at most `n`): measured as one call, the calls inside it
    ran fused (drawn from the graph, but absent from every list of times and memory)."""
    lines = [escape_text(note(r)) for r in regions[:n]]
    if len(regions) > n:
        lines.append(f"(and {len(regions) - n} more compiled regions)")
    return lines


# ---- one analysis mode: `wandb-modprof summary` ------------------------------------------
def format_percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def render_columns(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]
) -> list[str]:
    """Rows of text cells as aligned lines (columns in `right` right-aligned), every cell
    escaped first (`escape_text`), so the widths are those of the text shown."""
    header = [escape_text(h) for h in header]
    rows = [[escape_text(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  " + "  ".join(parts).rstrip()

    return [line(header)] + [line(r) for r in rows]


def mode_summary(data: ProfileData, mode_key: str, n: int) -> str:
    """What `wandb-modprof summary --mode M` prints: the per-step line, what became of the
    first step, then `format_mode_summary` of the mode."""
    from wandb_modprof.sinks.text.values import mode_values

    notes = [per_step_line(data.stats)]
    if data.last is not None:
        notes += cold_lines(data.cold_left_out, data.last, data.num_samples)
    return format_mode_summary(mode_values(data, mode_key), n, notes)


def bound_cell(bound: str) -> str:
    """A call's class under the roofline as the summary's `bound` column writes it: "compute",
    "memory", "overhead", "no work", "above the roofline (memory)" (`BOUND_TEXT`)."""
    return BOUND_TEXT.get(bound, bound).removesuffix("-bound")


def roofline_notes(modules: Sequence[ModuleValue], shown: Sequence[ModuleValue]) -> list[str]:
    """What the efficiency modes' numbers mean where the panel's card says it (`records.
    roofline`): the time lost is never below 0 and the share never above 100 %, a call faster
    than its roofline says why it can be; calls without work are not ranked."""
    lines = [
        "(time lost = time - time at the roofline, at least 0: the panel colours nodes by it, "
        "the hottest has the most to win)"
    ]
    above = {v.bound for v in shown if v.bound.startswith("above_")}
    if above:
        why = []
        if "above_memory" in above:
            why.append(
                "memory: cache-resident data (the bytes are logical; the peak is the memory's)"
            )
        if "above_compute" in above:
            why.append("compute: a peak FLOP/s below the machine's real one")
        lines.append(
            "(above the roofline: faster than the peaks allow, so the share is capped at 100 % "
            f"and the time lost at 0; {'; '.join(why)})"
        )
    idle = sum(1 for v in modules if v.bound == "none")
    if idle:
        calls = "call" if idle == 1 else "calls"
        lines.append(
            f"({idle} module {calls} did no work: no FLOPs, no bytes moved: no share, no time "
            "lost, not ranked)"
        )
    return lines


def format_mode_summary(values: ModeValues, n: int, notes: Sequence[str] = ()) -> str:
    """The top `n` module calls of one analysis mode as a terminal table; `notes` (the
    per-step line, what became of the first step) follow its first line.

    >>> print(format_mode_summary(values.mode_values(prof, "act"), 5))  # doctest: +SKIP
    """
    m = values.mode
    head = (
        f"wandb_modprof profile of {escape_text(values.model_name)}: {values.num_samples} "
        f"sampled step(s); "
        f"mode {m.key} ({m.label})"
    )
    if values.total is not None:
        head += f", model total {format_value(m.unit, values.total)}"
    head = "\n".join([head, *notes])
    if m.rank_by and values.roofline is not None:
        head += f"\nroofline ({escape_text(values.roofline.text())})"
    measured = values.ranked()
    regions = region_notes(values.regions, n)
    if not measured:
        why = "no sampled steps" if values.num_samples == 0 else "not measured in this profile"
        if values.num_samples and m.bound_by == "bwd_bound":
            why += (
                ": it needs the backward counted on a structure pass's step (file v7+; a step "
                "whose backward came before the next forward)"
            )
        elif values.num_samples and m.rank_by:
            why += ": it needs a structure pass's counts and the machine's roofline (file v6+)"
        return "\n".join([head, f"no module has a value in mode {m.key} ({why}).", *regions]) + "\n"
    shown = measured[:n]
    header = ["#", "module", "type", "calls", m.label]
    right = {0, 3, 4}
    if m.total:
        header.append("share")
        right.add(5)
    if m.rank_by:  # ranked by something else: show it, and the class (`records.roofline`)
        header += [m.rank_label, "bound"]
        right.add(5)
    # Parameters, gradients and optimizer state belong to the module, not to one call: a module
    # called twice has two rows with the same bytes, but its share is counted once.
    per_module = set(m.columns) <= {"param_bytes", "grad_bytes", "optim_bytes"}
    counted: set[str] = set()
    rows = []
    for rank, v in enumerate(shown, 1):
        key = f"○ {v.key}" if v.planned else v.key  # (the panel's mark of a planned module)
        cells = [str(rank), key, v.module_type, str(v.calls), format_value(m.unit, v.value)]
        if m.total:
            repeat = per_module and v.module_name in counted
            counted.add(v.module_name)
            cells.append("(same)" if repeat else format_percent(values.share(v.value)))
        if m.rank_by:
            cells += [format_value(m.rank_unit, v.rank), bound_cell(v.bound)]
        rows.append(cells)
    kind = "means" if values.statistic == "mean" else "medians"
    by = f", by {m.rank_label}" if m.rank_by else ""
    lines = [head, f"top {len(shown)} of {len(measured)} module calls{by} ({kind} over samples)"]
    if m.bound_by:
        lines += roofline_notes(values.modules, shown)
    # the checkpoint plan at the table's budget, as the panel shows it; in the "Load" mode, the
    # list members no sample called
    lines += values.plan
    if values.plan and m.key == CHECKPOINT_MODE:
        lines.append("(○: checkpointed in the plan; `wandb-modprof plan` for others)")
    held = [v for v in shown if v.gc_samples]
    if held:
        calls = ", ".join(
            f"{escape_text(v.key)} ({v.gc_samples} of {values.num_samples})" for v in held[:n]
        )
        lines.append(f"(samples holding a garbage collection, left out by the median: {calls})")
    lines += render_columns(header, rows, right)
    if m.total and m.key != "self":
        lines.append("(share: of the model total; a module's value includes its children)")
    if per_module and m.total:
        lines.append("(same: another call of a module above; its memory is counted once)")
    lines += regions
    return "\n".join(lines) + "\n"
