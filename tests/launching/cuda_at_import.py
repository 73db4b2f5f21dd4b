"""A module that asks for CUDA at import, as many training scripts do: on a CUDA build of torch
this initialises CUDA in whatever process imports it (tests/test_cuda_init.py preloads it into
the fork server). Nothing else imports it."""
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the line the fork server must name


def where() -> str:
    return DEVICE
