"""FSDP2 (fully_shard) on a toy transformer built on the meta device, with checkpoint resume.

Run: torchrun --standalone --nproc-per-node 2 correct.py [--dcp-api]
The job trains, saves a full checkpoint, and is started again: the second start
loads the checkpoint into the freshly sharded model and continues.
"""
import argparse
import os
import shutil
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    _init_optim_state,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor


# ----------------------------------------------------------------------------- model
@dataclass
class ModelArgs:
    n_layers: int = 2
    vocab_size: int = 64
    max_seq_len: int = 16
    dim: int = 32
    n_heads: int = 4


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads = args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (w(x).view(b, t, self.n_heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, d))

    def reset_parameters(self):
        for w in (self.wq, self.wk, self.wv, self.wo):
            w.reset_parameters()


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))

    def reset_parameters(self):
        self.w1.reset_parameters()
        self.w2.reset_parameters()


class TransformerBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.feed_forward = FeedForward(args.dim, 4 * args.dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))

    def reset_parameters(self):
        self.attention_norm.reset_parameters()
        self.attention.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.feed_forward.reset_parameters()


class Transformer(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = nn.LayerNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()

    def reset_parameters(self):
        self.tok_embeddings.reset_parameters()
        self.pos_embeddings.reset_parameters()
        self.norm.reset_parameters()
        self.output.reset_parameters()


# ----------------------------------------------------------------------------- checkpoint
MODEL_CHECKPOINT = "model_state_dict.pt"
OPTIM_CHECKPOINT = "optim_state_dict.pt"


class Checkpointer:
    def __init__(self, folder, dcp_api):
        self.root = os.path.join(folder, "dcp_api" if dcp_api else "dtensor_api")
        self.dcp_api = dcp_api
        runs = sorted(int(n) for n in os.listdir(self.root)) if os.path.isdir(self.root) else []
        self.last_training_time = runs[-1] if runs else None
        self.folder = os.path.join(self.root, str(self.last_training_time))

    def is_empty(self):
        return self.last_training_time is None

    def load_model(self, model: FSDPModule):
        full_sd = torch.load(os.path.join(self.folder, MODEL_CHECKPOINT), mmap=True, weights_only=True,
                             map_location="cpu")
        if self.dcp_api:
            set_model_state_dict(model, full_sd,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
            return
        meta_sharded_sd = model.state_dict()
        sharded_sd = {}
        for name, full_tensor in full_sd.items():
            meta_param = meta_sharded_sd[name]
            sharded_sd[name] = nn.Parameter(distribute_tensor(full_tensor, meta_param.device_mesh,
                                                              meta_param.placements))
        # assign=True: the sharded parameters are still on the meta device, copy_ is impossible
        model.load_state_dict(sharded_sd, strict=False, assign=True)

    def load_optim(self, model, opt):
        full_sd = torch.load(os.path.join(self.folder, OPTIM_CHECKPOINT), mmap=True, weights_only=True,
                             map_location="cpu")
        if self.dcp_api:
            set_optimizer_state_dict(model, opt, full_sd,
                                     options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
            return
        _init_optim_state(opt)   # creates the (sharded) state by a zero-lr step, to be overwritten
        sd = opt.state_dict()
        for group, saved_group in zip(sd["param_groups"], full_sd["param_groups"]):
            group.update({k: v for k, v in saved_group.items() if k != "params"})
            for pid, saved_pid in zip(group["params"], saved_group["params"]):
                for attr, full_tensor in full_sd["state"][saved_pid].items():
                    cur = sd["state"][pid][attr]
                    sd["state"][pid][attr] = (distribute_tensor(full_tensor, cur.device_mesh, cur.placements)
                                              if isinstance(cur, DTensor) else full_tensor)
        opt.load_state_dict(sd)

    def _full_model_sd(self, model):
        if self.dcp_api:
            return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        out = {}
        for name, sharded in model.state_dict().items():
            full = sharded.full_tensor()
            if dist.get_rank() == 0:
                out[name] = full.cpu()
        return out

    def _full_optim_sd(self, model, opt):
        if self.dcp_api:
            return get_optimizer_state_dict(model, opt,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        sd = opt.state_dict()
        state = {}
        for pid, pstate in sd["state"].items():
            state[pid] = {k: (v.full_tensor() if isinstance(v, DTensor) else v).cpu() for k, v in pstate.items()}
        return {"param_groups": sd["param_groups"], "state": state} if dist.get_rank() == 0 else {}

    def save(self, model, opt):
        model_sd = self._full_model_sd(model)
        optim_sd = self._full_optim_sd(model, opt)
        if dist.get_rank() == 0:
            new_folder = os.path.join(self.root, str((self.last_training_time or 0) + 1))
            os.makedirs(new_folder, exist_ok=True)
            torch.save(model_sd, os.path.join(new_folder, MODEL_CHECKPOINT))
            torch.save(optim_sd, os.path.join(new_folder, OPTIM_CHECKPOINT))


# ----------------------------------------------------------------------------- main
def train_job(args, model_args, checkpointer, device, steps):
    with torch.device("meta"):
        model = Transformer(model_args)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)

    resumed = not checkpointer.is_empty()
    if not resumed:
        model.to_empty(device=device)
        model.reset_parameters()
    else:
        checkpointer.load_model(model)

    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    if resumed:
        checkpointer.load_optim(model, optim)

    for step in range(steps):
        x = torch.randint(0, model_args.vocab_size, (8, model_args.max_seq_len), device=device)
        y = (3 * x + 1) % model_args.vocab_size
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
        if dist.get_rank() == 0:
            print(f"{'resumed' if resumed else 'first'} run, step {step}: loss {loss.item():.4f}")

    checkpointer.save(model, optim)
    dist.barrier()


def main(args):
    device = torch.device("cpu")
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    model_args = ModelArgs()
    box = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    for _ in range(2):   # first start: from scratch; second start: resumes from the checkpoint
        checkpointer = Checkpointer(box[0], dcp_api=args.dcp_api)
        train_job(args, model_args, checkpointer, device, steps=6)
    if dist.get_rank() == 0:
        shutil.rmtree(box[0], ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="FSDP2 example")
    parser.add_argument("--dcp-api", action="store_true", default=False)
    main(parser.parse_args())
