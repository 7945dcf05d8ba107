"""Each declared algorithm's config class and data setup by name, without its stages.

A declaration (:mod:`~nemo_rl_core.pipeline.algorithms`) names the core functions its stages
call, and those load torch; the command line checks a config before anything so heavy loads
(``python -m flows <algorithm>``), so it looks the config side up here. Every config module
named here imports without torch (``tests/algorithms/test_torch_free_configs.py``), and
``tests/pipeline/test_algorithm_configs.py`` holds this table to the declarations: the same
algorithms, the same config classes and data setups.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from nemo_rl_core.algorithms import dpo_config, grpo_config, sft_config
from nemo_rl_core.algorithms.distillation_config import DistillationMasterConfig
from nemo_rl_core.algorithms.ppo_config import PPOMasterConfig
from nemo_rl_core.algorithms.rm_config import RMMasterConfig
from nemo_rl_core.data.datasets.builder import DataSetup
from nemo_rl_core.evals.config import EvalMasterConfig


@dataclass(frozen=True)
class AlgorithmConfig:
    """What checking a config of one algorithm takes: the class its YAML validates into,
    and how its datasets are set up (None: it declares no training data, as eval)."""

    config_class: type[BaseModel]
    data_setup: Callable[[Any], DataSetup] | None


ALGORITHM_CONFIGS: dict[str, AlgorithmConfig] = {
    "grpo": AlgorithmConfig(grpo_config.MasterConfig, grpo_config.data_setup),
    "ppo": AlgorithmConfig(PPOMasterConfig, grpo_config.data_setup),
    "sft": AlgorithmConfig(sft_config.SFTMasterConfig, sft_config.data_setup),
    "dpo": AlgorithmConfig(dpo_config.DPOMasterConfig, dpo_config.data_setup),
    "rm": AlgorithmConfig(RMMasterConfig, dpo_config.data_setup),
    "distillation": AlgorithmConfig(DistillationMasterConfig, grpo_config.data_setup),
    "eval": AlgorithmConfig(EvalMasterConfig, None),
}


def algorithm_config(name: str) -> AlgorithmConfig:
    """The config side of algorithm ``name``; a ``KeyError`` naming the known ones."""
    if name not in ALGORITHM_CONFIGS:
        raise KeyError(f"no algorithm {name!r}; known: {sorted(ALGORITHM_CONFIGS)}")
    return ALGORITHM_CONFIGS[name]
