"""The config of an on-policy distillation run (NeMo RL's ``nemo_rl.algorithms.distillation.
MasterConfig``), apart from the work of its stages (:mod:`nemo_rl_core.algorithms.distillation`,
which re-exports these names): the config check imports it without torch.
"""

from typing import Annotated, Any

from pydantic import Field, model_validator

from nemo_rl_core.algorithms.config import DistillationLossConfig
from nemo_rl_core.algorithms.grpo_config import RolloutMasterConfig, RolloutScheduleConfig
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.utils.key_support import Wired

_DISTILLATION = "nemo_rl_core.algorithms.distillation"


class DistillationConfig(RolloutScheduleConfig):
    """``distillation:``: NeMo RL's keys and defaults (``distillation_math.yaml``): the
    rollout schedule GRPO has, and how many of the teacher's logits each position keeps."""

    topk_logits_k: Annotated[int, Field(ge=1), Wired(f"{_DISTILLATION}:teacher_topk_logits")] = 64


class DistillationMasterConfig(RolloutMasterConfig):
    """The whole YAML of a distillation run: the student (``policy:``) generates, the
    ``teacher:`` scores its tokens, ``loss_fn:`` is the KL between the two."""

    distillation: DistillationConfig
    teacher: PolicyConfig
    loss_fn: DistillationLossConfig = Field(default_factory=DistillationLossConfig)

    @property
    def algorithm(self) -> DistillationConfig:
        return self.distillation

    @model_validator(mode="before")
    @classmethod
    def _one_teacher(cls, data: Any) -> Any:
        """NeMo RL's cross-tokenizer off-policy distillation shares the ``distillation:``
        section but is its own algorithm (``teachers:``, x-token losses, raw-text data)."""
        if isinstance(data, dict) and data.get("teachers") is not None:
            raise ValueError(
                "teachers: NeMo RL's cross-tokenizer off-policy distillation "
                "(run_xtoken_off_policy_distillation) is not built here; on-policy "
                "distillation takes one teacher: section"
            )
        return data
