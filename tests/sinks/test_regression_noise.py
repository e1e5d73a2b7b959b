"""The regression gate (`sinks/text/regression.py`) on profile files whose samples are known: each
call's own forward and backward time per sample is set here, folded by the real statistics
(`stats.running.StatsAccumulator`), saved with `Profile.save` and judged by the command line
(`wandb-modprof compare A B --fail-above 1.10`) and by `check_regression` on the same files.
No timing is involved, so these run anywhere, in parallel, and decide the same way every time
(fixed seeds; several of each).

The gate decides on each side's fastest sample (the minimum over the samples). What is shown:

- (a) a call 1.5x slower on steady samples (+-2 %) fails;
- (b) a call 4x slower fails when its samples carry load-like noise: every call's own time in
  every sample stretched by a random factor of 1 to 3 (in the new profile only, and in both);
- (c) one outlier sample (every call 10x) decides nothing: in the baseline it hides no 3.75x
  regression (a z-score over the samples' spread would), in the new profile it makes none;
- (d) two independent draws of the same steady distribution (A/A) pass.

`tests/sinks/test_regression.py` does the same with real timings (busy-waiting modules).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import wandb_modprof
from wandb_modprof.api import cli as _cli
from wandb_modprof.records.sample import InvocationRecord
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.sinks.text.regression import TOTAL_KEY, RegressionCheck
from wandb_modprof.stats.running import StatsAccumulator

SAMPLES = 15
SEEDS = range(5)
LAYERS = 32
TARGET = "3#0"  # the call made slower
# each call's own forward and backward time (ms): the root's and each Linear's. The model total
# is 1 + 32 x 5 = 161 ms; the target holds 3.1 % of it (above the 1 % that counts), so even 4x
# of it is x1.09 of the total: the target alone has to be caught, no container gives it away.
OWN_MS = {"<root>#0": (0.5, 0.5), **{f"{i}#0": (2.0, 3.0) for i in range(LAYERS)}}

Noise = Callable[[random.Random], float]


def steady(rng: random.Random) -> float:
    return rng.uniform(0.98, 1.02)


def loaded(rng: random.Random) -> float:
    """Another process on the core: a call's time stretched 1-3x (never shortened)."""
    return rng.uniform(1.0, 3.0)


@pytest.fixture(scope="module")
def template() -> tuple[tuple[InvocationRecord, ...], ProfileData]:
    """The records and structure of a real capture of `LAYERS` Linear layers (its times
    replaced)."""
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(LAYERS)])
    x = torch.ones(2, 4)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(x).sum().backward()
    data = prof.snapshot()
    assert data.last is not None
    records = data.last.invocations
    assert {r.key for r in records} == set(OWN_MS)
    return records, data


def _sample(
    records: tuple[InvocationRecord, ...], own: dict[str, tuple[float, float]]
) -> list[InvocationRecord]:
    """The records with these own times; a call's time includes its children's."""
    children: dict[str | None, list[str]] = {}
    for r in records:
        children.setdefault(r.parent_key, []).append(r.key)

    def inclusive(key: str, which: int) -> float:
        return own[key][which] + sum(inclusive(c, which) for c in children.get(key, []))

    out = []
    for r in records:
        fwd, bwd = inclusive(r.key, 0), inclusive(r.key, 1)
        out.append(
            dataclasses.replace(
                r,
                fwd_ms=fwd,
                fwd_self_ms=own[r.key][0],
                fwd_wall_ms=fwd,
                bwd_ms=bwd,
                bwd_self_ms=own[r.key][1],
                bwd_span_ms=bwd,
                gc_ms=0.0,
            )
        )
    return out


def write(
    path: Path,
    template: tuple[tuple[InvocationRecord, ...], ProfileData],
    seed: int,
    noise: Noise,
    slower: float = 1.0,
    outlier_at: int | None = None,
    samples: int = SAMPLES,
) -> Path:
    """A profile file of `samples` samples: each call's own time times a `noise` draw per
    sample, the target's times `slower`; in sample `outlier_at` every call 10x slower."""
    records, data = template
    rng = random.Random(seed)
    acc = StatsAccumulator()
    for s in range(samples):
        own = {}
        for key, (fwd, bwd) in OWN_MS.items():
            scale = (slower if key == TARGET else 1.0) * (10.0 if s == outlier_at else 1.0)
            own[key] = (fwd * scale * noise(rng), bwd * scale * noise(rng))
        acc.fold(_sample(records, own))
    folded = ProfileData(data.model_name, samples, acc.snapshot(), None, data.structures)
    return wandb_modprof.Profile.from_data(folded).save(path)


def gate(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, RegressionCheck]:
    """The command line's exit status and output, and `check_regression` on the same files."""
    status = _cli.main(["compare", str(a), str(b), "--top", "3", "--fail-above", "1.10"])
    out = capsys.readouterr().out
    check = wandb_modprof.check_regression(a, b, 1.10)
    assert status == (0 if check.passed else 1), out
    # the command prints the same verdict after the comparison (its labels: the files' stems)
    assert "\n".join(check.format().splitlines()[1:]) in out, out
    return status, out, check


def _fastest(check: RegressionCheck, key: str) -> float:
    (call,) = [c for c in check.regressed if c.key == key]
    return call.fastest_ratio


@pytest.mark.parametrize("seed", SEEDS)
def test_a_call_1_5x_slower_on_steady_samples_fails(template, tmp_path, capsys, seed):
    a = write(tmp_path / "a.modprof.json", template, seed, steady)
    b = write(tmp_path / "b.modprof.json", template, seed + 100, steady, slower=1.5)
    status, out, check = gate(a, b, capsys)
    assert status == 1 and "FAILED: 1 regressed (their fastest samples; A, B: medians):" in out
    assert [c.key for c in check.regressed] == [TARGET], out  # the model total: x1.02, passes
    assert 1.5 * 0.98 / 1.02 < _fastest(check, TARGET) < 1.5 * 1.02 / 0.98


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("noisy_base", [False, True], ids=["new-loaded", "both-loaded"])
def test_a_call_4x_slower_fails_under_load_noise(template, tmp_path, capsys, seed, noisy_base):
    a = write(tmp_path / "a.modprof.json", template, seed, loaded if noisy_base else steady)
    b = write(tmp_path / "b.modprof.json", template, seed + 100, loaded, slower=4.0)
    status, out, check = gate(a, b, capsys)
    assert status == 1, out
    # other calls may be flagged too (the noise stretched all their samples); the slowed one
    # leads on these draws, and its fastest ratio is at least 4 / 3 whatever the draws
    # (4 x 1 over 1 x 3)
    assert check.regressed[0].key == TARGET, out
    assert _fastest(check, TARGET) > (4.0 / 3.0 if noisy_base else 4.0 * 0.98 / 1.02)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("samples", [5, SAMPLES])
def test_an_outlier_in_the_baseline_hides_no_regression(template, tmp_path, capsys, seed, samples):
    """With 5 samples the outlier makes the baseline's standard deviation 4x the change: a
    z-score of the medians' difference over the samples' spread passed this (z ~ 1.2)."""
    a = write(tmp_path / "a.modprof.json", template, seed, steady, outlier_at=2, samples=samples)
    b = write(tmp_path / "b.modprof.json", template, seed + 100, steady, 3.75, samples=samples)
    status, out, check = gate(a, b, capsys)
    assert status == 1 and [c.key for c in check.regressed] == [TARGET], out
    assert 3.75 * 0.98 / 1.02 < _fastest(check, TARGET) < 3.75 * 1.02 / 0.98
    # nothing else regressed: the model total went from 161 to 174.75 ms (x1.085)
    assert TOTAL_KEY not in [c.key for c in check.regressed]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("samples", "outlier_at"), [(5, 2), (SAMPLES, 0), (SAMPLES, 14)])
def test_an_outlier_in_the_new_profile_makes_no_regression(
    template, tmp_path, capsys, seed, samples, outlier_at
):
    a = write(tmp_path / "a.modprof.json", template, seed, steady, samples=samples)
    b = write(tmp_path / "b.modprof.json", template, seed + 100, steady, 1.0, outlier_at, samples)
    status, out, check = gate(a, b, capsys)
    assert status == 0 and "PASSED: no call regressed" in out, out
    assert check.compared == 1 + LAYERS and not check.within_noise  # the medians did not move


@pytest.mark.parametrize("seed", SEEDS)
def test_two_draws_of_the_same_steady_samples_pass(template, tmp_path, capsys, seed):
    a = write(tmp_path / "a.modprof.json", template, seed, steady)
    b = write(tmp_path / "b.modprof.json", template, seed + 100, steady)
    status, out, check = gate(a, b, capsys)
    assert status == 0 and "PASSED: no call regressed" in out, out
    assert check.compared == 1 + LAYERS and not check.within_noise
