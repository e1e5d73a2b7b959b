"""Models that the capture's assumptions do not fit at first sight, each as a family: lazy
modules (parameters without data until their first forward), `torch.func` (functional calls,
transforms, ensembles with a meta base) and every floating dtype (a model in float64, float16,
bfloat16, or float32 with a float64 and a bfloat16 submodule).

Each is run plainly and instrumented from identical starting points: training stays bitwise
identical, no warning of ours is given except the one a refusal promises, and what can be
measured has numbers in every analysis mode (`records.modes`).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from helpers import disabled_run, hook_counts, no_hooks, ours, recorded_warnings
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import is_lazy

import wandb_modprof
from wandb_modprof import ModProfError
from wandb_modprof.capture.memory.static_memory import build_index
from wandb_modprof.capture.root_hooks import under_transform_text
from wandb_modprof.records.modes import MODES

pytestmark = pytest.mark.usefixtures("isolate_saved_tensor_hooks")

HOW = ("watch", "profile")
STEPS = 4  # watch: a pass, 3 samples; profile: a sample, a pass, 2 samples


@contextmanager
def instrumented(
    model: nn.Module, how: str, optimizer: torch.optim.Optimizer | None = None
) -> Iterator[list[Any]]:
    """Watched with every step sampled, or inside a profile block; yields a list that holds
    the profile and the capture (`hooks.Capture`) once the block ended. Nothing of ours stays
    on the model afterwards (an uncalled lazy module keeps its own pre-hook)."""
    got: list[Any] = []
    if how == "watch":
        handle = wandb_modprof.watch(model, log_freq=1, optimizer=optimizer, run=disabled_run())
        try:
            yield got
        finally:
            got += [handle.unwatch(), handle._capture]
    else:
        block = wandb_modprof.profile(model, optimizer=optimizer)
        with block as prof:
            yield got
        got += [prof, block._capture]
    assert hook_counts(model) == {
        name or "<root>": int(isinstance(m, LazyModuleMixin) and m.has_uninitialized_params())
        for name, m in model.named_modules()
    }


def state(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Parameters, gradients and buffers by name (a lazy one not materialised yet: None)."""
    out: dict[str, torch.Tensor | None] = {}
    for name, p in model.named_parameters():
        if is_lazy(p):
            out[f"param:{name}"] = None
            continue
        out[f"param:{name}"] = p.detach().clone()
        out[f"grad:{name}"] = None if p.grad is None else p.grad.detach().clone()
    for name, b in model.named_buffers():
        out[f"buffer:{name}"] = b.detach().clone()
    return out


def assert_bitwise(a: Any, b: Any, what: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            assert_bitwise(a[k], b[k], f"{what}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise(x, y, f"{what}[{i}]")
    elif a is None or b is None:
        assert a is None and b is None, what
    else:
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), what


def train(model: nn.Module, x: torch.Tensor, optimizer: torch.optim.Optimizer) -> list[Any]:
    """`STEPS` steps; the outputs, and the state after the last backward and after its
    optimizer step."""
    seen: list[Any] = []
    for step in range(STEPS):
        out = model(x)
        out.float().pow(2).mean().backward()
        seen.append(out.detach())
        if step == STEPS - 1:
            seen.append(state(model))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    seen.append(state(model))
    return seen


def twin_run(
    make: Callable[[], nn.Module], x: torch.Tensor, how: str
) -> tuple[Any, list[warnings.WarningMessage]]:
    """Train a fresh `make()` plainly and instrumented (same seeds: lazy modules draw their
    initial values at their first forward); assert the two bitwise equal, return the profile
    and our warnings."""
    runs = {}
    for mode in ("plain", how):
        torch.manual_seed(1234)
        model = make()
        # (SGD with momentum: optimizer state in every dtype; Adam's eps underflows float16)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        with recorded_warnings() as caught:
            if mode == "plain":
                runs[mode] = train(model, x, optimizer)
            else:
                with instrumented(model, how, optimizer) as got:
                    runs[mode] = train(model, x, optimizer)
    assert_bitwise(runs["plain"], runs[how], how)
    return got[0], ours(caught)


def module_rows(prof: Any) -> dict[str, dict[str, Any]]:
    """The table's module nodes by module name (the whole model's calls, in any view)."""
    rows = prof.table().resolved()
    return {
        r["module_name"]: r for r in rows if r["row_kind"] == "node" and r["node_kind"] == "module"
    }


# Every mode a CPU run with an optimizer can measure on any module: all but the ranks'
# imbalance and the load (members of a module list only, `view/load.py`).
MEASURED = [m for m in MODES if m.key not in ("imbalance", "load")]
POSITIVE = ("fwd", "bwd", "fwd_bwd", "param", "grad", "optim", "param_norm", "grad_norm", "flops")


def assert_every_mode_measured(prof: Any, names: list[str]) -> None:
    rows = module_rows(prof)
    for name in names:
        row = rows[name]
        values = {m.key: m.value(row) for m in MEASURED}
        assert all(v is not None for v in values.values()), (name, values, row["missing"])
        assert all(values[k] > 0 for k in POSITIVE), (name, values)  # type: ignore[operator]


# ---- lazy modules -------------------------------------------------------------------------------
def lazy_mlp() -> nn.Module:
    return nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(4))


def lazy_cnn() -> nn.Module:
    return nn.Sequential(
        nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3)
    )


LAZY = {
    "mlp": (lazy_mlp, (3, 5), ["0", "2"]),
    "cnn": (lazy_cnn, (2, 3, 8, 8), ["0", "1", "4"]),
}


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("kind", sorted(LAZY))
def test_lazy_modules_are_profiled_once_materialised(kind: str, how: str) -> None:
    """`nn.LazyLinear` & co. watched or profiled before their first forward: that forward
    materialises them, and from then on they are measured with their real parameter, gradient
    and optimizer bytes. It used to raise a ValueError (an uninitialised parameter's `numel`)
    from `profile` and warn "internal error" under `watch`."""
    make, shape, lazy_names = LAZY[kind]
    x = torch.randn(*shape)
    prof, warned = twin_run(make, x, how)
    assert warned == []
    # The materialising step is not a sample: every sample has the real bytes.
    assert prof.num_samples == STEPS - 2
    model = make()
    model(x)  # (materialised, to compare with)
    params = dict(model.named_modules())
    for name in lazy_names:
        stats = prof.stats()[f"{name}#0"].metrics
        expected = sum(p.numel() * p.element_size() for p in params[name].parameters())
        assert stats["param_bytes"].min == stats["param_bytes"].max == expected
        assert stats["grad_bytes"].min == expected
    assert_every_mode_measured(prof, [n for n in lazy_names if n != "1"])  # (BN: no FLOPs)


def test_the_model_index_leaves_lazy_tensors_out_until_they_hold_data() -> None:
    model = lazy_cnn()
    index = build_index(model)  # used to raise ValueError (an uninitialised parameter's numel)
    assert index.lazy and index.params == []
    assert index.static["<root>"] == (0, 0, 8)  # only num_batches_tracked holds data
    assert index.current(model)
    model(torch.randn(2, 3, 8, 8))
    assert not index.current(model)  # materialised in place: same objects, new data
    rebuilt = build_index(model)
    assert not rebuilt.lazy
    assert rebuilt.static["<root>"][1] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("how", HOW)
def test_a_lazy_module_never_called_does_not_stop_sampling(how: str) -> None:
    """A lazy branch a forward does not take stays uninitialised: left out, the rest measured."""

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(5, 4)
            self.unused = nn.LazyLinear(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.used(x)
            return out

    prof, warned = twin_run(Branchy, torch.randn(3, 5), how)
    assert warned == []
    assert prof.num_samples == STEPS - 1
    assert prof.stats()["used#0"].metrics["param_bytes"].last == (5 * 4 + 4) * 4


# ---- torch.func ----------------------------------------------------------------------------------
def member() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def ensemble_grads(
    models: list[nn.Module], call: Callable[..., torch.Tensor], x: torch.Tensor
) -> list[Any]:
    """The tutorial's ensemble: stacked parameters, one vmapped functional call per step;
    returns the outputs and the stacked gradients."""
    from torch.func import stack_module_state

    params, buffers = stack_module_state(models)
    seen: list[Any] = []
    for _ in range(3):
        out = torch.vmap(call, in_dims=(0, 0, None))(params, buffers, x)
        out.pow(2).sum().backward()
        seen.append(out.detach())
    seen.append({k: v.grad.clone() for k, v in params.items()})  # type: ignore[union-attr]
    return seen


TRANSFORM_TEXT = "under torch.func transforms (vmap, grad, jacrev, jvp, functionalize)"


@pytest.mark.parametrize("how", HOW)
def test_an_ensemble_under_vmap_is_refused_once_and_runs_unchanged(how: str) -> None:
    """`functional_call(models[0], (params, buffers), x)` under `torch.vmap`: functorch's
    wrapper tensors cannot be measured. One warning says so (it used to be a silent 0 samples
    and only `watch`'s generic "no sample completed"); outputs and gradients unchanged."""
    from torch.func import functional_call

    torch.manual_seed(0)
    models = [member() for _ in range(3)]
    x = torch.randn(5, 4)
    watched = models[0]

    def call(p: Any, b: Any, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(watched, (p, b), (x,))
        return out

    expected = ensemble_grads(models, call, x)
    with recorded_warnings() as caught, instrumented(watched, how) as got:
        seen = ensemble_grads(models, call, x)
    assert_bitwise(expected, seen)
    refusals = [w for w in ours(caught) if TRANSFORM_TEXT in str(w.message)]
    assert len(refusals) == 1, [str(w.message) for w in ours(caught)]
    assert str(refusals[0].message) == under_transform_text("Sequential")
    assert refusals[0].filename == __file__  # (at the user's line, not inside torch.func)
    assert not [w for w in ours(caught) if "internal error" in str(w.message)]
    if how == "profile":  # (`unwatch` adds its "no sample completed" line: api/watch.py)
        assert len(ours(caught)) == 1
    assert got[0].num_samples == 0
    assert got[1].transformed_steps == 3  # (what `unwatch`'s no-sample warning could say)
    assert all(p.grad is None for p in watched.parameters())


# (torch's forward-mode AD scripts its decompositions on first use: torch's own warning)
JIT_DEPRECATED = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


@pytest.mark.parametrize(
    "transform", ["grad", "jacrev", pytest.param("jvp", marks=JIT_DEPRECATED), "vmap"]
)
def test_every_torch_func_transform_is_refused_once(transform: str) -> None:
    """Each transform alone, over `functional_call` of a profiled model: one warning for the
    block however many steps, nothing measured, results bitwise unchanged."""
    from torch import func

    torch.manual_seed(0)
    model = member()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(5, 4)

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = func.functional_call(model, p, (x,))
        return out.pow(2).sum()

    def apply() -> Any:
        if transform == "jvp":
            tangents = {k: torch.ones_like(v) for k, v in params.items()}
            return func.jvp(lambda p: loss(p, x), (params,), (tangents,))
        if transform == "vmap":
            return func.vmap(loss, in_dims=(None, 0))(params, x.unsqueeze(1))
        return getattr(func, transform)(loss)(params, x)

    expected = apply()
    with recorded_warnings() as caught, instrumented(model, "profile") as got:
        seen = [apply() for _ in range(3)]
    assert [str(w.message) for w in ours(caught)] == [under_transform_text("Sequential")]
    for result in seen:
        assert_bitwise(expected, result)
    assert got[0].num_samples == 0 and got[1].transformed_steps == 3


@pytest.mark.parametrize("how", HOW)
def test_an_ensembles_meta_base_is_refused_at_the_boundary(how: str) -> None:
    """The tutorial's `base = copy.deepcopy(models[0]).to("meta")`: no data, no device to time.
    Refused with what is not supported and why (it used to say "timing='device' needs a model
    on an accelerator", under the default timing='auto'); nothing stays on it, and the
    ensemble then runs as without the profiler."""
    from torch.func import functional_call

    torch.manual_seed(0)
    models = [member() for _ in range(3)]
    base = copy.deepcopy(models[0]).to("meta")
    x = torch.randn(5, 4)

    def call(p: Any, b: Any, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(base, (p, b), (x,))
        return out

    expected = ensemble_grads(models, call, x)
    with recorded_warnings() as caught:
        with pytest.raises(ModProfError, match=r"meta device .* not profiled") as excinfo:
            if how == "watch":
                wandb_modprof.watch(base, log_freq=1, run=disabled_run())
            else:
                wandb_modprof.profile(base)
        assert "torch.func.stack_module_state ensemble under torch.vmap" in str(excinfo.value)
        assert hook_counts(base) == no_hooks(base)
        assert_bitwise(expected, ensemble_grads(models, call, x))
    assert ours(caught) == []
    if how == "watch":  # not left registered as watched: once it holds data, it is watched
        with recorded_warnings():  # (unwatch: "no sample was taken")
            wandb_modprof.watch(base.to_empty(device="cpu"), run=disabled_run()).unwatch()


@pytest.mark.parametrize("how", HOW)
def test_functional_call_without_a_transform_is_profiled(how: str) -> None:
    """`functional_call(model, params, x)` on its own (meta-learning's fast weights): an
    ordinary forward on the given tensors, profiled in every mode with their gradients, and
    bitwise what it computes unprofiled."""
    from torch.func import functional_call

    x = torch.randn(5, 4)

    def run(instrument: bool) -> tuple[list[Any], Any]:
        torch.manual_seed(0)
        model = member()
        params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
        optimizer = torch.optim.SGD(params.values(), lr=1e-2, momentum=0.9)
        seen: list[Any] = []
        with recorded_warnings() as caught:
            block = (
                instrumented(model, how, optimizer) if instrument else contextlib.nullcontext([])
            )
            with block as got:
                for _ in range(STEPS):
                    out = functional_call(model, params, (x,))
                    out.pow(2).sum().backward()
                    seen.append(out.detach())
                    seen.append({k: v.grad.clone() for k, v in params.items()})  # type: ignore[union-attr]
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
        assert ours(caught) == []
        assert all(p.grad is None for p in model.parameters())  # (the given tensors got them)
        return seen, got[0] if instrument else None

    expected, _ = run(False)
    seen, prof = run(True)
    assert_bitwise(expected, seen)
    assert prof.num_samples == STEPS - 1
    assert_every_mode_measured(prof, ["0", "2"])


# ---- every floating dtype -----------------------------------------------------------------------
class Mixed(nn.Module):
    """float32 with a float64 and a bfloat16 submodule, cast between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 16).double()
        self.c = nn.Linear(16, 8).to(torch.bfloat16)
        self.d = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        h = self.b(h.double()).float()
        h = self.c(h.to(torch.bfloat16)).float()
        out: torch.Tensor = self.d(h)
        return out


def in_dtype(dtype: torch.dtype) -> Callable[[], nn.Module]:
    # ops with CPU kernels in float16 and bfloat16 (torch 2.13): linear, layer_norm, gelu
    return lambda: nn.Sequential(
        nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)
    ).to(dtype)


DTYPES: dict[str, tuple[Callable[[], nn.Module], torch.dtype, list[str]]] = {
    "float64": (in_dtype(torch.float64), torch.float64, ["0", "3"]),
    "float16": (in_dtype(torch.float16), torch.float16, ["0", "3"]),
    "bfloat16": (in_dtype(torch.bfloat16), torch.bfloat16, ["0", "3"]),
    "mixed": (Mixed, torch.float32, ["a", "b", "c", "d"]),
}


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("kind", list(DTYPES))
def test_every_floating_dtype_is_measured_in_every_mode(kind: str, how: str) -> None:
    """Times, activation / parameter / gradient / optimizer bytes, norms and FLOPs of the
    modules that work in each dtype (float64 was once never sampled: its norms were asked for
    in float32), with no warning, training bitwise unchanged."""
    make, dtype, names = DTYPES[kind]
    prof, warned = twin_run(make, torch.randn(4, 8, dtype=dtype), how)
    assert warned == []
    assert prof.num_samples == STEPS - 1  # (watch: a pass first; profile: one second)
    assert_every_mode_measured(prof, names)
    rows = module_rows(prof)
    assert rows[names[0]]["act_bytes"] == 4 * 8 * dtype.itemsize  # its input, in its dtype
    if kind == "mixed":
        for name, size in (("b", 8), ("c", 2)):
            params = (16 * 16 + 16) if name == "b" else (16 * 8 + 8)
            assert rows[name]["param_bytes"] == params * size


@pytest.mark.parametrize(
    "first, log_freq, structure",
    [("a structure pass", 2, True), ("a sample", 1, True), ("a plain step", 3, False)],
)
@pytest.mark.parametrize("kind", sorted(LAZY))
def test_lazy_modules_work_whichever_step_comes_first(
    kind: str, first: str, log_freq: int, structure: bool
) -> None:
    """Watched before their first forward, whatever that first step is. A structure pass due on
    it waits for a later step: `materialize()` under the pass's dispatch mode raised
    "Multiple dispatch failed for 'torch.ops.aten.detach'" into the training loop."""
    make, shape, lazy_names = LAZY[kind]
    x = torch.randn(*shape)
    runs: dict[str, list[Any]] = {}
    for mode in ("plain", "watch"):
        torch.manual_seed(1234)
        model = make()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        with recorded_warnings() as caught:
            if mode == "plain":
                runs[mode] = [train(model, x, optimizer), train(model, x, optimizer)]
                continue
            handle = wandb_modprof.watch(
                model, log_freq=log_freq, structure=structure, run=disabled_run()
            )
            runs[mode] = [train(model, x, optimizer), train(model, x, optimizer)]
            prof = handle.unwatch()
    assert_bitwise(runs["plain"], runs["watch"], first)
    assert ours(caught) == []
    assert prof.num_samples >= 2
    if structure:  # the pass ran once the modules held data: every lazy layer has its FLOPs
        rows = module_rows(prof)
        for name in lazy_names:
            if name != "1":  # (BatchNorm: no FLOPs counted)
                assert (rows[name]["fwd_flops"] or 0) > 0, (name, rows[name]["missing"])
