"""The custom blocks of lesson 16, broken beside fixed. Each carries the tensor-parallel plan it
is split with, `tp_plan()` (as Hugging Face models carry `_tp_plan`): which Linear is split by
its output features (`ColwiseParallel`: each rank computes some of the features) and which by
its input features (`RowwiseParallel`: each rank adds its part, then an all-reduce). That pair
costs one all-reduce in the forward and one more in the backward, for the gradient of the
block's input (runs.py says why; measured in `compare`): two per block in training, more where
several colwise layers read the input (Attention's q, k, v: 1 forward, 3 backward).

Under the default `ColwiseParallel()` a rank's output is a plain tensor holding ITS features
only; with `use_local_output=False` it stays a `DTensor`, which knows it is a shard.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

# Every size divides by 64 ranks. DTensor and the parallel styles are imported where a plan is
# made: the registry imports every lesson, and DTensor costs a process about 2 s to import.
WIDTH, HEADS, HIDDEN, VOCAB, BLOCKS = 64, 4, 256, 1024, 2


class Attention(nn.Module):
    """Broken under tensor parallelism: forward splits q, k and v into `self.heads` heads, the
    head count of the WHOLE model. Each rank holds only its share of q's features."""

    def __init__(self, width: int = WIDTH, heads: int = HEADS):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.heads, self.head_dim = heads, width // heads

    def split(self, t: Tensor) -> Tensor:
        b, s, _ = t.shape
        return t.view(b, s, self.heads, -1).transpose(1, 2)  # (batch, heads, seq, head_dim)

    def forward(self, x: Tensor) -> Tensor:
        y = F.scaled_dot_product_attention(self.split(self.q(x)), self.split(self.k(x)),
                                           self.split(self.v(x)))
        return self.o(y.transpose(1, 2).flatten(2))

    def tp_plan(self) -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                "o": RowwiseParallel()}


class AttentionFixed(Attention):
    """Fixed: the head WIDTH is fixed, the head count is what this rank holds."""

    def split(self, t: Tensor) -> Tensor:
        b, s, _ = t.shape
        return t.view(b, s, -1, self.head_dim).transpose(1, 2)


class NormedMLP(nn.Module):
    """An MLP that normalises its hidden features (an RMS norm) between its two Linear layers.
    Broken under its plan: `up`'s output on a rank is a plain tensor of that rank's features,
    and the mean is taken over them only."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(self.up(x))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)  # over the hidden features
        return self.down(h)

    def tp_plan(self) -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"up": ColwiseParallel(), "down": RowwiseParallel()}


class NormedMLPFixed(NormedMLP):
    """Fixed in the plan: `up` hands on a DTensor, so the mean over the sharded features is a
    DTensor reduction (a partial mean on each rank, all-reduced before it is used)."""

    def tp_plan(self) -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"up": ColwiseParallel(use_local_output=False), "down": RowwiseParallel()}


def silu_times(gate: Tensor, up: Tensor) -> Tensor:
    """A fused gated activation, as a kernel library ships it (here in plain torch)."""
    return F.silu(gate) * up


# An op of its own, as torch.library makes one: DTensor knows nothing of it.
swiglu = torch.library.custom_op("ddp_lab::swiglu", silu_times, mutates_args=())
swiglu.register_fake(lambda gate, up: torch.empty_like(gate))  # the output's shape and dtype


def _swiglu_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, grad: Tensor):
    gate, up = ctx.saved_tensors
    s = torch.sigmoid(gate)
    return grad * up * s * (1 + gate * (1 - s)), grad * F.silu(gate)


swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)
_RULE_REGISTERED = []


def swiglu_rule(gate, up) -> list:
    """swiglu is element-wise: sharded alike on any dimension, its output is sharded the same
    way; whole inputs give a whole output. Each item: ([output placement], [input placements])."""
    from torch.distributed.tensor import Replicate, Shard

    alike = [([Shard(d)], [Shard(d), Shard(d)]) for d in range(gate.ndim)]
    return alike + [([Replicate()], [Replicate(), Replicate()])]


def allow_sharded_swiglu() -> None:
    """The fix: give DTensor the op's sharding rule (for this whole process, once)."""
    from torch.distributed.tensor.experimental import register_sharding

    if not _RULE_REGISTERED:
        register_sharding(torch.ops.ddp_lab.swiglu.default)(swiglu_rule)
        _RULE_REGISTERED.append(True)


class GatedMLP(nn.Module):
    """A gated MLP calling a custom op. Its plan keeps DTensors (as NormedMLPFixed's does), so
    the op receives DTensors: broken, DTensor has no sharding rule for it."""

    def __init__(self):
        super().__init__()
        self.gate, self.up = nn.Linear(WIDTH, HIDDEN), nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(swiglu(self.gate(x), self.up(x)))

    def tp_plan(self) -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"gate": ColwiseParallel(use_local_output=False),
                "up": ColwiseParallel(use_local_output=False), "down": RowwiseParallel()}


class GatedMLPFixed(GatedMLP):
    """Fixed: the block registers its op's sharding rule when it is built."""

    def __init__(self):
        super().__init__()
        allow_sharded_swiglu()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.mlp = AttentionFixed(), MLP()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class TinyLM(nn.Module):
    """A small language model: embedding, blocks, output projection. Its plan names the blocks'
    Linear layers only; what a plan does not name stays whole on every rank."""

    def __init__(self, blocks: int = BLOCKS):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.out = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(x)

    def tp_plan(self) -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        plan = {}
        for i, block in enumerate(self.blocks):
            plan.update({f"blocks.{i}.attn.{n}": s for n, s in block.attn.tp_plan().items()})
            plan.update({f"blocks.{i}.mlp.up": ColwiseParallel(),
                         f"blocks.{i}.mlp.down": RowwiseParallel()})
        return plan


class TinyLMFixed(TinyLM):
    """Fixed: the embedding is split by vocabulary rows, the output projection by vocabulary
    columns (its logits gathered whole), as torchtitan's Llama plan does."""

    def tp_plan(self) -> dict:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"emb": RowwiseParallel(input_layouts=Replicate()),
                "out": ColwiseParallel(output_layouts=Replicate()), **super().tp_plan()}


class Noisy(nn.Module):
    """An MLP block with state that is not a weight: a step counter (a Python int) that anneals
    the noise it adds in training, the generator that noise comes from, and a running mean of
    its output that it subtracts (a buffer registered `persistent=False`: "not a weight")."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH)
        self.steps = 0
        self.noise = torch.Generator().manual_seed(0)
        self.register_buffer("center", torch.zeros(WIDTH), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        y = self.down(F.gelu(self.up(x)))
        if self.training:
            self.steps += 1
            with torch.no_grad():
                self.center.lerp_(y.mean((0, 1)), 1 / self.steps)
            y = y + torch.randn(y.shape, generator=self.noise).to(y.device) / self.steps
        return y - self.center

    def tp_plan(self) -> dict:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"up": ColwiseParallel(), "down": RowwiseParallel()}


def tiny_lm() -> nn.Module:
    return TinyLM()


def tiny_lm_fixed() -> nn.Module:
    return TinyLMFixed()


def features(rank: int) -> Tensor:
    """A batch of 2 sequences of 6 positions. Tensor parallelism splits the weights, not the
    batch: every rank of a tensor-parallel group must be fed the same one (`features(0)`)."""
    return torch.randn(2, 6, WIDTH, generator=torch.Generator().manual_seed(100 + rank))


def tokens(rank: int) -> Tensor:
    return torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(rank))
