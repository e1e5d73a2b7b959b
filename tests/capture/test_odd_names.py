"""Module names Python allows but codecs refuse: a lone surrogate (`"a\\ud800"`) is a legal
`str` key of `_modules`; the structure pass must take it like any name, so samples are taken."""

from __future__ import annotations

import hashlib
import warnings

import torch
from torch import nn

import wandb_modprof
from wandb_modprof.records.calls import call_signature


def test_the_call_signature_hashes_any_str() -> None:
    odd = call_signature(iter(["a\ud800#0", "b#1"]))
    assert len(odd) == 24 and int(odd, 16) >= 0
    assert odd != call_signature(iter(["a\udfff#0", "b#1"]))
    # ordinary keys keep their digest (UTF-8, as before keys could be prefixed)
    digest = hashlib.blake2b(b"layer1#0\nlayer1#1\n", digest_size=12).hexdigest()
    assert call_signature(iter(["layer1#0", "layer1#1"])) == digest


def test_a_module_named_with_a_lone_surrogate_is_sampled() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    model._modules["a\ud800"] = nn.Linear(4, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the sample must not be dropped with a warning
        with wandb_modprof.profile(model) as prof:
            for _ in range(3):
                model(torch.randn(3, 4)).sum().backward()
    data = prof.snapshot()
    assert data.num_samples == 2
    assert "a\ud800#0" in data.stats
    assert data.stats["a\ud800#0"].mean("fwd_ms") is not None
    assert [s for s in data.structures if any(c.module_name == "a\ud800" for c in s.calls)]
