"""A minGPT-style character model trained by a Trainer with snapshots, DDP, grad clipping.

Run: torchrun --standalone --nproc-per-node 2 correct.py
"""
import math
import os
import shutil
import tempfile
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, random_split
from torch.utils.data.distributed import DistributedSampler

TEXT = (
    "the quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire. "
    "a small model reads these words one letter at a time and learns which letter comes next. "
    "every worker reads its own share of the lines and the gradients are averaged at each step. "
)


# ----------------------------------------------------------------------------- data
@dataclass
class DataConfig:
    block_size: int = 16
    train_split: float = 0.9
    length: int = 300


class CharDataset(Dataset):
    def __init__(self, cfg: DataConfig):
        data = (TEXT * 4)[: cfg.length]
        chars = sorted(set(data))
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)
        self.block_size = cfg.block_size
        self.data = data

    def __len__(self):
        return len(self.data) - self.block_size

    def __getitem__(self, idx):
        chunk = [self.stoi[c] for c in self.data[idx: idx + self.block_size + 1]]
        return torch.tensor(chunk[:-1]), torch.tensor(chunk[1:])


# ----------------------------------------------------------------------------- model
@dataclass
class GPTConfig:
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    vocab_size: int = 0
    block_size: int = 16
    pdrop: float = 0.1


@dataclass
class OptimizerConfig:
    learning_rate: float = 3e-3
    weight_decay: float = 0.1


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.drop = nn.Dropout(cfg.pdrop)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.drop(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.pdrop))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, cfg.block_size, cfg.n_embd))
        self.drop = nn.Dropout(cfg.pdrop)
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.drop(self.tok_emb(idx) + self.pos_emb[:, :t])
        logits = self.head(self.ln_f(self.blocks(x)))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def create_optimizer(model, cfg: OptimizerConfig):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, 0.95))


# ----------------------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    max_epochs: int = 4
    batch_size: int = 32
    grad_norm_clip: float = 1.0
    snapshot_path: Optional[str] = None
    save_every: int = 2


@dataclass
class Snapshot:
    model_state: "OrderedDict[str, torch.Tensor]"
    optimizer_state: Dict[str, Any]
    finished_epoch: int


class Trainer:
    def __init__(self, cfg: TrainerConfig, model, optimizer, train_dataset, test_dataset=None):
        self.config = cfg
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.train_loader = self._prepare_dataloader(train_dataset)
        self.test_loader = self._prepare_dataloader(test_dataset) if test_dataset else None
        self.epochs_run = 0
        self.model = model
        self.optimizer = optimizer
        self._load_snapshot()
        self.model = DDP(self.model)

    def _prepare_dataloader(self, dataset):
        return DataLoader(dataset, batch_size=self.config.batch_size, shuffle=False,
                          sampler=DistributedSampler(dataset))

    def _load_snapshot(self):
        try:
            with open(self.config.snapshot_path, "rb") as f:
                data = torch.load(f, map_location="cpu")
        except FileNotFoundError:
            if self.global_rank == 0:
                print("snapshot not found, training from scratch")
            return
        snapshot = Snapshot(**data)
        self.model.load_state_dict(snapshot.model_state)
        self.optimizer.load_state_dict(snapshot.optimizer_state)
        self.epochs_run = snapshot.finished_epoch
        if self.global_rank == 0:
            print(f"resuming from snapshot at epoch {self.epochs_run}")

    def _run_batch(self, source, targets, train=True):
        with torch.set_grad_enabled(train):
            _, loss = self.model(source, targets)
        if train:
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_norm_clip)
            self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch, dataloader, train=True):
        if train:
            dataloader.sampler.set_epoch(epoch)
        losses = [self._run_batch(x, y, train) for x, y in dataloader]
        if self.global_rank == 0:
            kind = "Train" if train else "Eval"
            print(f"[RANK0] epoch {epoch} | {kind} loss {sum(losses) / len(losses):.4f}")

    def _save_snapshot(self, epoch):
        raw = self.model.module if hasattr(self.model, "module") else self.model
        snapshot = Snapshot(model_state=raw.state_dict(), optimizer_state=self.optimizer.state_dict(),
                            finished_epoch=epoch)
        torch.save(asdict(snapshot), self.config.snapshot_path)
        print(f"snapshot saved at epoch {epoch}")

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            epoch += 1
            self._run_epoch(epoch, self.train_loader, train=True)
            if self.global_rank == 0 and epoch % self.config.save_every == 0:
                self._save_snapshot(epoch)
            if self.test_loader:
                self._run_epoch(epoch, self.test_loader, train=False)


# ----------------------------------------------------------------------------- main
def ddp_setup():
    init_process_group(backend="gloo")


def get_train_objs(gpt_cfg, opt_cfg, data_cfg):
    dataset = CharDataset(data_cfg)
    train_len = int(len(dataset) * data_cfg.train_split)
    train_set, test_set = random_split(dataset, [train_len, len(dataset) - train_len], generator=torch.Generator().manual_seed(42))
    gpt_cfg.vocab_size = dataset.vocab_size
    gpt_cfg.block_size = dataset.block_size
    model = GPT(gpt_cfg)
    optimizer = create_optimizer(model, opt_cfg)
    return model, optimizer, train_set, test_set


def main():
    ddp_setup()
    box = [tempfile.mkdtemp() if int(os.environ["RANK"]) == 0 else None]
    dist.broadcast_object_list(box, src=0)
    trainer_cfg = TrainerConfig(snapshot_path=os.path.join(box[0], "gpt_snapshot.pt"))
    # run the job, stop it half way, start it again from the snapshot
    for stop_at in (trainer_cfg.max_epochs // 2, trainer_cfg.max_epochs):
        model, optimizer, train_data, test_data = get_train_objs(GPTConfig(), OptimizerConfig(), DataConfig())
        trainer = Trainer(trainer_cfg, model, optimizer, train_data, test_data)
        trainer.train(stop_at)
        dist.barrier()
    if int(os.environ["RANK"]) == 0:
        shutil.rmtree(box[0], ignore_errors=True)
    destroy_process_group()


if __name__ == "__main__":
    main()
