"""Sinks: where a profile goes, each from plain data (a `records.ProfileData` or the table).

Gives the panel's Vega spec and its loader (`spec`), the self-contained HTML report (`html`),
SVG / PNG pictures (`images`), the versioned JSON profile file (`profile_file`), Chrome /
Perfetto traces (`trace`), the terminal summary and two-profile comparison (`summary`,
`compare`), W&B logging and chart-preset registration (`wandb_log`, `chart`), and the one unit
formatter they all write numbers with (`units`). A sink never sees the live `Profile`: anything
with `snapshot()` is read once at its boundary. Imports `records` and `view` (and
`capture.model.wrappers` for the class name a W&B key is named after).
"""
