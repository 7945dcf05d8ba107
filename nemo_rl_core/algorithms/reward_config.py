"""The config of NeMo RL's reward shaping and scaling (``grpo.reward_shaping:``,
``grpo.reward_scaling:``), apart from the functions that apply them
(:mod:`nemo_rl_core.algorithms.reward_functions`, which re-exports these names): the
config check imports it without torch.
"""

from typing import Annotated, Any, Self

from pydantic import ConfigDict, model_validator

from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.utils.key_support import Wired

_SHAPING = "nemo_rl_core.algorithms.reward_functions:apply_reward_shaping"
_SCALING = "nemo_rl_core.algorithms.reward_functions:scale_rewards"
DAPO_KEYS = ("overlong_buffer_length", "overlong_buffer_penalty", "max_response_length")


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
    missing = [key for key in DAPO_KEYS if getattr(cfg, key) is None]
    if missing:
        return [
            f"{', '.join(missing)} unset: only DAPO reward shaping is currently supported, "
            f"which needs {', '.join(DAPO_KEYS)} (or stop_properly_penalty_coef instead)"
        ]
    bounds = {"overlong_buffer_length": 1, "overlong_buffer_penalty": 0, "max_response_length": 1}
    return [
        f"{key} must be >= {low}, got {getattr(cfg, key)}"
        for key, low in bounds.items()
        if getattr(cfg, key) < low
    ]


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
        """Only while scaling is on: NeMo RL reads the range of nothing else."""
        if self.enabled and self.source_max <= self.source_min:
            raise ValueError(
                f"source_max ({self.source_max}) must be greater than source_min ({self.source_min})"
            )
        return self
