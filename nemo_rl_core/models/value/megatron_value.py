"""NeMo RL's value model (PPO critic) on megatron-core, numbers and checkpoints as ``HFValue``.

The trunk is the policy's GPTModel; GPTModel's LM head is replaced by a scalar head
(``score``, as in transformers' ``*ForTokenClassification`` with one label), zero when
starting from a causal-LM checkpoint. ``values[:, t]`` reads the hidden state of token
``t-1`` (position 0 is 0), the alignment GAE expects. Checkpoints load with
``AutoModelForTokenClassification`` and ``HFValue``.
"""

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.interfaces import GenerationDatumSpec
from nemo_rl_core.models.megatron.driver import MegatronDriver
from nemo_rl_core.models.value.config import ValueConfig
from nemo_rl_core.models.value.interfaces import ValueInterface, ValueOutputSpec
from nemo_rl_core.utils.timer import Timer


class MegatronValue(MegatronDriver, ValueInterface):
    """Values and value training on the Megatron backend (any TP x DP layout)."""

    def __init__(
        self,
        config: ValueConfig,
        tokenizer: PreTrainedTokenizerBase | None = None,
        weights_path: str | Path | None = None,
        optimizer_path: str | Path | None = None,
        init_optimizer: bool = True,
    ) -> None:
        super().__init__(
            config,
            "value",
            tokenizer,
            weights_path,
            optimizer_path,
            init_optimizer,
            init_reference_model=False,
        )

    def get_values(
        self, data: BatchedDataDict[GenerationDatumSpec], timer: Timer | None = None
    ) -> BatchedDataDict[ValueOutputSpec]:
        """``values [batch, seq]``; zero at position 0 and past each sample's length."""
        return BatchedDataDict({"values": torch.cat(self._gathered("get_values", data, None))})

    def prepare_for_inference(self, *args: Any, **kwargs: Any) -> None:
        """Ranks switch train/eval mode per call, and each pass brings back the weights an
        offload moved to host memory."""
