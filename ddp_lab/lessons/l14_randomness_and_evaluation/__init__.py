"""Lesson 14: randomness and evaluation across ranks -- six bugs that train without an error:
one seed for every rank's data and dropout, a random choice DDP never sees, DataLoader workers
that repeat their augmentations, an accuracy skewed by the sampler's padding, a loss logged from
rank 0, a loss normalised by each rank's own count.

`modules` holds the modules, `runs` what each rank runs, `figures` the pictures."""
from __future__ import annotations

from functools import partial

import torch

from ...course.registry import Expect, Lesson, ModuleCase, Scenario, Variant
from .figures import figures
from .modules import (DropoutNet, NumpyJitterNet, OwnDropoutNet, RandomCrops, ShuffledNet,
                      reseed_worker)
from .runs import (DATA_SEED, EVAL_SIZE, INIT_SEED, METHODS, correct_on, crop_offsets, eval_set,
                   evaluate, log_loss, normalised_grads, token_batch, train_dropout, train_shuffled)


def example_input(rank: int):
    """The batch the doctor feeds each rank's module."""
    return torch.randn(8, 8, generator=torch.Generator().manual_seed(rank))


LESSON = Lesson(
    id="14",
    error_class="randomness and evaluation",
    title="Randomness and evaluation across ranks",
    notebook="14_randomness_and_evaluation",
    figures=figures,
    scenarios=[
        Scenario("same_seed", "One seed on every rank: the same dropout masks and batches",
                 broken=Variant(train_dropout, Expect("ok", metric="identical", above=0.99),
                                kwargs={"seed_per_rank": False}),
                 fixed=Variant(train_dropout, Expect("ok", metric="identical", below=0.01),
                               kwargs={"seed_per_rank": True}),
                 summary="every rank drops the same units and draws the same batch; seed the "
                         "initialisation alike, data and dropout with seed + rank",
                 module=ModuleCase(broken=partial(OwnDropoutNet, per_rank=False),
                                   fixed=partial(OwnDropoutNet, per_rank=True),
                                   input=example_input)),
        Scenario("random_choice", "A Python-level random choice DDP never broadcasts",
                 broken=Variant(train_shuffled, Expect("ok", metric="divergence", above=0.1),
                                kwargs={"shared_init_seed": False}),
                 fixed=Variant(train_shuffled, Expect("ok", metric="divergence", below=1e-6),
                               kwargs={"shared_init_seed": True}),
                 summary="random.sample in __init__ on ranks seeded apart builds a different "
                         "network on each; seed Python's random alike before building the model",
                 module=ModuleCase(broken=ShuffledNet, fixed=partial(ShuffledNet, seed=0),
                                   input=example_input)),
        Scenario("worker_seeds", "DataLoader workers repeat each other's random crops",
                 broken=Variant(crop_offsets, Expect("ok", metric="repeated", above=0.5),
                                kwargs={"seed_workers": False}),
                 fixed=Variant(crop_offsets, Expect("ok", metric="repeated", below=0.01),
                               kwargs={"seed_workers": True}),
                 summary="a generator created in the dataset's __init__ is copied into every "
                         "worker of every rank and epoch; reseed it in worker_init_fn",
                 module=ModuleCase(broken=NumpyJitterNet, fixed=partial(NumpyJitterNet, numpy=False),
                                   input=example_input)),
        Scenario("padded_eval", "Accuracy under DistributedSampler's padding",
                 broken=Variant(evaluate, Expect("ok", metric="error", above=0.01),
                                kwargs={"method": "mean_of_ranks"}),
                 fixed=Variant(evaluate, Expect("ok", metric="error", below=1e-9),
                               kwargs={"method": "gather"}),
                 summary="9 samples on 2 ranks: one is counted twice and the ranks' means are "
                         "averaged; gather predictions by index, or all-reduce sums and counts"),
        Scenario("rank0_loss", "The loss logged from rank 0 only",
                 broken=Variant(log_loss, Expect("ok", metric="error", above=0.2),
                                kwargs={"all_reduce": False}),
                 fixed=Variant(log_loss, Expect("ok", metric="error", below=1e-4),
                               kwargs={"all_reduce": True}),
                 summary="rank 0's loss is the loss of its shard; all-reduce it before logging"),
        Scenario("per_rank_normaliser", "A loss normalised by each rank's own token count",
                 broken=Variant(normalised_grads, Expect("ok", metric="error", above=0.1),
                                kwargs={"global_count": False}),
                 fixed=Variant(normalised_grads, Expect("ok", metric="error", below=1e-5),
                               kwargs={"global_count": True}),
                 summary="DDP averages per-rank means: tokens on the emptier rank weigh more; "
                         "divide by the all-reduced count"),
    ],
)

__all__ = ["LESSON", "DATA_SEED", "EVAL_SIZE", "INIT_SEED", "METHODS", "DropoutNet",
           "NumpyJitterNet", "OwnDropoutNet", "RandomCrops", "ShuffledNet", "correct_on",
           "crop_offsets", "eval_set", "evaluate", "example_input", "figures", "log_loss",
           "normalised_grads", "reseed_worker", "token_batch", "train_dropout", "train_shuffled"]
