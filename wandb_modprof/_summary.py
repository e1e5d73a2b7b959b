"""Terminal rendering of a profile: totals, then the top modules by forward, backward, memory."""

from __future__ import annotations

from ._records import ModuleStats, Sample

_MIB = 1024 * 1024


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:9.3f}"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / _MIB:9.2f}"


def _section(
    title: str, rows: list[ModuleStats], self_metric: str, incl_metric: str, fmt: str
) -> list[str]:
    render = _ms if fmt == "ms" else _mib
    unit = "ms" if fmt == "ms" else "MiB"
    width = max([len(r.key) for r in rows] + [6])
    lines = [
        title,
        f"  {'module':<{width}}  {'type':<18} {'self ' + unit:>10} {'incl ' + unit:>10}",
    ]
    for r in rows:
        lines.append(
            f"  {r.key:<{width}}  {r.module_type[:18]:<18} "
            f"{render(r.mean(self_metric)):>10} {render(r.mean(incl_metric)):>10}"
        )
    return lines


def format_summary(
    model_name: str, num_samples: int, stats: dict[str, ModuleStats], last: Sample | None, n: int
) -> str:
    if last is None or not stats:
        return f"wandb_modprof profile of {model_name}: no sampled steps yet."
    totals = last.totals
    head = (
        f"wandb_modprof profile of {model_name}: {num_samples} sampled step(s), "
        f"{len(last.invocations)} module invocations in the last one"
    )
    totals_line = (
        f"last step: forward {_ms(totals.fwd_ms).strip()} ms, backward "
        f"{_ms(totals.bwd_ms).strip()} ms, activations {_mib(totals.act_bytes).strip()} MiB"
    )
    children = [s for s in stats.values() if s.parent_key is not None]

    def top(metric: str) -> list[ModuleStats]:
        rows = [s for s in children if s.mean(metric) is not None]
        rows.sort(key=lambda s: s.mean(metric) or 0.0, reverse=True)
        return rows[:n]

    lines = [head, totals_line, "(means over samples; self = excluding child modules)", ""]
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
            "MiB",
        )
    return "\n".join(lines).rstrip() + "\n"
