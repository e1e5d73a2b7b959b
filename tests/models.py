"""Test model zoo: small models with the structures that break naive per-module profilers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812  (the PyTorch convention)
from torch import nn
from torch.utils.checkpoint import checkpoint


# ---- ResNet-style (faithful to torchvision's BasicBlock) -------------------------------------
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)  # called twice per forward, in place
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            # shares its input with conv1
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity  # in place, after a module
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(
        self, widths: tuple[int, ...] = (16, 32, 64), num_classes: int = 10, blocks: int = 2
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)  # input needs no grad
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        inplanes = widths[0]
        self.num_stages = len(widths)
        for i, w in enumerate(widths):  # torchvision's names: layer1, layer2, ...
            stride = 1 if i == 0 else 2
            rest = [BasicBlock(w, w) for _ in range(blocks - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(inplanes, w, stride), *rest))
            inplanes = w
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ResNet18(nn.Module):
    """torchvision's resnet18 laid out as torchvision does (a 7x7 stem with max-pool, four
    stages of two `BasicBlock`s, widths 64 to 512), with a dropout before the classifier as
    fine-tuning code adds: 13 top-level nodes with the input and output."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        for i, planes in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            stage = nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes))
            setattr(self, f"layer{i + 1}", stage)
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))


def resnet_input(batch: int = 8, size: int = 32) -> torch.Tensor:
    return torch.randn(batch, 3, size, size)


# ---- transformer with tied embedding / head ---------------------------------------------------
class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder with the head tied to the token embedding."""

    def __init__(
        self,
        vocab: int = 128,
        dim: int = 64,
        heads: int = 4,
        layers: int = 2,
        ctx: int = 32,
        checkpointing: str | None = None,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight
        self.checkpointing = checkpointing  # None, "reentrant" or "non_reentrant"

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            if self.checkpointing is None:
                x = block(x)
            else:
                reentrant = self.checkpointing == "reentrant"
                x = checkpoint(block, x, use_reentrant=reentrant)
        return self.head(self.ln_f(x))


def gpt_input(batch: int = 4, t: int = 32, vocab: int = 128) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, t))


# ---- reuse, frozen layers, kwargs, dict / dataclass outputs, custom Function ------------------
class Reused(nn.Module):
    """One Linear applied three times per forward."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.shared = nn.Linear(dim, dim)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for _ in range(3):
            x = self.act(self.shared(x))
        return x


class FrozenStem(nn.Module):
    """First layers frozen: their backward does nothing; later layers train."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        for p in self.stem.parameters():
            p.requires_grad_(False)
        self.body = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.stem(x))))


class KwargsInner(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, *, hidden: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.lin(hidden) * scale


@dataclass
class Output:
    logits: torch.Tensor
    aux: torch.Tensor


class KwargsDictModel(nn.Module):
    """Tensor passed as kwarg; a submodule returning a dict; a dataclass output."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        self.inner = KwargsInner(dim)
        self.branches = DictBranches(dim)

    def forward(self, x: torch.Tensor) -> Output:
        h = self.inner(hidden=self.embed(x), scale=0.5)
        out = self.branches(h)
        return Output(logits=out["a"] + out["b"], aux=out["b"].pow(2).mean())


class DictBranches(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.a = nn.Linear(dim, dim)
        self.b = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"a": self.a(h), "b": self.b(h)}


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return 3 * x**2 * grad


class CustomFunctionModel(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(Cube.apply(self.lin(x)))


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            raise ValueError("boom")
        return x


class RaisingModel(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.boom = Boom()
        self.out = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.boom(self.lin(x)))


class Branchy(nn.Module):
    """Dynamic control flow: the branch taken depends on an attribute."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(dim, dim)
        self.b = nn.Linear(dim, dim)
        self.use_b = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(x) if self.use_b else self.a(x)


class TwoBranchCat(nn.Module):
    """Two branches from one input, joined by `torch.cat` in the parent's own code."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.left = nn.Linear(dim, dim)
        self.right = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        self.merge = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merge(torch.cat([self.left(x), self.right(x)], dim=-1))


# ---- real third-party models, from config (random weights, nothing downloaded) ---------------
def gpt2_from_config(vocab: int = 512, ctx: int = 64, dim: int = 128, layers: int = 2) -> nn.Module:
    """A small GPT-2 from Hugging Face transformers, dropout off so steps are deterministic."""
    import transformers

    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=ctx,
        n_embd=dim,
        n_layer=layers,
        n_head=4,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config)


# ---- a pause inside one call on one step (issue 15: one pause must not paint a module red) --
class Pausing(nn.Module):
    """A Linear whose forward runs a full `gc.collect()` when `collect_next` is set (then
    clears it): the pause a Python garbage collection puts into whichever call it lands in."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.collect_next = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.collect_next:
            self.collect_next = False
            import gc

            gc.collect()
        return self.fc(x)


class PausedStack(nn.Module):
    """Three Linears of one size in a row, the middle one `Pausing`: its peers do the same
    work, so a colour statistic that a pause does not move matches theirs."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.first = nn.Linear(dim, dim)
        self.middle = Pausing(dim)
        self.last = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.relu(self.middle(torch.relu(self.first(x)))))


# ---- routing: a mixture of experts with one shared activation (issue 15 item 4) ----------
MOE_DIM, BATCH, EXPERTS, TOP_K = 8, 6, 4, 2


def hidden(expert: int) -> int:
    return 16 * (expert + 1)  # every expert's work has its own size: its bytes say whose it is


class Expert(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(MOE_DIM, width)
        self.w2 = nn.Linear(width, MOE_DIM)

    def forward(self, x: torch.Tensor, act: nn.Module) -> torch.Tensor:
        return self.w2(act(self.w1(x)))


class MoE(nn.Module):
    """Top-k routing of the whole batch; one `act_fn` module shared by every expert (as in
    Mixtral-style code run eagerly). The router reads the first `EXPERTS` features, so the
    input picks the experts."""

    def __init__(self) -> None:
        super().__init__()
        self.act_fn = nn.SiLU()  # registered first: its name is `moe.act_fn`, not an expert's
        self.router = nn.Linear(MOE_DIM, EXPERTS, bias=False)
        with torch.no_grad():
            self.router.weight.copy_(torch.eye(EXPERTS, MOE_DIM))
        self.experts = nn.ModuleList(Expert(hidden(e)) for e in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.router(x).mean(0).softmax(-1)
        chosen = weights.topk(TOP_K).indices.tolist()
        out = torch.zeros_like(x)
        for e in sorted(chosen):
            out = out + weights[e] * self.experts[e](x, self.act_fn)
        return out


class MoEModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(MOE_DIM, MOE_DIM)
        self.moe = MoE()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x + self.inp(x))


def routed_input(experts: tuple[int, ...], seed: int) -> torch.Tensor:
    x = torch.randn(BATCH, MOE_DIM, generator=torch.Generator().manual_seed(seed)) * 0.1
    x[:, list(experts)] += 5.0
    return x


SAMPLED_ROUTES = [(2, 3), (0, 3), (1, 2), (2, 3)]


def route_of(step: int) -> tuple[int, int]:
    """1-based steps under `watch(log_freq=2)`: the structure passes run on odd steps (the first,
    then the one after a sample with a new sequence), which route to experts 0 and 1 only;
    experts 2 and 3 run on sampled steps alone."""
    return (0, 1) if step % 2 else SAMPLED_ROUTES[(step // 2 - 1) % len(SAMPLED_ROUTES)]


# ---- mixture of experts: one module per expert, top-k routing ---------------------------------
class MoELayer(nn.Module):
    """A sparse MoE feed-forward layer as most MoE code writes it (transformers 4's Mixtral and
    Qwen2-MoE, DeepSeek-MoE): a linear router picks `top_k` of `experts` MLPs per token; each
    expert hit runs on its tokens and the outputs are summed back weighted by the router."""

    def __init__(self, dim: int = 8, experts: int = 128, top_k: int = 2) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        with torch.no_grad():  # unit rows: a token equal to row e routes first to expert e
            self.router.weight /= self.router.weight.norm(dim=1, keepdim=True)
        self.experts = nn.ModuleList(MLP(dim) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(flat).softmax(-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(flat)
        for e in chosen.unique().tolist():
            token, slot = torch.where(chosen == e)
            y = self.experts[e](flat[token]) * weights[token, slot, None]
            out = out.index_add(0, token, y)
        return x + out.reshape(x.shape)


class MoEStack(nn.Module):
    """`layers` MoE layers; `moe_input` reaches every expert of the first layer."""

    def __init__(self, layers: int = 2, dim: int = 8, experts: int = 128, top_k: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MoELayer(dim, experts, top_k) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def moe_input(model: MoEStack) -> torch.Tensor:
    """One token per expert of the first layer, each its router row: every expert is hit."""
    return model.layers[0].router.weight.detach().clone().unsqueeze(0)


def _big(width: int = 768) -> nn.Module:
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(4)))


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _big()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class Dominated(nn.Module):
    """`body` (a wrapper around a stack of large layers) is nearly all of the time; `head` is
    one tiny layer."""

    def __init__(self) -> None:
        super().__init__()
        self.body = Wrapper()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)[:4, :8])
