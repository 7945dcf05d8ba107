"""The value model's config section: the policy's training keys, nothing generation-related.

A PPO critic is trained like the policy (same optimizer, scheduler, batching and
precision keys), so a ``value:`` section reads like a ``policy:`` one.
"""

from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import Field, model_validator

from nemo_rl_core.models.policy.config import StrictModel, TokenizerConfig, TrainedModelConfig
from nemo_rl_core.utils.key_support import Check, Only, ReadWhile, SupportContext


def _as_policy_tokenizer(value: Any, context: SupportContext) -> str | None:
    name = context.key.rpartition(".")[2]
    wanted = context.value(f"policy.tokenizer.{name}")
    if value == wanted:
        return None
    return (
        "the value model reads the policy's tokens (NeMo RL hands it the policy's tokenizer "
        f"too), so this key cannot differ: set it to policy.tokenizer.{name}={wanted!r}"
    )


_AS_POLICY = Check(_as_policy_tokenizer, "the policy's tokenizer serves the value model")


class ValueTokenizerConfig(TokenizerConfig):
    """``value.tokenizer``: the policy's tokenizer encodes what the value model reads."""

    name: Annotated[str | None, _AS_POLICY] = None
    chat_template: Annotated[str | None, _AS_POLICY] = "default"
    chat_template_kwargs: Annotated[dict[str, Any] | None, _AS_POLICY] = None


class ValueHeadConfig(StrictModel):
    """``value.reward_model_cfg``: NeMo RL builds its HF (DTensor) critic as a regression
    reward model and requires exactly these values; so does the value model here (a scalar
    head). Its Megatron critic always has that head and never reads the section."""

    read_while: ClassVar[ReadWhile] = ReadWhile(
        lambda section, context: context.sibling_value("training_backend") == "hf",
        still_read=(),
    )

    enabled: Annotated[
        bool, Only(True, reason="the value model is a scalar regression head on the backbone")
    ] = True
    reward_model_type: Annotated[
        Literal["regression", "bradley_terry"],
        Only("regression", reason="a critic predicts returns: a regression head"),
    ] = "regression"


class ValueConfig(TrainedModelConfig):
    """``value:``: ``model_name`` is the policy's model (or checkpoint) to start the backbone
    from, or a separate model directory; a saved value checkpoint restores its head too."""

    tokenizer: ValueTokenizerConfig = Field(default_factory=ValueTokenizerConfig)
    reward_model_cfg: ValueHeadConfig = Field(default_factory=ValueHeadConfig)

    @model_validator(mode="after")
    def _no_lora(self) -> Self:
        lora = self.dtensor_cfg.lora_cfg
        if lora is not None and lora.enabled and self.training_backend == "hf":
            raise ValueError(
                "dtensor_cfg.lora_cfg.enabled: LoRA is built for the policy, not the value "
                "model (its scalar head trains with the whole backbone)"
            )
        return self
