"""The table's schema: its format name and version, and its column names grouped by the kind
of cell they hold. Takes nothing; gives the constants that the row writer, the W&B sink (its
`wandb.Table` column types) and the tests read. `wandb_modprof.view.table` re-exports them.

>>> from wandb_modprof.view.columns import COLUMNS, TEXT_COLUMNS
>>> COLUMNS[:3] == TEXT_COLUMNS[:3] == ("row_kind", "view_key", "node_ref")
True
"""

from __future__ import annotations

from wandb_modprof.records.roofline import BOUNDS
from wandb_modprof.records.sample import LOAD_METRICS, METRICS
from wandb_modprof.view.load import LOAD_COLUMNS

TABLE_FORMAT = "wandb_modprof.table"
# 2: views are rows of their own (`view_id`, `view_parent`, `view_last`) and node / edge rows
# refer to them, with keys and names relative to the view (`view/refs.py`); 1 repeated every
# ancestor's key on every row (`view_path`, `view_labels`).
# 3: grids of many siblings draw a frame row (`node_kind` "block", its members in
# `group_members`), and compiled regions have `compiled_region` meta rows; a version-2 panel
# drew the frames as grey boxes, so the panel (and its W&B preset name) moved to version 3.
# 4: nothing new in the table itself; its W&B copy packs the cells the panel reads into one
# text cell per row (`sinks/wandb/packed.py`), which panels of version 3 cannot read, so the
# table's version tells them to say it is newer.
TABLE_VERSION = 4
# A metric's column holds its colour statistic (`RunningStat.typical`: the median over the
# samples, the mean for a version-1 file; the `statistic` meta row says which). These metrics
# also get their spread: mean, std, min, max and last value over the samples.
SPREAD_METRICS = ("fwd_ms", "fwd_self_ms", "bwd_ms", "bwd_self_ms")
SPREAD_STATS = ("mean", "std", "min", "max", "last")
# Garbage collections inside a module call: the longest in any sample (ms), and how many
# samples held one (`capture/step/gc_watch.py`); missing for a version-1 file.
GC_COLUMNS = ("gc_ms_max", "gc_samples")
FLOP_COLUMNS = ("fwd_flops", "fwd_self_flops", "fwd_flop_per_s")
# What the structure pass counted of a call besides its forward FLOPs (`CallInfo`): its
# backward's FLOPs, the bytes its forward's and its backward's ops moved, their ATen ops; then
# where its forward and its backward stand under the machine's roofline (`records.roofline`):
# the share reached (%, at most 100), the time lost to it (ms, at least 0), and the class as a
# code (`BOUND_CODES`: 1 compute-, 2 memory-, 3 overhead-bound, 4 no work, 5 / 6 above the
# roofline on the FLOPs' / the bytes' side: share capped at 100, time lost at 0). A call
# without work (4) has its class only: its share and time lost are missing, so it takes no
# colour and no place in the ranked list. Codes 4-6 are new in the same table version: a
# panel that predates them calls them overhead-bound.
WORK_COLUMNS = ("bwd_flops", "fwd_bytes", "fwd_ops", "bwd_bytes", "bwd_ops")
EFFICIENCY_COLUMNS = (
    "fwd_roofline_pct",
    "fwd_lost_ms",
    "fwd_bound",
    "bwd_roofline_pct",
    "bwd_lost_ms",
    "bwd_bound",
)
BOUND_CODES = {bound: code for code, bound in enumerate(BOUNDS, start=1)}
# The checkpoint plan at the table's budget (`view.checkpoint_cells`): the bytes checkpointing
# the call would free, those per ms of its forward (the "Checkpoint value" mode), and where
# its module stands in the plan (a code: 1 + the index in `records.checkpoint.STATES`). A call
# no plan may choose has its state only.
CHECKPOINT_COLUMNS = ("ckpt_freed_bytes", "ckpt_value", "ckpt_state")

TEXT_COLUMNS = (
    "row_kind",
    "view_key",
    "node_ref",
    "node_kind",
    "label",
    "sublabel",
    "name_ref",
    "module_type",
    "src_ref",
    "dst_ref",
    "edge_path",
    "meta_key",
    "meta_value",
    "missing",
    # a group node's members, one ref per line (relative to the view, as `node_ref`): which
    # modules (a layer's cheapest experts) are merged into it, so each is findable by name
    "group_members",
    "span_phase",
)
# Distributed runs (`api.distributed`): across ranks, the mean and max of each rank's mean
# fwd_ms + bwd_ms, the rank with that max, and max / mean (1.0: balanced); 0 and `missing`
# without per-rank data.
RANK_INT_COLUMNS = ("rank_count", "rank_slowest")
RANK_NUMBER_COLUMNS = ("rank_fwd_bwd_mean_ms", "rank_fwd_bwd_max_ms", "rank_imbalance")
RANK_COLUMNS = (
    "rank_count",
    "rank_fwd_bwd_mean_ms",
    "rank_fwd_bwd_max_ms",
    "rank_slowest",
    "rank_imbalance",
)
# What `ProfileTable.resolved()` adds to each record: the refs read back against their view.
RESOLVED_COLUMNS = ("node_key", "module_name", "src_key", "dst_key", "group_keys")
INT_COLUMNS = (
    "view_id",
    "view_parent",
    "view_last",
    "view_depth",
    "call_index",
    "group_count",
    "samples",
    *RANK_INT_COLUMNS,
)
BOOL_COLUMNS = ("has_view",)
# The timeline (`view/timeline.py`): a `span` row's window (`span_phase` "fwd" or "bwd"), a `mem`
# row's time (`t0_ms`) and live bytes; ms from the root forward's start of the last sample.
TIMELINE_COLUMNS = ("t0_ms", "t1_ms", "live_bytes")
LAYOUT_COLUMNS = ("x_px", "y_px", "w_px", "h_px", "view_w_px", "view_h_px")
# Metrics added since the W&B copy's packed order was fixed (`records.sample.LOAD_METRICS`:
# `rows`, what a call processed, its median over the samples) are the table's last columns: the
# panel's spec names the word "rows" (in a message), so its W&B copy packs that column, and
# there, last, it moves no number that a panel registered before it decodes by position
# (`sinks/wandb/packed.py`; such a panel ignores the numbers it does not know). After it, the
# "Load" mode's columns (`view.load`).
LATE_METRIC_COLUMNS = LOAD_METRICS + LOAD_COLUMNS
METRIC_COLUMNS = (
    tuple(m for m in METRICS if m not in LATE_METRIC_COLUMNS)
    + tuple(f"{m}_{s}" for m in SPREAD_METRICS for s in SPREAD_STATS)
    + GC_COLUMNS
    + FLOP_COLUMNS
    + WORK_COLUMNS
    + EFFICIENCY_COLUMNS
    + CHECKPOINT_COLUMNS
    + LATE_METRIC_COLUMNS
)
NUMBER_COLUMNS = (
    LAYOUT_COLUMNS
    + METRIC_COLUMNS[: -len(LATE_METRIC_COLUMNS)]
    + RANK_NUMBER_COLUMNS
    + TIMELINE_COLUMNS
    + ("meta_number",)
    + LATE_METRIC_COLUMNS
)
# Columns named in `missing` when not measured for a row.
MISSABLE_COLUMNS = METRIC_COLUMNS + RANK_COLUMNS
COLUMNS = TEXT_COLUMNS + INT_COLUMNS + BOOL_COLUMNS + NUMBER_COLUMNS
Cell = str | int | float | bool
