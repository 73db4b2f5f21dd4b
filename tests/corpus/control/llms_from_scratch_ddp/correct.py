"""The appendix-style DDP script: a tiny classifier on a toy dataset, DistributedSampler, torchrun.

Run: torchrun --standalone --nproc-per-node 2 correct.py
"""
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup(rank, world_size):
    if "MASTER_ADDR" not in os.environ:
        os.environ["MASTER_ADDR"] = "localhost"
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = "12345"
    init_process_group(backend="gloo", rank=rank, world_size=world_size)


class ToyDataset(Dataset):
    def __init__(self, X, y):
        self.features = X
        self.labels = y

    def __getitem__(self, index):
        return self.features[index], self.labels[index]

    def __len__(self):
        return self.labels.shape[0]


class NeuralNetwork(torch.nn.Module):
    def __init__(self, num_inputs, num_outputs):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(num_inputs, 30),
            torch.nn.ReLU(),
            torch.nn.Linear(30, 20),
            torch.nn.ReLU(),
            torch.nn.Linear(20, num_outputs),
        )

    def forward(self, x):
        return self.layers(x)


def prepare_dataset():
    X_train = torch.tensor([[-1.1, 3.0], [-0.8, 2.7], [-0.4, 2.5], [2.2, -1.0], [2.8, -1.4],
                            [-1.3, 2.8], [2.5, -1.2], [-0.6, 3.1], [2.9, -0.9], [-0.9, 2.4]])
    y_train = torch.tensor([0, 0, 0, 1, 1, 0, 1, 0, 1, 0])
    X_test = torch.tensor([[-0.7, 2.9], [2.4, -1.5]])
    y_test = torch.tensor([0, 1])

    train_ds = ToyDataset(X_train, y_train)
    test_ds = ToyDataset(X_test, y_test)
    train_loader = DataLoader(
        dataset=train_ds,
        batch_size=2,
        shuffle=False,  # the DistributedSampler shuffles
        drop_last=True,
        sampler=DistributedSampler(train_ds),
    )
    test_loader = DataLoader(dataset=test_ds, batch_size=2, shuffle=False)
    return train_loader, test_loader


def compute_accuracy(model, dataloader):
    model = model.eval()
    correct, total = 0.0, 0
    for features, labels in dataloader:
        with torch.no_grad():
            logits = model(features)
        predictions = torch.argmax(logits, dim=1)
        correct += torch.sum(labels == predictions)
        total += len(labels)
    return (correct / total).item()


def main(rank, world_size, num_epochs):
    ddp_setup(rank, world_size)
    train_loader, test_loader = prepare_dataset()
    model = NeuralNetwork(num_inputs=2, num_outputs=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model = DDP(model)

    for epoch in range(num_epochs):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        for features, labels in train_loader:
            logits = model(features)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0:
                print(f"[rank{rank}] Epoch: {epoch + 1:03d}/{num_epochs:03d} | Batchsize {labels.shape[0]:03d} "
                      f"| Train Loss: {loss:.2f}")

    model.eval()
    train_acc = compute_accuracy(model, train_loader)
    test_acc = compute_accuracy(model, test_loader)
    if rank == 0:
        print(f"[rank{rank}] Training accuracy {train_acc:.2f} | Test accuracy {test_acc:.2f}")
    destroy_process_group()


if __name__ == "__main__":
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", 0)))
    if rank == 0:
        print("PyTorch version:", torch.__version__)
    torch.manual_seed(123)
    num_epochs = 4
    main(rank, world_size, num_epochs)
