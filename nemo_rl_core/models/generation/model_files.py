"""What a generation backend must know about a model directory before it trusts it.

Both backends check the same things up front, so a bad directory fails with a message
that names the file and the fix instead of a shape error deep inside an engine: weights
present, a tokenizer whose ids fit the embedding, and (for refits) the tensor names and
shapes that a new state dict or checkpoint must match.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nemo_rl_core.models.generation.config import GenerationConfig, configure_generation_config
from nemo_rl_core.models.local_models import resolve_model

TIED_LM_HEAD = "lm_head.weight"

# name -> (shape, dtype name), as NeMo RL's ``prepare_refit_info`` describes weights.
RefitInfo = dict[str, tuple[tuple[int, ...], str]]


class VocabMismatchError(ValueError):
    """The tokenizer can emit ids that the model's embedding table does not have."""


class RefitMismatchError(ValueError):
    """New weights do not match the names or shapes of the running model's weights."""


@dataclass(frozen=True)
class ModelSpec:
    """The facts about a local HF model directory that generation depends on."""

    path: Path
    tokenizer: Any
    vocab_size: int
    max_position_embeddings: int
    head_dim: int
    tie_word_embeddings: bool
    weights: RefitInfo


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model's keys under ``text_config``."""
    return config.get("text_config", config)


def read_weight_info(directory: str | Path) -> RefitInfo:
    """Names, shapes and dtypes of the tensors in a directory's safetensors files (headers only)."""
    from safetensors import safe_open

    info: RefitInfo = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                tensor_slice = handle.get_slice(name)
                info[name] = (tuple(tensor_slice.get_shape()), str(tensor_slice.get_dtype()))
    return info


def inspect_model_dir(model_path: str | Path) -> ModelSpec:
    """Resolve and validate ``model_path``; raise with the fix when it cannot generate."""
    from transformers import AutoTokenizer

    path = resolve_model(str(model_path))
    config = _text_config(json.loads((path / "config.json").read_text()))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(
            f"model directory {path} has no loadable tokenizer ({err}); save the tokenizer "
            "next to the weights with tokenizer.save_pretrained(dir)"
        ) from err
    vocab_size = int(config["vocab_size"])
    if len(tokenizer) > vocab_size:
        raise VocabMismatchError(
            f"tokenizer in {path} has {len(tokenizer)} tokens but config.json vocab_size is "
            f"{vocab_size}: ids >= {vocab_size} would index past the embedding table; "
            "use the tokenizer the model was trained with or resize the embeddings"
        )
    heads = int(config["num_attention_heads"])
    return ModelSpec(
        path=path,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        weights=read_weight_info(path),
    )


def setup_backend(
    config: GenerationConfig, model_path: str | Path | None
) -> tuple[ModelSpec, GenerationConfig, int]:
    """What every backend starts from: the checked model, the filled config, max_model_len."""
    model_path = model_path or config.model_name
    if model_path is None:
        raise ValueError("a generation backend needs model_path or generation.model_name")
    spec = inspect_model_dir(model_path)
    filled = configure_generation_config(config, spec.tokenizer)
    return spec, filled, config.vllm_cfg.max_model_len or spec.max_position_embeddings


def refit_info_of(state_dict: dict[str, torch.Tensor]) -> RefitInfo:
    """Describe a state dict the way ``prepare_refit_info`` expects it."""
    return {
        name: (tuple(t.shape), str(t.dtype).removeprefix("torch."))
        for name, t in state_dict.items()
    }


def check_refit(new: RefitInfo, expected: RefitInfo, *, tied: bool, source: str) -> None:
    """Fail when ``new`` would leave weights stale or cannot load: vLLM only warns then.

    dtypes may differ (the engine casts); names and shapes may not. A tied model's
    ``lm_head.weight`` is optional since it is the embedding.
    """
    if not expected:
        return
    optional = {TIED_LM_HEAD} if tied else set()
    missing = sorted(set(expected) - set(new) - optional)
    unexpected = sorted(set(new) - set(expected) - optional)
    wrong_shape = sorted(
        f"{name}: {new[name][0]} != {expected[name][0]}"
        for name in set(new) & set(expected)
        if tuple(new[name][0]) != tuple(expected[name][0])
    )
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} weights (first: {missing[:3]})")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} weights (first: {unexpected[:3]})")
    if wrong_shape:
        problems.append(f"wrong shapes: {wrong_shape[:3]}")
    if problems:
        raise RefitMismatchError(
            f"refit from {source} does not match the engine's model: {'; '.join(problems)}. "
            "Send the full HF-named state dict of the same architecture "
            "(or call prepare_refit_info with what you will send)."
        )


def weights_to_load(
    state_dict: dict[str, torch.Tensor], *, tied: bool
) -> list[tuple[str, torch.Tensor]]:
    """The tensors to load; a tied model's lm_head is dropped once checked to be the embedding.

    Engines take a tied head from the embedding, so a different ``lm_head.weight`` would
    be ignored without a word: refuse it instead.
    """
    if not tied or TIED_LM_HEAD not in state_dict:
        return list(state_dict.items())
    embedding = next((v for k, v in state_dict.items() if k.endswith("embed_tokens.weight")), None)
    head = state_dict[TIED_LM_HEAD]
    if (
        embedding is not None
        and head.data_ptr() != embedding.data_ptr()
        and not torch.equal(head, embedding)
    ):
        raise RefitMismatchError(
            "the model ties lm_head to the embedding but the state dict's lm_head.weight differs "
            "from embed_tokens.weight; train with tied weights or drop lm_head.weight"
        )
    return [(k, v) for k, v in state_dict.items() if k != TIED_LM_HEAD]
