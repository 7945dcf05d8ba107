"""Generation backends behind NeMo RL's ``GenerationInterface``, chosen by config.

``policy.generation.backend: vllm`` runs a real vLLM engine (the CPU build on CPU);
``hf`` runs transformers ``generate``. Both return the same outputs for the same input.
"""

from pathlib import Path
from typing import TYPE_CHECKING

from nemo_rl_core.models.generation.config import GenerationConfig, configure_generation_config
from nemo_rl_core.utils.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from nemo_rl_core.models.generation.interfaces import GenerationInterface

__all__ = [
    "GenerationConfig",
    "GenerationInterface",
    "configure_generation_config",
    "make_generation",
]


__getattr__ = lazy_exports(__name__, {"GenerationInterface": ".interfaces"})


def make_generation(
    config: GenerationConfig,
    model_path: str | Path | None = None,
    *,
    seed: int = 0,
    batch_size: int | None = None,
) -> "GenerationInterface":
    """Build the backend that ``config.backend`` names for the model at ``model_path``.

    ``model_path`` defaults to ``config.model_name``; either may be a local HF directory or
    a built-in name (``tiny-llama``, ``smollm2-135m-instruct``, see ``resolve_model``).
    ``batch_size`` (NeMo RL's ``policy.generation_batch_size``, "only used when generating
    using HF backend"): prompts per transformers ``generate`` call; vLLM schedules its own.
    """
    if config.backend == "vllm":
        from nemo_rl_core.models.generation.vllm_generation import VllmGeneration

        return VllmGeneration(config, model_path, seed=seed)
    from nemo_rl_core.models.generation.hf_generation import HFGeneration

    return HFGeneration(config, model_path, seed=seed, batch_size=batch_size)
