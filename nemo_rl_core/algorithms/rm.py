"""Reward-model training (NeMo RL's ``nemo_rl.algorithms.rm``): its validation (its config
is :mod:`~nemo_rl_core.algorithms.rm_config`'s, re-exported here by NeMo RL's names).

NeMo RL's ``rm_train`` trains a scalar-head model (``policy.reward_model_cfg``) with the
Bradley-Terry loss (``PreferenceLossFn``) on preference pairs: the chosen response should
score above the rejected one. The data, the batches and the validation are DPO's
(:mod:`nemo_rl_core.algorithms.dpo`) without the reference policy; the committed
checkpoint is an HF folder that ``AutoModelForSequenceClassification`` loads, which
GRPO's ``reward_model`` environment can score with.
"""

from collections.abc import Iterator, Mapping
from typing import Any

from nemo_rl_core.algorithms.dpo import validation_metrics

# NeMo RL names the config classes here; they live apart so that the config check loads
# no torch.
from nemo_rl_core.algorithms.rm_config import RMConfig, RMMasterConfig  # noqa: F401
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.policy.interfaces import PolicyInterface

MasterConfig = RMMasterConfig  # NeMo RL's name for it in this module

# PreferenceLossFn's metrics NeMo RL's rm validation reports
VALIDATION_METRICS = ("loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean")


def reward_validation(
    policy: PolicyInterface,
    sets: Mapping[str, Iterator[BatchedDataDict]],
    loss_fn: Any,
    config: Any,
) -> dict[str, float]:
    """Bradley-Terry loss, accuracy and mean rewards on each named set of held-out pairs
    (no reference), as ``validation-<set>_<metric>``."""
    return validation_metrics(
        policy, sets, loss_fn, config, names=VALIDATION_METRICS, with_reference=False
    )
