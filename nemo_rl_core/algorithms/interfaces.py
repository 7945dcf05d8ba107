"""Alias kept for NeMo RL imports of ``nemo_rl.algorithms.interfaces.LossFunction``."""

from nemo_rl_core.algorithms.loss.interfaces import LossFunction, LossInputType, LossType

__all__ = ["LossFunction", "LossInputType", "LossType"]
