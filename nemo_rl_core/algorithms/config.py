"""Typed configs for the ``loss_fn:`` section and the advantage part of ``grpo:``/``ppo:``.

Keys and defaults are NeMo RL's (``examples/configs/grpo_math_1B.yaml`` and friends), so
a NeMo RL YAML section validates unchanged. Unknown keys and invalid values fail with the
key's dotted path (see :func:`~nemo_rl_core.config.base.validate_section`).
"""

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.data.config import DEFAULT_VALIDATION_SET
from nemo_rl_core.utils.key_support import Wired

# ---------------------------------------------------------------- loss_fn: sections

_PG = "nemo_rl_core.algorithms.loss.clipped_pg:ClippedPGLossFn"
_DPO = "nemo_rl_core.algorithms.loss.preference:DPOLossFn"
_DISTILL = "nemo_rl_core.algorithms.loss.distillation:DistillationLossFn"
_VALUE = "nemo_rl_core.algorithms.loss.value:MseValueLossFn"


class ClippedPGLossConfig(StrictConfig):
    """``loss_fn:`` of GRPO/PPO (see :class:`~nemo_rl_core.algorithms.loss.ClippedPGLossFn`).

    Combinations NeMo RL refuses are checked by the loss
    (``clipped_pg_config_problems``) and, key by key, when a run's config is validated.
    """

    reference_policy_kl_penalty: Annotated[float, Field(ge=0.0), Wired(_PG)] = 0.01
    reference_policy_kl_type: Annotated[Literal["k1", "k2", "k3"], Wired(_PG)] = "k3"
    kl_input_clamp_value: Annotated[float | None, Field(gt=0.0), Wired(_PG)] = 20.0
    kl_output_clamp_value: Annotated[float | None, Field(gt=0.0), Wired(_PG)] = 10.0
    ratio_clip_min: Annotated[float, Field(ge=0.0), Wired(_PG)] = 0.2
    ratio_clip_max: Annotated[float, Field(ge=0.0), Wired(_PG)] = 0.2
    ratio_clip_c: Annotated[float | None, Wired(_PG)] = None
    use_on_policy_kl_approximation: Annotated[bool, Wired(_PG)] = False
    use_importance_sampling_correction: Annotated[bool, Wired(_PG)] = False
    truncated_importance_sampling_ratio: Annotated[float | None, Wired(_PG)] = None
    truncated_importance_sampling_ratio_min: Annotated[float | None, Wired(_PG)] = None
    truncated_importance_sampling_type: Annotated[
        Literal["tis", "icepop", "seq-mask-tis"] | None, Wired(_PG)
    ] = None
    sequence_level_importance_ratios: Annotated[bool, Wired(_PG)] = False
    token_level_loss: Annotated[bool, Wired(_PG)] = True
    force_on_policy_ratio: Annotated[bool, Wired(_PG)] = False
    disable_ppo_ratio: Annotated[bool, Wired(_PG)] = False
    use_cispo: Annotated[bool, Wired(_PG)] = False
    use_kl_in_reward: Annotated[bool, Wired(_PG)] = False
    positive_example_nll_weight: Annotated[float, Field(ge=0.0), Wired(_PG)] = 0.0


def clipped_pg_config_problems(cfg: ClippedPGLossConfig) -> list[tuple[str, str]]:
    """``(key, why)`` for each combination of ``loss_fn:`` keys NeMo RL refuses. The loss
    asserts them (NeMo RL's AssertionError); config validation reports them by key."""
    problems: list[tuple[str, str]] = []
    if cfg.sequence_level_importance_ratios and cfg.token_level_loss:
        problems.append(
            (
                "sequence_level_importance_ratios",
                "sequence-level importance sampling (GSPO) is mutually exclusive with "
                "token-level loss: set token_level_loss: false",
            )
        )
    if cfg.use_cispo:
        for key, why in (
            ("disable_ppo_ratio", "CISPO needs the pi/pi_old ratio that it removes"),
            ("force_on_policy_ratio", "a ratio forced to 1 removes CISPO's clipped IS weight"),
            ("sequence_level_importance_ratios", "CISPO uses token-level importance weights"),
        ):
            if getattr(cfg, key):
                problems.append((key, f"use_cispo is incompatible with {key}: {why}"))
        if cfg.ratio_clip_c is not None:
            problems.append(
                (
                    "ratio_clip_c",
                    "use_cispo is incompatible with dual clipping (ratio_clip_c): it would "
                    "overwrite the CISPO loss; set ratio_clip_c: null",
                )
            )
        if not cfg.token_level_loss:
            problems.append(("token_level_loss", "use_cispo requires token_level_loss: true"))
    kind, high = cfg.truncated_importance_sampling_type, cfg.truncated_importance_sampling_ratio
    low = cfg.truncated_importance_sampling_ratio_min
    if kind is not None:
        key = "truncated_importance_sampling_type"
        if not cfg.use_importance_sampling_correction:
            problems.append(
                (
                    key,
                    "truncated importance sampling is only supported when "
                    "use_importance_sampling_correction is True",
                )
            )
        if high is None or high <= 0:
            problems.append(
                (
                    "truncated_importance_sampling_ratio",
                    "truncated_importance_sampling_ratio should be positive",
                )
            )
        elif low is not None and low > high:
            problems.append(
                (
                    "truncated_importance_sampling_ratio_min",
                    "truncated_importance_sampling_ratio_min must be <= "
                    "truncated_importance_sampling_ratio",
                )
            )
        if kind in ("icepop", "seq-mask-tis") and low is None:
            problems.append(
                (
                    "truncated_importance_sampling_ratio_min",
                    f"truncated_importance_sampling_ratio_min should be set when "
                    f"truncated_importance_sampling_type is {kind!r}",
                )
            )
        if kind == "seq-mask-tis" and cfg.sequence_level_importance_ratios:
            problems.append(
                (
                    key,
                    "seq-mask-tis uses token-level IS correction with sequence-level masking "
                    "and is incompatible with sequence_level_importance_ratios=True",
                )
            )
    if cfg.ratio_clip_c is not None and cfg.ratio_clip_c <= 1:
        problems.append(
            (
                "ratio_clip_c",
                f"ratio_clip_c must exceed 1 (a lower bound of the ratios), got {cfg.ratio_clip_c}",
            )
        )
    return problems


def preference_validation_prefix(set_name: str) -> str:
    """NeMo RL's prefix of one validation set's metrics in DPO and reward-model runs:
    ``validation-<name>_``, the name a key of ``data.val_data_paths`` or, for
    ``data.validation``, "default"."""
    return f"validation-{set_name}_"


# data.validation's metrics, which NeMo RL's dpo.yaml and rm.yaml rank checkpoints by
# (metric_name: val:validation-default_loss).
PREFERENCE_VALIDATION_PREFIX = preference_validation_prefix(DEFAULT_VALIDATION_SET)


class DPOLossConfig(StrictConfig):
    """The loss keys of NeMo RL's ``dpo:`` section (``DPOLossFn``)."""

    reference_policy_kl_penalty: Annotated[float, Field(ge=0.0), Wired(_DPO)] = 0.05
    preference_loss_weight: Annotated[float, Field(ge=0.0), Wired(_DPO)] = 1.0
    sft_loss_weight: Annotated[float, Field(ge=0.0), Wired(_DPO)] = 0.0
    preference_average_log_probs: Annotated[bool, Wired(_DPO)] = False
    sft_average_log_probs: Annotated[bool, Wired(_DPO)] = False


class DistillationLossConfig(StrictConfig):
    """``loss_fn:`` of on-policy distillation (top-k teacher logits)."""

    kl_type: Annotated[Literal["forward", "reverse", "mixed"], Wired(_DISTILL)] = "mixed"
    mixed_kl_weight: Annotated[float, Field(ge=0.0, le=1.0), Wired(_DISTILL)] = 0.5
    zero_outside_topk: Annotated[bool, Wired(_DISTILL)] = False


class MseValueLossConfig(StrictConfig):
    """``value_loss_fn:`` of PPO's value model: 0.5 * ``scale`` * MSE to the returns, the
    prediction clipped to ``cliprange`` around the old values when set."""

    scale: Annotated[float, Wired(_VALUE)] = 1.0
    cliprange: Annotated[float | None, Wired(_VALUE)] = None


# --------------------------------------------------------- advantage part of grpo:/ppo:


_ESTIMATOR = "nemo_rl_core.algorithms.advantage_estimator"


class AdvEstimatorConfig(StrictConfig):
    """``grpo.adv_estimator:``. Unset GRPO keys fall back to the top-level ``grpo:`` ones."""

    name: Annotated[
        Literal["grpo", "reinforce_plus_plus", "gdpo"],
        Wired(f"{_ESTIMATOR}:create_advantage_estimator"),
    ] = "grpo"
    normalize_rewards: Annotated[bool | None, Wired(f"{_ESTIMATOR}:GRPOAdvantageEstimator")] = None
    use_leave_one_out_baseline: Annotated[
        bool | None, Wired(f"{_ESTIMATOR}:GRPOAdvantageEstimator")
    ] = None
    minus_baseline: Annotated[bool, Wired(f"{_ESTIMATOR}:ReinforcePlusPlusAdvantageEstimator")] = (
        True
    )


class GRPOAdvantageConfig(StrictConfig):
    """The advantage keys of ``grpo:``; the full section (``GRPOConfig``) subclasses it."""

    normalize_rewards: Annotated[bool, Wired(f"{_ESTIMATOR}:GRPOAdvantageEstimator")] = True
    use_leave_one_out_baseline: Annotated[bool, Wired(f"{_ESTIMATOR}:GRPOAdvantageEstimator")] = (
        True
    )
    advantage_clip_low: Annotated[
        float | None, Wired("nemo_rl_core.algorithms.grpo:clip_advantages")
    ] = None
    advantage_clip_high: Annotated[
        float | None, Wired("nemo_rl_core.algorithms.grpo:clip_advantages")
    ] = None
    adv_estimator: AdvEstimatorConfig = Field(default_factory=AdvEstimatorConfig)

    @model_validator(mode="after")
    def _ordered_clip(self) -> Self:
        low, high = self.advantage_clip_low, self.advantage_clip_high
        if low is not None and high is not None and low > high:
            raise ValueError(f"advantage_clip_low ({low}) must be <= advantage_clip_high ({high})")
        return self

    def resolved_adv_estimator(self) -> AdvEstimatorConfig:
        """``adv_estimator`` with unset GRPO keys taken from the top-level ``grpo:`` keys."""
        est = self.adv_estimator
        updates = {
            key: getattr(self, key)
            for key in ("normalize_rewards", "use_leave_one_out_baseline")
            if getattr(est, key) is None
        }
        return est.model_copy(update=updates)


_GAE = "nemo_rl_core.algorithms.advantage_estimator:GeneralizedAdvantageEstimator"


class PPOAdvEstimatorConfig(StrictConfig):
    """``ppo.adv_estimator:``: GAE (with VAPO's decoupled and length-adaptive lambdas) or
    the raw reward as the advantage."""

    name: Annotated[
        Literal["gae", "raw_reward"],
        Wired("nemo_rl_core.algorithms.advantage_estimator:create_advantage_estimator"),
    ] = "gae"
    gae_lambda: Annotated[float, Field(ge=0.0, le=1.0), Wired(_GAE)] = 0.95
    gae_gamma: Annotated[float, Field(ge=0.0, le=1.0), Wired(_GAE)] = 1.0
    normalize_advantages: Annotated[bool, Wired(_GAE)] = True
    gae_lambda_value: Annotated[float | None, Field(ge=0.0, le=1.0), Wired(_GAE)] = None
    gae_lambda_policy: Annotated[float | None, Field(ge=0.0, le=1.0), Wired(_GAE)] = None
    length_adaptive_alpha: Annotated[float, Field(ge=0.0), Wired(_GAE)] = 0.0
