"""`capture/resolve.py` builds its records with `records.frozen` (a fast path past the frozen
dataclass `__init__`): they must be the records `__init__` builds."""

from __future__ import annotations

import dataclasses
import pickle

import torch
from models import TinyGPT

import wandb_modprof
from wandb_modprof.records.sample import BackwardRun, InvocationRecord


def test_resolved_records_are_what_the_dataclass_init_builds():
    model = TinyGPT(layers=1)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with wandb_modprof.profile(model) as prof:
        model(ids).sum().backward()
    records = prof.invocations()
    assert len(records) > 10
    names = [f.name for f in dataclasses.fields(InvocationRecord)]
    for rec in records:
        built = InvocationRecord(**{name: getattr(rec, name) for name in names})
        assert type(rec) is InvocationRecord and list(vars(rec)) == names
        assert rec == built and hash(rec) == hash(built) and repr(rec) == repr(built)
    assert pickle.loads(pickle.dumps(records[3])) == records[3]
    sample = prof.last_sample
    assert sample is not None
    runs = sample.runs
    assert any(run.kind == "node" for run in runs)
    run_fields = [f.name for f in dataclasses.fields(BackwardRun)]
    for run in runs:
        built = BackwardRun(**{name: getattr(run, name) for name in run_fields})
        assert list(vars(run)) == run_fields and run == built and repr(run) == repr(built)
    try:
        records[0].fwd_ms = 0.0  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a frozen record was changed")
