"""NeMo RL's ``set_seed``: one call fixes what Python, numpy and torch draw next."""

import random

import numpy as np
import torch

from nemo_rl_core.algorithms.utils import set_seed


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_the_same_seed_draws_the_same_and_another_seed_does_not() -> None:
    set_seed(7)
    first = draws()
    set_seed(7)
    assert draws() == first
    set_seed(8)
    other = draws()
    assert all(a != b for a, b in zip(other[:2], first[:2], strict=True))
    assert other[2] != first[2]
