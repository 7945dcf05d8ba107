"""The loss-function contract of NeMo RL (``nemo_rl.algorithms.loss.interfaces``).

A loss declares what it consumes (``input_type``) and how it normalizes
(``loss_type``); the training backend prepares the matching keyword inputs and passes
the *global* valid sequence/token counts so microbatch losses sum to the batch loss.
"""

import enum
from typing import Any, Protocol, runtime_checkable

import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class LossType(enum.Enum):
    TOKEN_LEVEL = "token_level"
    SEQUENCE_LEVEL = "sequence_level"


class LossInputType(enum.Enum):
    LOGIT = "logit"
    LOGPROB = "logprob"
    DISTILLATION = "distillation"
    DRAFT = "draft"


@runtime_checkable
class LossFunction(Protocol):
    """Signature for loss functions used in reinforcement learning algorithms.

    Keyword inputs by ``input_type``:
    LOGPROB: ``next_token_logprobs``; LOGIT: ``logits``;
    DISTILLATION: ``student_topk_logprobs``, ``teacher_topk_logprobs``, ``H_all``;
    DRAFT: ``teacher_logits``, ``student_logits``, ``mask``.
    """

    loss_type: LossType
    input_type: LossInputType

    def __call__(
        self,
        data: BatchedDataDict,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, Any]]: ...
