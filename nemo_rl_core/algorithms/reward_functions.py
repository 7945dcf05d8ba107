"""Reward shaping and scaling of NeMo RL (``nemo_rl.algorithms.reward_functions``, and the
``scale_rewards`` of ``nemo_rl.algorithms.grpo``): what happens to the environments'
``total_reward`` before the advantages.

Both take the batch and their config section, change ``batch["total_reward"]`` and return
the same batch. The configs accept NeMo RL's way of building them in code (partial, then
``cfg["key"] = value``) and are checked when applied; a run's YAML is checked by key
before any work (:func:`reward_shaping_config_problems`).
"""

import warnings
from collections.abc import Mapping
from typing import Annotated, Any, Self

import torch
from pydantic import ConfigDict, model_validator

from nemo_rl_core.algorithms.config import StrictConfig, validate_section
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.utils.config import filled
from nemo_rl_core.utils.key_support import Wired

_SHAPING = "nemo_rl_core.algorithms.reward_functions:apply_reward_shaping"
_SCALING = "nemo_rl_core.algorithms.reward_functions:scale_rewards"
_DAPO_KEYS = ("overlong_buffer_length", "overlong_buffer_penalty", "max_response_length")


class RewardShapingError(ValueError, AssertionError):
    """Reward shaping refused its config or batch.

    NeMo RL raises ValueError for missing DAPO keys and asserts the rest; this is both, so
    either ``except`` of a NeMo RL caller still catches it.
    """


class RewardShapingConfig(StrictConfig):
    """``grpo.reward_shaping:`` (NeMo RL's ``RewardShapingConfig``).

    DAPO's soft overlong punishment: with L = ``max_response_length``, C =
    ``overlong_buffer_length``, P = ``overlong_buffer_penalty`` and a response of n tokens,
    reward += min(0, (L - C - n) / C) * P: nothing up to L - C tokens, then linearly more,
    -P at L tokens, and further down past L. ``stop_properly_penalty_coef`` (in [0, 1])
    replaces it: the rewards of truncated responses are multiplied by the coefficient.
    """

    # Not validated on assignment: NeMo RL builds these in code and sets keys one by one.
    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    enabled: Annotated[bool, Wired(_SHAPING)] = False
    overlong_buffer_length: Annotated[int | None, Wired(_SHAPING)] = None
    overlong_buffer_penalty: Annotated[float | None, Wired(_SHAPING)] = None
    max_response_length: Annotated[int | None, Wired(_SHAPING)] = None
    stop_properly_penalty_coef: Annotated[float | None, Wired(_SHAPING)] = None

    def __getitem__(self, key: str) -> Any:
        return getattr(self, self._field(key))

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, self._field(key), value)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in type(self).model_fields else default

    def _field(self, key: str) -> str:
        if key not in type(self).model_fields:
            raise KeyError(
                f"reward_shaping has no key {key!r}; keys: {list(type(self).model_fields)}"
            )
        return key


def reward_shaping_config_problems(cfg: RewardShapingConfig) -> list[str]:
    """Why reward shaping cannot use ``cfg``, one sentence per problem (none while disabled)."""
    if not cfg.enabled:
        return []
    coef = cfg.stop_properly_penalty_coef
    if coef is not None:
        return (
            [] if 0 <= coef <= 1 else [f"stop_properly_penalty_coef must be in [0, 1], got {coef}"]
        )
    missing = [key for key in _DAPO_KEYS if getattr(cfg, key) is None]
    if missing:
        return [
            f"{', '.join(missing)} unset: only DAPO reward shaping is currently supported, "
            f"which needs {', '.join(_DAPO_KEYS)} (or stop_properly_penalty_coef instead)"
        ]
    bounds = {"overlong_buffer_length": 1, "overlong_buffer_penalty": 0, "max_response_length": 1}
    return [
        f"{key} must be >= {low}, got {getattr(cfg, key)}"
        for key, low in bounds.items()
        if getattr(cfg, key) < low
    ]


def apply_reward_shaping(
    batch: BatchedDataDict, cfg: RewardShapingConfig | Mapping[str, Any]
) -> BatchedDataDict:
    """Shape ``batch["total_reward"]`` in place (a no-op while disabled); the rewards
    before shaping stay in ``unshaped_total_reward`` for dynamic sampling, which filters
    prompt groups on the task's own reward, not on length penalties.

    Response lengths are ``response_token_lengths`` when the batch has them, else the
    tokens of each sample's first assistant turn. The stop-properly penalty reads the
    batch's ``truncated`` flags.
    """
    cfg = validate_section(RewardShapingConfig, cfg, "reward_shaping")
    if not cfg.enabled:
        return batch
    problems = reward_shaping_config_problems(cfg)
    if problems:
        raise RewardShapingError("; ".join(problems))
    rewards = batch["total_reward"]
    batch["unshaped_total_reward"] = rewards.clone()
    if cfg.stop_properly_penalty_coef is not None:
        ignored = [key for key in _DAPO_KEYS if getattr(cfg, key) is not None]
        if ignored:
            warnings.warn(
                f"reward_shaping.stop_properly_penalty_coef is set, so {', '.join(ignored)} "
                "(DAPO's overlong penalty) are ignored; set it to null to use them",
                stacklevel=2,
            )
        if batch.get("truncated") is None:
            raise RewardShapingError(
                "truncated field not found in batch: the stop-properly penalty scales the "
                "rewards of truncated responses"
            )
        truncated = torch.as_tensor(batch["truncated"], dtype=torch.bool, device=rewards.device)
        batch["total_reward"] = torch.where(
            truncated, rewards * cfg.stop_properly_penalty_coef, rewards
        )
        return batch
    lengths = _response_lengths(batch)
    if len(lengths) != len(rewards):
        raise RewardShapingError(
            "The number of messages in the batch must match the number of rewards "
            f"({len(lengths)} responses, {len(rewards)} rewards)"
        )
    buffer = filled(cfg.overlong_buffer_length, "reward_shaping.overlong_buffer_length")
    expected = filled(cfg.max_response_length, "reward_shaping.max_response_length") - buffer
    excess = torch.tensor(lengths, dtype=rewards.dtype, device=rewards.device) - expected
    scale = filled(cfg.overlong_buffer_penalty, "reward_shaping.overlong_buffer_penalty")
    penalty = (-excess / buffer * scale).clamp(max=0)
    batch["total_reward"] = rewards + penalty
    return batch


def _response_lengths(batch: BatchedDataDict) -> list[int]:
    if batch.get("response_token_lengths") is not None:
        return [int(n) for n in batch["response_token_lengths"]]
    lengths = []
    for index, message_log in enumerate(batch["message_log"]):
        first = next((m for m in message_log if m["role"] == "assistant"), None)
        if first is None:
            raise RewardShapingError(
                f"Assistant response not found during reward shaping (sample {index})"
            )
        lengths.append(len(first["token_ids"]))
    return lengths


class RewardScalingConfig(StrictConfig):
    """``grpo.reward_scaling:`` clamp rewards to [source_min, source_max], then map that
    range linearly onto [target_min, target_max] (e.g. DAPO's 0/1 -> -1/1)."""

    enabled: Annotated[bool, Wired(_SCALING)] = False
    source_min: Annotated[float, Wired(_SCALING)] = 0.0
    source_max: Annotated[float, Wired(_SCALING)] = 1.0
    target_min: Annotated[float, Wired(_SCALING)] = 0.0
    target_max: Annotated[float, Wired(_SCALING)] = 1.0

    @model_validator(mode="after")
    def _nonempty_source(self) -> Self:
        if self.source_max <= self.source_min:
            raise ValueError(
                f"source_max ({self.source_max}) must be greater than source_min ({self.source_min})"
            )
        return self


def scale_rewards(
    batch: BatchedDataDict, cfg: RewardScalingConfig | Mapping[str, Any]
) -> BatchedDataDict:
    """Scale ``batch["total_reward"]`` in place (a no-op while disabled), so environments
    with different reward ranges mix."""
    cfg = validate_section(RewardScalingConfig, cfg, "reward_scaling")
    if cfg.enabled:
        clamped = batch["total_reward"].clamp(cfg.source_min, cfg.source_max)
        fraction = (clamped - cfg.source_min) / (cfg.source_max - cfg.source_min)
        batch["total_reward"] = cfg.target_min + fraction * (cfg.target_max - cfg.target_min)
    return batch
