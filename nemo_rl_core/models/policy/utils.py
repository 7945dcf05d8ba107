"""Small helpers shared by the policy and value backends (``nemo_rl.models.policy.utils``)."""

import importlib
import inspect
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class VocabMismatchError(ValueError):
    """The tokenizer can produce ids that the model has no embedding row for."""


# What to name instead of a class from a package no environment of this project installs.
_INSTEAD = {
    "transformer_engine": (
        "; Transformer Engine (a CUDA build) is in neither of this project's locks: "
        "torch.optim.AdamW is FusedAdam's update (decoupled weight decay, its default mode)"
    ),
}


def import_class_from_path(name: str) -> Any:
    """Import ``package.module.Class`` from its dotted path, as NeMo RL's YAML names classes."""
    module_name, _, class_name = name.rpartition(".")
    if not module_name:
        raise ValueError(f"{name!r} is not a dotted path like 'torch.optim.AdamW'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = _INSTEAD.get(module_name.partition(".")[0], "")
        raise ValueError(f"cannot import module {module_name!r} of {name!r}: {exc}{hint}") from exc
    if not hasattr(module, class_name):
        raise ValueError(f"module {module_name!r} has no attribute {class_name!r}")
    return getattr(module, class_name)


def check_kwargs_accepted(cls: Any, kwargs: dict[str, Any], skip: int) -> None:
    """Fail at config time (not at step 1) when ``kwargs`` names a parameter ``cls`` lacks.

    ``skip`` is the number of leading positional parameters the caller fills itself
    (the params of an optimizer, the optimizer of a scheduler).
    """
    params = list(inspect.signature(cls).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    accepted = {p.name for p in params[skip:]}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ValueError(
            f"kwargs {unknown} are not parameters of {cls.__module__}.{cls.__name__}; "
            f"accepted: {sorted(accepted)}"
        )


def check_model_inputs(
    data: Any, max_total_sequence_length: int, vocab_size: int, section: str = "policy"
) -> None:
    """Reject what would otherwise give silently wrong numbers or an opaque index error
    (inside a model or a distributed rank): missing keys, shapes, lengths, token ids."""
    for key in ("input_ids", "input_lengths"):
        if key not in data:
            raise KeyError(f"data needs {key!r} (has {sorted(data.keys())})")
    ids, lengths = data["input_ids"], data["input_lengths"]
    if ids.dim() != 2 or lengths.shape != ids.shape[:1]:
        raise ValueError(
            f"input_ids must be [batch, seq] and input_lengths [batch]; got "
            f"{tuple(ids.shape)} and {tuple(lengths.shape)}"
        )
    if ids.shape[0] == 0:
        return
    longest = int(lengths.max())
    if longest > ids.shape[1] or int(lengths.min()) < 0:
        raise ValueError(
            f"input_lengths must lie in [0, {ids.shape[1]}] (input_ids width); got "
            f"min {int(lengths.min())}, max {longest}"
        )
    if longest > max_total_sequence_length:
        raise ValueError(
            f"a sequence has {longest} tokens, more than {section}.max_total_sequence_length="
            f"{max_total_sequence_length}; truncate the rollout or raise the limit"
        )
    valid = torch.arange(ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    used = ids[valid]
    if used.numel() and (int(used.max()) >= vocab_size or int(used.min()) < 0):
        raise VocabMismatchError(
            f"input_ids hold token id {int(used.max())} (min {int(used.min())}) but the "
            f"model has {vocab_size} embedding rows; was the data tokenized with "
            f"another tokenizer than {section}.tokenizer.name?"
        )
