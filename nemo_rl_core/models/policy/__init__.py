"""Policies behind NeMo RL's ``PolicyInterface``; ``make_policy`` picks the training backend."""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.utils.config import validate_config
from nemo_rl_core.utils.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from nemo_rl_core.models.policy.interfaces import PolicyInterface

__getattr__ = lazy_exports(__name__, {"PolicyInterface": ".interfaces"})


def make_policy(
    config: PolicyConfig | Mapping[str, Any],
    tokenizer: "PreTrainedTokenizerBase | None" = None,
    weights_path: str | Path | None = None,
    optimizer_path: str | Path | None = None,
    init_optimizer: bool = True,
    init_reference_model: bool = True,
) -> "PolicyInterface":
    """The policy for ``config.training_backend``: ``hf`` (torch) or ``megatron`` (megatron-core).

    ``config`` may be NeMo RL's plain ``policy:`` dict; it is validated here. Backends are
    imported lazily so the HF path never needs megatron-core installed.
    """
    if not isinstance(config, PolicyConfig):
        config = validate_config(PolicyConfig, dict(config), source="policy config")
    policy_cls: Callable[..., PolicyInterface]
    if config.training_backend == "megatron":
        from nemo_rl_core.models.policy.megatron_policy import MegatronPolicy

        policy_cls = MegatronPolicy
    else:
        from nemo_rl_core.models.policy.hf_policy import HFPolicy

        policy_cls = HFPolicy
    return policy_cls(
        config,
        tokenizer=tokenizer,
        weights_path=weights_path,
        optimizer_path=optimizer_path,
        init_optimizer=init_optimizer,
        init_reference_model=init_reference_model,
    )


__all__ = ["PolicyConfig", "PolicyInterface", "make_policy"]
