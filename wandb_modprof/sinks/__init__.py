"""Sinks: where a profile goes, each from plain data (a `records.ProfileData` or the table).

One sub-package per destination: `wandb` (the log of a sample, the table's W&B copy, the
chart preset), `file` (the versioned JSON profile file), `traces` (Chrome / Perfetto traces),
`report` (the self-contained HTML report and SVG / PNG pictures) and `text` (the terminal
summary, two-profile comparison and the regression gate). At this level, the helpers more than
one destination uses: the panel's Vega spec and its loader (`spec`: the W&B panel and the
report draw it), text made safe for each medium (`escape`) and atomic file writes with path
checks (`files`). A sink never sees the live `Profile`: anything with `snapshot()` is read once
at its boundary. Imports `records` and `view` (numbers are written by `view.units`), and
`capture.model.wrappers` for the class name a W&B key is named after; a destination imports
the helpers here and, for `wandb`, the destinations whose output a log carries (`report`,
`file`), never one that imports it.
"""
