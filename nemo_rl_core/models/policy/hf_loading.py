"""Loading HF models and tokenizers for training, with the checks a silent failure would skip.

Weights stay in float32 (master weights); ``precision: bfloat16`` runs the forward under
autocast, as NeMo RL's FSDP mixed precision does, so small RL updates are not rounded away.
"""

import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import (
    AutoConfig,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from nemo_rl_core.data.chat_templates import configure_chat_template
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.models.policy.config import (
    TokenizerConfig,
    TrainedModelConfig,
    attention_implementation,
)
from nemo_rl_core.models.policy.utils import VocabMismatchError

if TYPE_CHECKING:  # peft loads only where LoRA is used
    from peft import PeftModel


def load_tokenizer(config: TrainedModelConfig) -> PreTrainedTokenizerBase:
    """The tokenizer of a model's ``tokenizer:`` section (``name`` defaults to the model's)."""
    return build_tokenizer(config.tokenizer, config.tokenizer.name or config.model_name)


def build_tokenizer(
    settings: TokenizerConfig, name: str, key: str = "policy.tokenizer"
) -> PreTrainedTokenizerBase:
    """The tokenizer as NeMo RL's ``get_tokenizer`` makes it: loaded by ``name``, its
    template chosen by ``chat_template``, ``chat_template_kwargs`` bound into every
    ``apply_chat_template`` call, and the eos token as pad token if it has none. ``key``
    names the section in errors."""
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(name)))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if settings.chat_template_kwargs:
        # Bound on this instance on purpose, so every caller's template gets the kwargs.
        tokenizer.apply_chat_template = partial(  # type: ignore[method-assign]
            tokenizer.apply_chat_template, **settings.chat_template_kwargs
        )
    return configure_chat_template(tokenizer, settings.chat_template, f"{key}.chat_template")


def load_hf_config(
    path: str | Path, config: TrainedModelConfig, **config_overrides: Any
) -> PretrainedConfig:
    """The model's HF config with ``hf_config_overrides`` and ``config_overrides`` set on it,
    the one both training backends build their model from."""
    hf_config = AutoConfig.from_pretrained(str(path))
    for key, value in {**config.hf_config_overrides, **config_overrides}.items():
        setattr(hf_config, key, value)
    return hf_config


def load_pretrained(
    model_cls: Any, path: str | Path, config: TrainedModelConfig, **config_overrides: Any
) -> PreTrainedModel:
    """``model_cls.from_pretrained`` from a checked local directory, float32, the attention of
    ``dtensor_cfg.automodel_kwargs`` (sdpa unless it says eager).

    ``policy.hf_config_overrides`` and ``config_overrides`` are set on the HF config first.
    """
    directory = resolve_model(str(path))
    hf_config = load_hf_config(directory, config, **config_overrides)
    model = model_cls.from_pretrained(
        str(directory),
        config=hf_config,
        dtype=torch.float32,
        attn_implementation=attention_implementation(config),
    )
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and config.max_total_sequence_length > max_positions:
        raise ValueError(
            f"policy.max_total_sequence_length={config.max_total_sequence_length} exceeds the "
            f"model's max_position_embeddings={max_positions} ({directory}/config.json)"
        )
    return model


def load_scalar_head(
    model_cls: Any, head_suffix: str, path: str | Path, config: TrainedModelConfig, **overrides: Any
) -> PreTrainedModel:
    """Backbone + a one-output head (HF's ``*For{Token,Sequence}Classification``, a Linear
    named ``score``) from ``path``. A head created fresh from a causal-LM checkpoint starts
    at zero, so runs are reproducible without a seed; one ``path`` saved (its config's
    architecture ends with ``head_suffix``) is kept."""
    model = load_pretrained(model_cls, path, config, num_labels=1, **overrides)
    saved = json.loads((resolve_model(str(path)) / "config.json").read_text())
    if not any(arch.endswith(head_suffix) for arch in saved.get("architectures") or []):
        score = cast(torch.nn.Linear, model.get_submodule("score"))
        torch.nn.init.zeros_(score.weight)
        if score.bias is not None:
            torch.nn.init.zeros_(score.bias)
    return model


def embedding_rows(model: "PreTrainedModel | PeftModel") -> int:
    """How many token ids the model's input embedding table holds."""
    return int(model.get_input_embeddings().get_parameter("weight").shape[0])


def check_vocab(tokenizer: PreTrainedTokenizerBase, model: "PreTrainedModel | PeftModel") -> None:
    """Fail when the tokenizer's ids reach past the model's embedding table."""
    rows = embedding_rows(model)
    if len(tokenizer) > rows:
        raise VocabMismatchError(
            f"tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} rows; "
            "use the tokenizer that belongs to policy.model_name (policy.tokenizer.name)"
        )
