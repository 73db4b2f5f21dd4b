"""A nanoGPT-style training script: config globals overridable as --key=value, DDP with
gradient accumulation, optional torch.compile, checkpoints that a restarted job resumes from.

Run: torchrun --standalone --nproc-per-node 2 correct.py [--compile=True]
"""
import inspect
import math
import os
import shutil
import sys
import tempfile
import time
from ast import literal_eval
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# default config values
out_dir = ""  # a fresh temporary folder when empty
eval_interval = 3
log_interval = 1
eval_iters = 4
always_save_checkpoint = True
init_from = "scratch"  # 'scratch' or 'resume'
gradient_accumulation_steps = 4
batch_size = 8
block_size = 16
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0
bias = False
learning_rate = 1e-2
max_iters = 12
restart_at = 6  # the job is stopped after this iteration and started again with init_from='resume'
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 2
lr_decay_iters = 12
min_lr = 1e-3
backend = "gloo"
device = "cpu"
dtype = "float32"
compile = False
compile_backend = "aot_eager"
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
for _arg in sys.argv[1:]:  # poor man's configurator: --key=value
    assert _arg.startswith("--") and "=" in _arg, _arg
    _key, _val = _arg[2:].split("=", 1)
    assert _key in config_keys, f"unknown config key {_key}"
    try:
        _val = literal_eval(_val)
    except (SyntaxError, ValueError):
        pass
    assert type(_val) is type(globals()[_key]), f"type mismatch for {_key}"
    globals()[_key] = _val
config = {k: globals()[k] for k in config_keys}

TEXT = (
    "first citizen: before we proceed any further, hear me speak. all: speak, speak. "
    "first citizen: you are all resolved rather to die than to famish? all: resolved. resolved. "
    "first citizen: first, you know caius marcius is chief enemy to the people. "
) * 6


# ----------------------------------------------------------------------------- model
@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = False


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        use_fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **(dict(fused=True) if use_fused else {}))


# ----------------------------------------------------------------------------- training
def train(init_from, stop_iter, ctx):
    """One start of the job: from scratch or resumed from out_dir/ckpt.pt, up to stop_iter."""
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in TEXT], dtype=np.uint16)
    n = int(0.9 * len(data))
    splits = {"train": data[:n], "val": data[n:]}
    meta_vocab_size = len(chars)

    def get_batch(split):
        d = splits[split]
        ix = torch.randint(len(d) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy(d[i:i + block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(d[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
        return x.to(device), y.to(device)

    iter_num = 0
    best_val_loss = 1e9
    model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias,
                      vocab_size=None, dropout=dropout)
    if init_from == "scratch":
        if master_process:
            print("Initializing a new model from scratch")
        model_args["vocab_size"] = meta_vocab_size
        model = GPT(GPTConfig(**model_args))
    elif init_from == "resume":
        if master_process:
            print(f"Resuming training from {out_dir}")
        checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location=device)
        for k in ["n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size"]:
            model_args[k] = checkpoint["model_args"][k]
        model = GPT(GPTConfig(**model_args))
        model.load_state_dict(checkpoint["model"])
        iter_num = checkpoint["iter_num"]
        best_val_loss = checkpoint["best_val_loss"]
    model.to(device)

    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), "cpu")
    if init_from == "resume":
        optimizer.load_state_dict(checkpoint["optimizer"])
    checkpoint = None

    unoptimized_model = model
    if compile:
        if master_process:
            print("compiling the model...")
        model = torch.compile(model, backend=compile_backend)
    if ddp:
        model = DDP(model)
    raw_model = model.module if ddp else model  # unwrap the DDP container
    if master_process:
        print(f"number of parameters: {sum(p.numel() for p in raw_model.parameters()) / 1e6:.3f}M")

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split)
                with ctx:
                    _, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean()
        model.train()
        return out

    def get_lr(it):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return min_lr + coeff * (learning_rate - min_lr)

    X, Y = get_batch("train")
    t0 = time.time()
    while True:
        lr = get_lr(iter_num) if decay_lr else learning_rate
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        if iter_num % eval_interval == 0 and master_process:
            losses = estimate_loss()
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if losses["val"] < best_val_loss or always_save_checkpoint:
                best_val_loss = losses["val"]
                if iter_num > 0:
                    checkpoint = {
                        "model": raw_model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "model_args": model_args,
                        "iter_num": iter_num,
                        "best_val_loss": best_val_loss,
                        "config": config,
                    }
                    print(f"saving checkpoint to {out_dir}")
                    torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))

        for micro_step in range(gradient_accumulation_steps):
            if ddp:
                # sync gradients only at the last micro step (what no_sync() toggles)
                model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
            with ctx:
                _, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps
            X, Y = get_batch("train")
            loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % log_interval == 0 and master_process:
            # approximate: rank 0's last micro-batch loss, scaled back up
            lossf = loss.item() * gradient_accumulation_steps
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms")
        iter_num += 1
        if iter_num > stop_iter:
            break


def main():
    global out_dir, gradient_accumulation_steps, master_process, ddp
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        init_process_group(backend=backend)
        ddp_rank = int(os.environ["RANK"])
        ddp_world_size = int(os.environ["WORLD_SIZE"])
        master_process = ddp_rank == 0
        seed_offset = ddp_rank
        assert gradient_accumulation_steps % ddp_world_size == 0
        gradient_accumulation_steps //= ddp_world_size
    else:
        master_process = True
        seed_offset = 0
        ddp_world_size = 1
    print_tokens = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
    if master_process:
        print(f"tokens per iteration will be: {print_tokens:,}")
    own_out_dir = not out_dir
    if own_out_dir:
        box = [tempfile.mkdtemp() if master_process else None]
        if ddp:
            dist.broadcast_object_list(box, src=0)
        out_dir = box[0]
    torch.manual_seed(1337 + seed_offset)
    ctx = nullcontext()

    try:
        train(init_from, restart_at, ctx)
        if ddp:
            dist.barrier()  # the restarted job finds the checkpoint rank 0 wrote
        train("resume", max_iters, ctx)
        if ddp:
            dist.barrier()
    finally:
        if own_out_dir and master_process:
            shutil.rmtree(out_dir, ignore_errors=True)
    if ddp:
        destroy_process_group()


if __name__ == "__main__":
    main()
