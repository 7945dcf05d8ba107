"""A single-process HF value model (PPO critic) implementing NeMo RL's ``ValueInterface``.

The backbone is a transformers causal-LM body with a scalar head: transformers'
``*ForTokenClassification`` with one label and no dropout, so checkpoints are plain HF
directories (``AutoModelForTokenClassification`` loads them). A head created fresh from a
causal-LM checkpoint starts at zero: every state is worth 0 until trained, and runs are
reproducible without a seed.
"""

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForTokenClassification, PreTrainedModel, PreTrainedTokenizerBase

from nemo_rl_core.algorithms.loss.interfaces import LossFunction
from nemo_rl_core.algorithms.loss.utils import prepare_loss_input
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.interfaces import GenerationDatumSpec
from nemo_rl_core.models.policy.forward_layout import ForwardLayout
from nemo_rl_core.models.policy.hf_loading import load_scalar_head, load_tokenizer
from nemo_rl_core.models.policy.hf_trainer import HFTrainable
from nemo_rl_core.models.value.config import ValueConfig
from nemo_rl_core.models.value.interfaces import ValueInterface, ValueOutputSpec
from nemo_rl_core.utils.timer import Timer

HEAD_SUFFIX = "ForTokenClassification"


def load_value_model(path: str | Path, config: ValueConfig) -> PreTrainedModel:
    """Backbone + scalar head from ``path``; the head is zeroed unless ``path`` saved one."""
    return load_scalar_head(
        AutoModelForTokenClassification, HEAD_SUFFIX, path, config, classifier_dropout=0.0
    )


class HFValue(HFTrainable, ValueInterface):
    """``values[:, t]`` estimates the return from the state before token ``t``: the head reads
    the hidden state of token ``t-1`` (position 0, with no state before it, is 0), the
    alignment GAE in ``nemo_rl_core.algorithms.advantage_estimator`` expects."""

    def __init__(
        self,
        config: ValueConfig,
        tokenizer: PreTrainedTokenizerBase | None = None,
        weights_path: str | Path | None = None,
        optimizer_path: str | Path | None = None,
        init_optimizer: bool = True,
    ) -> None:
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        model = load_value_model(weights_path or config.model_name, config)
        super().__init__(model, tokenizer, config, init_optimizer, optimizer_path)

    def _values(self, layout: ForwardLayout) -> torch.Tensor:
        """``[batch, seq]`` values in float32, shifted so position t reads hidden state t-1."""
        per_token = self.forward(layout).logits.float().squeeze(-1)
        shifted = torch.nn.functional.pad(per_token[:, :-1], (1, 0))
        values = layout.unpack(shifted)
        return torch.cat([torch.zeros_like(values[:, :1]), values[:, 1:]], dim=1)

    def get_values(
        self, data: BatchedDataDict[GenerationDatumSpec], timer: Timer | None = None
    ) -> BatchedDataDict[ValueOutputSpec]:
        return self.map_microbatches(
            data, None, self.model, lambda layout: {"values": self._values(layout).cpu()}
        )

    def _loss_inputs(
        self, mb: BatchedDataDict, layout: ForwardLayout, loss_fn: LossFunction
    ) -> dict[str, torch.Tensor]:
        """The current values [b, S] (aligned as ``get_values``) under the loss's input key."""
        return prepare_loss_input(self._values(layout), mb, loss_fn)[0]

    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None:
        self.model.train()

    def prepare_for_inference(self, *args: Any, **kwargs: Any) -> None:
        self.model.eval()

    def finish_training(self, *args: Any, **kwargs: Any) -> None:
        self.model.eval()

    def shutdown(self) -> bool:
        self.optimizer = self.scheduler = None
        return True
