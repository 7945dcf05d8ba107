"""Small helpers shared by the policy and value backends (``nemo_rl.models.policy.utils``)."""

import importlib
import inspect
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def import_class_from_path(name: str) -> Any:
    """Import ``package.module.Class`` from its dotted path, as NeMo RL's YAML names classes."""
    module_name, _, class_name = name.rpartition(".")
    if not module_name:
        raise ValueError(f"{name!r} is not a dotted path like 'torch.optim.AdamW'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} of {name!r}: {exc}") from exc
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
