"""The efficiency analysis: the structure pass's work counts (backward FLOPs, bytes, ops), the
machine's roofline, and the class of calls whose class is known by construction."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.capture.structure import calibration
from wandb_modprof.records.calls import Structure
from wandb_modprof.records.roofline import RAISE_MIN_MS, efficiency


def _structure(model: nn.Module, x: torch.Tensor, **options: object) -> wandb_modprof.Profile:
    """Three samples and the structure pass (the block's second forward)."""
    model(x).sum().backward()
    settings = wandb_modprof.Settings(**options)  # type: ignore[arg-type]
    with wandb_modprof.profile(model, settings=settings) as prof:
        for _ in range(4):
            model(x).sum().backward()
    return prof


def _root(prof: wandb_modprof.Profile) -> Structure:
    (structure,) = prof.structures()
    assert all(c.work_known for c in structure.calls)
    return structure


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
        return functional.scaled_dot_product_attention(q, k, v)


MODELS = {
    # the first layer's input needs no gradient: one matmul in its backward, not two
    "mlp": (lambda: nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 8)), (16, 64)),
    "conv": (
        lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3)),
        (2, 3, 16, 16),
    ),
    "attention": (_Attention, (2, 16, 32)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_backward_flops_are_what_the_backward_runs(name: str) -> None:
    """Counted from the forward ops, equal to torch's FLOP counter on the real backward."""
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model, x = make(), torch.randn(shape)
    root = _root(_structure(model, x)).calls[0]
    with FlopCounterMode(display=False) as forward:
        y = model(x).sum()
    with FlopCounterMode(display=False) as backward:
        y.backward()
    fwd, bwd = forward.get_total_flops(), backward.get_total_flops()
    if name == "attention":  # torch's counter has no formula for the CPU attention kernels:
        # ours charges the flash formulas on the same shapes (`structure/flops.py`, `work.py`)
        shape = (2, 4, 16, 8)
        fwd += sdpa_flop_count(shape, shape, shape)
        bwd += sdpa_backward_flop_count(shape, shape, shape, shape)
    assert root.fwd_flops == fwd > 0
    assert root.bwd_flops == bwd > 0
    assert root.bwd_flops != 2 * root.fwd_flops or name == "conv"  # not assumed 2x


def test_bytes_and_ops_are_counted_per_op() -> None:
    """A ReLU reads and writes its tensor; a Linear reads input, weight and bias and writes
    its output; views move nothing and are not ops."""
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
    x = torch.randn(8, 64)
    calls = {c.key: c for c in _root(_structure(model, x)).calls}
    linear, relu = calls["0#0"], calls["1#0"]
    assert relu.fwd_bytes == 2 * 8 * 32 * 4 and relu.fwd_ops == 1
    assert linear.fwd_bytes == (8 * 64 + 32 * 64 + 32 + 8 * 32) * 4 and linear.fwd_ops == 1
    assert calls["<root>#0"].fwd_bytes == linear.fwd_bytes + relu.fwd_bytes


class _Tiny(nn.Module):
    """Many ops on four numbers: their fixed cost is all there is. (The large input is added
    outside: an op reading 2 MiB in here made the call memory-bound wherever the calibration
    ran on a loaded machine and read the bandwidth low.)"""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(4))

    def forward(self) -> torch.Tensor:
        y = self.p
        for _ in range(100):
            y = y * 1.01 + 0.1
        return y.sum()


class _Known(nn.Module):
    """A large matmul (compute-bound), an elementwise op on a large tensor (memory-bound), and
    many tiny ops (overhead-bound)."""

    def __init__(self) -> None:
        super().__init__()
        self.matmul = nn.Linear(1024, 1024)
        self.elementwise = nn.ReLU()
        self.tiny = _Tiny()
        self.register_buffer("big", torch.ones(8, 1024, 1024))  # 32 MiB

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x) + self.tiny() + self.elementwise(self.big).mean()


def test_calls_of_a_known_class_are_classed_so() -> None:
    x = torch.randn(512, 1024)
    prof = _structure(_Known(), x)
    line = _root(prof).roofline
    assert line is not None and line.source == "measured" and line.device == "cpu"
    assert line.peak_flops > 1e8 and line.peak_bytes_per_s > 1e8 and 0 < line.op_overhead_ms < 1
    values = wandb_modprof.sinks.text.values.mode_values(prof, "eff")
    by_key = {v.key: v for v in values.modules}
    assert by_key["matmul#0"].bound == "compute"
    assert by_key["elementwise#0"].bound == "memory"
    assert by_key["tiny#0"].bound == "overhead"
    stats = prof.stats()
    for v in values.modules:  # the share of the roofline and the time lost, from the median
        fwd_ms = stats[v.key].typical("fwd_ms")
        assert v.value is not None and v.value > 0 and v.rank is not None
        assert v.rank == pytest.approx(fwd_ms * (1 - v.value / 100))
    # the ranked list leads with the call that loses the most time, not the least efficient
    assert [v.key for v in values.ranked()] == sorted(by_key, key=lambda k: -by_key[k].rank)


def test_given_peaks_are_used() -> None:
    prof = _structure(_Known(), torch.randn(64, 1024), peak_flops=1e12, peak_bw=2e11)
    line = _root(prof).roofline
    assert line is not None and (line.peak_flops, line.peak_bytes_per_s) == (1e12, 2e11)
    assert line.source == "given" and line.op_overhead_ms > 0  # (the op cost is measured)
    half = _structure(_Known(), torch.randn(64, 1024), peak_bw=2e11)
    assert _root(half).roofline.source == "given + measured"  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "1e12", True])
def test_bad_peaks_are_refused(value: object) -> None:
    with pytest.raises(ModProfError, match="peak_flops expected None or a"):
        wandb_modprof.profile(nn.Linear(2, 2), settings=wandb_modprof.Settings(peak_flops=value))  # type: ignore[arg-type]


def test_the_calibration_leaves_the_random_stream_alone() -> None:
    calibration.measured_roofline.cache_clear()
    before = torch.random.get_rng_state()
    found = calibration.measured_roofline("cpu", "float32")
    assert torch.equal(torch.random.get_rng_state(), before)
    assert calibration.measured_roofline("cpu", "float32") is found  # once per process


def test_efficiency_of_a_call_without_time_or_counts_is_none() -> None:
    line = calibration.measured_roofline("cpu", "float32")
    assert efficiency(1e6, 1e6, 1, None, line) is None
    assert efficiency(1e6, 1e6, 1, 0.0, line) is None
    assert efficiency(math.nan, 1e6, 1, 1.0, line) is None


def test_a_call_faster_than_the_peak_raises_it() -> None:
    """A roofline is an upper bound: given a peak far below what the matmul reaches, the
    fastest forward or backward of at least `RAISE_MIN_MS` sets it (its efficiency 100 %),
    and says so."""
    prof = _structure(_Known(), torch.randn(512, 1024), peak_flops=1e6, peak_bw=1e10)
    stats = prof.stats()
    reached = []
    for key, metric in (("eff", "fwd_ms"), ("eff_bwd", "bwd_ms")):
        values = wandb_modprof.sinks.text.values.mode_values(prof, key)
        line = values.roofline
        assert line is not None and line.peak_flops > 1e9
        assert line.source == "given, raised to the fastest call"
        timed = [v for v in values.modules if stats[v.key].typical(metric) >= RAISE_MIN_MS]
        reached += [v.value for v in timed if v.bound == "compute"]
    assert max(reached) == pytest.approx(100.0)
    (meta,) = [r for r in prof.table().records() if r["meta_key"] == "roofline"]
    assert (
        meta["meta_number"] == line.peak_flops
        and "raised to the fastest call" in meta["meta_value"]
    )
