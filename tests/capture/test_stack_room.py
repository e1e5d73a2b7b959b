"""`capture/step/stack_room`: the recursion-limit room claimed while our hooks are on the submodules
covers the frames they add, on several real models, and the ledger of claims restores the
limit (or leaves the user's own) however claims and releases interleave."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest
import torch
from models import ResNet, TinyGPT, gpt2_from_config, gpt_input, resnet_input
from torch import nn

import wandb_modprof
from wandb_modprof.capture.step import stack_room


class Chain(nn.Module):
    """`depth` nested levels (`inner.inner...`), each ending in a Linear."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.inner = Chain(depth - 1) if depth > 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.inner(x) if self.inner is not None else x)


def _depth(frame: FrameType | None) -> int:
    n = 0
    while frame is not None:
        n, frame = n + 1, frame.f_back
    return n


def deepest_frame(fn: Callable[[], Any]) -> tuple[int, int]:
    """The deepest Python stack `fn` reaches, in frames (what the recursion limit counts),
    and the highest recursion limit seen meanwhile."""
    deepest, limit = 0, 0

    def on_event(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal deepest, limit
        if event == "call":
            deepest = max(deepest, _depth(frame))
            limit = max(limit, sys.getrecursionlimit())

    sys.setprofile(on_event)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return deepest, limit


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "resnet": lambda: (ResNet(), resnet_input(2, 16)),
    "tiny_gpt": lambda: (TinyGPT(), gpt_input(2, 16)),
    "gpt2": lambda: (gpt2_from_config(layers=2), gpt_input(2, 16, vocab=512)),
    "chain40": lambda: (Chain(40), torch.randn(2, 4)),
}


def _loss(out: Any) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out
    loss: torch.Tensor = logits.float().pow(2).mean()
    return loss


@pytest.mark.parametrize("name", list(MODELS))
def test_the_room_claimed_covers_what_the_hooks_add(name: str) -> None:
    """Unwatched vs `profile` (its structure pass and a timed step): the extra depth of the
    forward is within `extra_frames` of the model's names, and the claim is held exactly while
    the submodules carry hooks."""
    if name == "gpt2":
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, x = MODELS[name]()
    names = [n for n, _ in model.named_modules()]
    nesting = max(n.count(".") + 1 for n in names if n)
    room = stack_room.extra_frames(names)
    assert room == stack_room.FRAMES_PER_LEVEL * nesting + stack_room.HOOK_FRAMES
    limit = sys.getrecursionlimit()
    plain, unraised = deepest_frame(lambda: _loss(model(x)).backward())
    assert unraised == limit
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):  # the structure pass, then a timed step
            watched, raised = deepest_frame(lambda: _loss(model(x)).backward())
            assert watched - plain <= room, (name, watched, plain, room)
            assert raised == limit + room  # raised while the submodules carry our hooks
    assert sys.getrecursionlimit() == limit  # and put back
    assert prof.structures() and prof.invocations()


def _extra_depth(depth: int) -> int:
    """How much deeper a `depth`-level chain's step goes under `profile` than unwatched (the
    deepest of its structure pass and a timed step)."""
    model = Chain(depth)
    x = torch.randn(2, 4)
    plain, _ = deepest_frame(lambda: _loss(model(x)).backward())
    watched = 0
    with wandb_modprof.profile(model):
        for _ in range(2):
            watched = max(watched, deepest_frame(lambda: _loss(model(x)).backward())[0])
    return watched - plain


def test_hooks_add_frames_per_level_and_the_claim_per_level_covers_them() -> None:
    """The slow path of `_call_impl` adds an `inner()` frame per hooked level: measured ~1 per
    level here, claimed `FRAMES_PER_LEVEL` (2)."""
    per_level = (_extra_depth(80) - _extra_depth(40)) / 40
    assert 1 <= per_level <= stack_room.FRAMES_PER_LEVEL, per_level


def test_the_room_grows_with_nesting_not_with_width() -> None:
    wide = [f"blocks.{i}.fc" for i in range(500)]
    assert stack_room.extra_frames(wide) == stack_room.extra_frames(["a.b.c"])
    assert stack_room.extra_frames(["a" + ".a" * 99]) == 2 * 100 + stack_room.HOOK_FRAMES
    assert stack_room.extra_frames([""]) == stack_room.HOOK_FRAMES  # the root alone
    assert stack_room.extra_frames(["x" + ".x" * 10**6]) == stack_room._MAX_EXTRA  # capped


@pytest.fixture
def base_limit() -> Iterator[int]:
    before = sys.getrecursionlimit()
    assert not stack_room._LEDGER.claims  # no claim left over by an earlier test
    sys.setrecursionlimit(1000)
    yield 1000
    sys.setrecursionlimit(before)


def test_claims_add_up_and_release_in_any_order(base_limit: int) -> None:
    a, b = object(), object()
    stack_room.claim(a, 100)
    stack_room.claim(b, 30)
    assert sys.getrecursionlimit() == base_limit + 130
    stack_room.claim(a, 50)  # a second claim replaces the first
    assert sys.getrecursionlimit() == base_limit + 80
    stack_room.release(a)
    assert sys.getrecursionlimit() == base_limit + 30
    stack_room.release(a)  # releasing twice is harmless
    stack_room.release(b)
    assert sys.getrecursionlimit() == base_limit
    assert not stack_room._LEDGER.claims


def test_a_limit_the_user_sets_meanwhile_is_left_alone(base_limit: int) -> None:
    a, b = object(), object()
    stack_room.claim(a, 100)
    sys.setrecursionlimit(5000)  # the user, while our hooks are on
    stack_room.release(a)
    assert sys.getrecursionlimit() == 5000
    stack_room.claim(b, 40)  # their limit is the new base
    assert sys.getrecursionlimit() == 5040
    stack_room.release(b)
    assert sys.getrecursionlimit() == 5000
