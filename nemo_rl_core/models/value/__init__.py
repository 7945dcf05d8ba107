"""Value models behind NeMo RL's ``ValueInterface``; ``make_value_model`` builds one."""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_core.models.value.config import ValueConfig
from nemo_rl_core.utils.config import validate_config
from nemo_rl_core.utils.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from nemo_rl_core.models.value.interfaces import ValueInterface

__getattr__ = lazy_exports(__name__, {"ValueInterface": ".interfaces"})


def make_value_model(
    config: ValueConfig | Mapping[str, Any],
    tokenizer: "PreTrainedTokenizerBase | None" = None,
    weights_path: str | Path | None = None,
    optimizer_path: str | Path | None = None,
    init_optimizer: bool = True,
) -> "ValueInterface":
    """The value model for ``config.training_backend`` (``hf``, or ``megatron`` when present);
    ``config`` may be a plain dict, validated here."""
    if not isinstance(config, ValueConfig):
        config = validate_config(ValueConfig, dict(config), source="value config")
    value_cls: Callable[..., ValueInterface]
    if config.training_backend == "megatron":
        from nemo_rl_core.models.value.megatron_value import MegatronValue

        value_cls = MegatronValue
    else:
        from nemo_rl_core.models.value.hf_value import HFValue

        value_cls = HFValue
    return value_cls(
        config,
        tokenizer=tokenizer,
        weights_path=weights_path,
        optimizer_path=optimizer_path,
        init_optimizer=init_optimizer,
    )


__all__ = ["ValueConfig", "ValueInterface", "make_value_model"]
