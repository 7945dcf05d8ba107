"""The loss-function contract of NeMo RL (``nemo_rl.algorithms.loss.interfaces``).

A loss declares what it consumes (``input_type``) and how it normalizes
(``loss_type``); the training backend prepares the matching keyword inputs and passes
the *global* valid sequence/token counts so microbatch losses sum to the batch loss.
"""

import enum
from collections.abc import Mapping, Sequence
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


class MetricNormalizer(enum.Enum):
    """How one metric's per-microbatch values combine into the global-batch value.

    Losses here report every metric either as a share already divided by a global count
    (``loss``, ``probs_ratio``, ...) or as a count (``num_valid_samples``): both SUM.
    MEAN/MAX/MIN are for metrics a caller adds that are local to a microbatch.
    """

    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"

    def reduce(self, values: Sequence[float]) -> float:
        if self is MetricNormalizer.SUM:
            return float(sum(values))
        if self is MetricNormalizer.MEAN:
            return float(sum(values)) / len(values)
        return float(max(values) if self is MetricNormalizer.MAX else min(values))


def default_normalizer(key: str) -> MetricNormalizer:
    """How a metric combines unless told otherwise: ``*_min`` by MIN, ``*_max`` by MAX,
    every other one (a share of a global count, or a count) by SUM."""
    if key.endswith("_min"):
        return MetricNormalizer.MIN
    if key.endswith("_max"):
        return MetricNormalizer.MAX
    return MetricNormalizer.SUM


def aggregate_microbatch_metrics(
    metrics: Sequence[Mapping[str, float]],
    normalizers: Mapping[str, MetricNormalizer] | None = None,
) -> dict[str, float]:
    """Combine the metric dicts of a global batch's microbatches (see
    :func:`default_normalizer`)."""
    normalizers = normalizers or {}
    keys = dict.fromkeys(key for entry in metrics for key in entry)
    return {
        key: normalizers.get(key, default_normalizer(key)).reduce(
            [entry[key] for entry in metrics if key in entry]
        )
        for key in keys
    }
