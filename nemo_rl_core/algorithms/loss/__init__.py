"""NeMo RL's losses (``nemo_rl.algorithms.loss``): one class per algorithm family."""

from nemo_rl_core.algorithms.config import ClippedPGLossConfig
from nemo_rl_core.algorithms.loss.clipped_pg import ClippedPGLossFn
from nemo_rl_core.algorithms.loss.interfaces import LossFunction, LossInputType, LossType
from nemo_rl_core.algorithms.loss.nll import NLLLossFn
from nemo_rl_core.algorithms.loss.utils import (
    next_token_logprobs_from_logits,
    prepare_loss_input,
    reduce_token_loss,
)

__all__ = [
    "ClippedPGLossConfig",
    "ClippedPGLossFn",
    "LossFunction",
    "LossInputType",
    "LossType",
    "NLLLossFn",
    "next_token_logprobs_from_logits",
    "prepare_loss_input",
    "reduce_token_loss",
]
