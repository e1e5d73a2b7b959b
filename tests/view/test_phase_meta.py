"""The step's phases as the table's meta rows (`view.meta.phase_meta`), which the panel's phase
bar reads: one row per phase in step order, a measured one with its median, an unmeasured one
missing with its reason; none without phases."""

from __future__ import annotations

from wandb_modprof.records.phases import PhaseStats
from wandb_modprof.view.meta import phase_meta
from wandb_modprof.view.rows import meta_rows
from wandb_modprof.view.table import COLUMNS


def test_each_phase_is_a_row_in_step_order_measured_or_with_its_reason() -> None:
    phases = PhaseStats(
        median_ms={"backward": 3.0, "forward": 2.0, "between": 1.5},
        min_ms={"backward": 2.5, "forward": 1.8, "between": 1.0},
        samples={"backward": 3, "forward": 3, "between": 2},
        unmeasured={"optimizer": "no optimizer found", "loss": "not recorded"},
    )
    meta = phase_meta(phases)
    assert meta == [
        ("phase_between", "", 1.5),
        ("phase_forward", "", 2.0),
        ("phase_loss", "not recorded", None),
        ("phase_backward", "", 3.0),
        ("phase_optimizer", "no optimizer found", None),
    ]
    rows = meta_rows(meta)
    missing = [row[COLUMNS.index("missing")] for row in rows]
    assert missing == ["", "", "meta_number", "", "meta_number"]


def test_no_phases_no_rows() -> None:
    assert phase_meta(None) == []
