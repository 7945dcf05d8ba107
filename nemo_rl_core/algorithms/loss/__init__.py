"""NeMo RL's losses (``nemo_rl.algorithms.loss``): one class per algorithm family."""

from nemo_rl_core.algorithms.loss.interfaces import (
    LossFunction,
    LossInputType,
    LossType,
    MetricNormalizer,
    aggregate_microbatch_metrics,
)
from nemo_rl_core.algorithms.loss.loss_functions import (
    ClippedPGLossConfig,
    ClippedPGLossFn,
    DistillationLossConfig,
    DistillationLossFn,
    DPOLossConfig,
    DPOLossFn,
    DraftCrossEntropyLossFn,
    MseValueLossConfig,
    MseValueLossFn,
    NLLLossFn,
    PreferenceLossFn,
    SequencePackingLossWrapper,
)
from nemo_rl_core.algorithms.loss.utils import (
    next_token_logprobs_from_logits,
    prepare_loss_input,
    reduce_token_loss,
)

__all__ = [
    "ClippedPGLossConfig",
    "ClippedPGLossFn",
    "DPOLossConfig",
    "DPOLossFn",
    "DistillationLossConfig",
    "DistillationLossFn",
    "DraftCrossEntropyLossFn",
    "LossFunction",
    "LossInputType",
    "LossType",
    "MetricNormalizer",
    "MseValueLossConfig",
    "MseValueLossFn",
    "NLLLossFn",
    "PreferenceLossFn",
    "SequencePackingLossWrapper",
    "aggregate_microbatch_metrics",
    "next_token_logprobs_from_logits",
    "prepare_loss_input",
    "reduce_token_loss",
]
