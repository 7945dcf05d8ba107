"""NeMo RL's ``loss_functions`` module path: every loss class and config in one import."""

from nemo_rl_core.algorithms.config import (
    ClippedPGLossConfig,
    DistillationLossConfig,
    DPOLossConfig,
    MseValueLossConfig,
)
from nemo_rl_core.algorithms.loss.clipped_pg import ClippedPGLossFn
from nemo_rl_core.algorithms.loss.distillation import DistillationLossFn
from nemo_rl_core.algorithms.loss.draft import DraftCrossEntropyLossFn
from nemo_rl_core.algorithms.loss.nll import NLLLossFn
from nemo_rl_core.algorithms.loss.preference import DPOLossFn, PreferenceLossFn
from nemo_rl_core.algorithms.loss.sequence_packing import SequencePackingLossWrapper
from nemo_rl_core.algorithms.loss.value import MseValueLossFn

__all__ = [
    "ClippedPGLossConfig",
    "ClippedPGLossFn",
    "DPOLossConfig",
    "DPOLossFn",
    "DistillationLossConfig",
    "DistillationLossFn",
    "DraftCrossEntropyLossFn",
    "MseValueLossConfig",
    "MseValueLossFn",
    "NLLLossFn",
    "PreferenceLossFn",
    "SequencePackingLossWrapper",
]
