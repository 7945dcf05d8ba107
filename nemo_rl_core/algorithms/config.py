"""Typed configs for the ``loss_fn:`` section and the advantage part of ``grpo:``/``ppo:``.

Keys and defaults are NeMo RL's (``examples/configs/grpo_math_1B.yaml`` and friends), so
a NeMo RL YAML section validates unchanged. Unknown keys and invalid values fail with the
key's dotted path (see :func:`validate_section`).
"""

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nemo_rl_core.utils.key_support import Wired

ConfigT = TypeVar("ConfigT", bound=BaseModel)


class StrictConfig(BaseModel):
    """Base of every config here: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def validate_section(
    model: type[ConfigT], raw: "ConfigT | Mapping[str, Any]", section: str
) -> ConfigT:
    """Validate ``raw`` (a mapping from YAML, or an instance) as ``model``.

    Raises ``ValueError`` whose lines name each bad key as ``section.key.path``.
    """
    if isinstance(raw, model):
        return raw
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{section}: expected a mapping of keys, got {type(raw).__name__}")
    try:
        return model.model_validate(dict(raw))
    except ValidationError as err:
        lines = []
        for error in err.errors():
            path = ".".join(str(part) for part in (section, *error["loc"]))
            named_value = error["loc"] and error["type"] != "missing"
            value = f" (got {error.get('input')!r})" if named_value else ""
            lines.append(f"{path}: {error['msg']}{value}")
        raise ValueError(f"invalid {section} config:\n  " + "\n  ".join(lines)) from None


# ---------------------------------------------------------------- loss_fn: sections


class ClippedPGLossConfig(StrictConfig):
    """``loss_fn:`` of GRPO/PPO (see :class:`~nemo_rl_core.algorithms.loss.ClippedPGLossFn`)."""

    reference_policy_kl_penalty: float = Field(0.01, ge=0.0)
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"
    kl_input_clamp_value: float | None = Field(20.0, gt=0.0)
    kl_output_clamp_value: float | None = Field(10.0, gt=0.0)
    ratio_clip_min: float = Field(0.2, ge=0.0)
    ratio_clip_max: float = Field(0.2, ge=0.0)
    ratio_clip_c: float | None = Field(None, gt=1.0)
    use_on_policy_kl_approximation: bool = False
    use_importance_sampling_correction: bool = False
    truncated_importance_sampling_ratio: float | None = Field(None, gt=0.0)
    truncated_importance_sampling_ratio_min: float | None = Field(None, ge=0.0)
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] = "tis"
    sequence_level_importance_ratios: bool = False
    token_level_loss: bool = True
    force_on_policy_ratio: bool = False
    disable_ppo_ratio: bool = False
    use_cispo: bool = False
    use_kl_in_reward: bool = False
    positive_example_nll_weight: float = Field(0.0, ge=0.0)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.sequence_level_importance_ratios and self.token_level_loss:
            raise ValueError(
                "sequence_level_importance_ratios (GSPO) needs token_level_loss: false"
            )
        ratio_modes = [
            name
            for name in ("force_on_policy_ratio", "disable_ppo_ratio", "use_cispo")
            if getattr(self, name)
        ]
        if len(ratio_modes) > 1:
            raise ValueError(f"{' and '.join(ratio_modes)} are exclusive; set at most one")
        needs_min = self.truncated_importance_sampling_type in ("icepop", "seq-mask-tis")
        if (
            self.truncated_importance_sampling_ratio is not None
            and needs_min
            and self.truncated_importance_sampling_ratio_min is None
        ):
            raise ValueError(
                f"truncated_importance_sampling_type {self.truncated_importance_sampling_type!r}"
                " needs truncated_importance_sampling_ratio_min"
            )
        return self


class DPOLossConfig(StrictConfig):
    """``dpo:`` loss keys of NeMo RL's DPO recipe."""

    reference_policy_kl_penalty: float = Field(0.05, gt=0.0)
    preference_loss_weight: float = Field(1.0, ge=0.0)
    sft_loss_weight: float = Field(0.0, ge=0.0)
    preference_average_log_probs: bool = False
    sft_average_log_probs: bool = False


class DistillationLossConfig(StrictConfig):
    """``loss_fn:`` of on-policy distillation (top-k teacher logits)."""

    kl_type: Literal["forward", "reverse", "mixed"] = "mixed"
    mixed_kl_weight: float = Field(0.5, ge=0.0, le=1.0)
    zero_outside_topk: bool = False


class MseValueLossConfig(StrictConfig):
    """``loss_fn:`` of the PPO value model."""

    value_clip_range: float | None = Field(0.2, gt=0.0)
    token_level_loss: bool = True


# --------------------------------------------------------- advantage part of grpo:/ppo:


class AdvEstimatorConfig(StrictConfig):
    """``grpo.adv_estimator:``. Unset GRPO keys fall back to the top-level ``grpo:`` ones."""

    name: Literal["grpo", "reinforce_plus_plus"] = "grpo"
    normalize_rewards: bool | None = None
    use_leave_one_out_baseline: bool | None = None
    minus_baseline: bool = True
    advantage_clip_low: float | None = None
    advantage_clip_high: float | None = None

    @model_validator(mode="after")
    def _ordered_clip(self) -> Self:
        low, high = self.advantage_clip_low, self.advantage_clip_high
        if low is not None and high is not None and low > high:
            raise ValueError(f"advantage_clip_low ({low}) must be <= advantage_clip_high ({high})")
        return self


_REWARDS = "nemo_rl_core.algorithms.grpo:process_rewards"


class RewardShapingConfig(StrictConfig):
    """``grpo.reward_shaping:`` DAPO's soft overlong penalty."""

    enabled: Annotated[bool, Wired(_REWARDS)] = False
    overlong_buffer_length: Annotated[int, Field(ge=0), Wired(_REWARDS)] = 128
    overlong_buffer_penalty: Annotated[float, Field(ge=0.0), Wired(_REWARDS)] = 1.0
    max_response_length: Annotated[int | None, Field(gt=0), Wired(_REWARDS)] = None

    @model_validator(mode="after")
    def _length_when_enabled(self) -> Self:
        if self.enabled and self.max_response_length is None:
            raise ValueError("max_response_length is required when reward shaping is enabled")
        return self


class RewardScalingConfig(StrictConfig):
    """``grpo.reward_scaling:`` clamp rewards to [source_min, source_max], map linearly
    onto [target_min, target_max]."""

    enabled: Annotated[bool, Wired(_REWARDS)] = False
    source_min: Annotated[float, Wired(_REWARDS)] = 0.0
    source_max: Annotated[float, Wired(_REWARDS)] = 1.0
    target_min: Annotated[float, Wired(_REWARDS)] = 0.0
    target_max: Annotated[float, Wired(_REWARDS)] = 1.0

    @model_validator(mode="after")
    def _nonempty_source(self) -> Self:
        if self.source_max <= self.source_min:
            raise ValueError(
                f"source_max ({self.source_max}) must be greater than source_min ({self.source_min})"
            )
        return self


class GRPOAdvantageConfig(StrictConfig):
    """The advantage/filtering keys of ``grpo:``.

    The full ``grpo:`` section has more keys (steps, batch sizes...); its model should
    subclass this one so these keys keep one definition.
    """

    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True
    adv_estimator: AdvEstimatorConfig = AdvEstimatorConfig()

    def resolved_adv_estimator(self) -> AdvEstimatorConfig:
        """``adv_estimator`` with unset GRPO keys taken from the top-level ``grpo:`` keys."""
        est = self.adv_estimator
        return est.model_copy(
            update={
                "normalize_rewards": self.normalize_rewards
                if est.normalize_rewards is None
                else est.normalize_rewards,
                "use_leave_one_out_baseline": self.use_leave_one_out_baseline
                if est.use_leave_one_out_baseline is None
                else est.use_leave_one_out_baseline,
            }
        )


class PPOAdvantageConfig(StrictConfig):
    """The advantage keys of ``ppo:`` (GAE). Subclass for the full section."""

    gae_gamma: float = Field(1.0, ge=0.0, le=1.0)
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0)
    normalize_advantages: bool = True
    advantage_clip_low: float | None = None
    advantage_clip_high: float | None = None
