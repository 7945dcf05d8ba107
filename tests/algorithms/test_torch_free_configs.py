"""Every algorithm's config is torch-free: importing its config class and validating its
example config loads neither torch nor transformers, so ``python -m flows <algorithm>``
refuses a config mistake in seconds (``bench/fail_fast.py`` times it)."""

import importlib
from pathlib import Path

import pytest
from python_forks import PythonForks

from nemo_rl_core.pipeline.algorithm_configs import ALGORITHM_CONFIGS
from nemo_rl_core.pipeline.registry import pipeline_named

REPO = Path(__file__).resolve().parents[2]
VALIDATE = (
    "import importlib, sys\n"
    "from nemo_rl_core.utils.config import load_config_file\n"
    "module, name, config = sys.argv[1:]\n"
    "config_class = getattr(importlib.import_module(module), name)\n"
    "load_config_file(config, [], config_class)\n"
)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_CONFIGS))
def test_the_config_imports_and_validates_without_torch(
    algorithm: str, python_forks: PythonForks
) -> None:
    """In a process of its own (tests/python_forks.py), which names the heavy packages it
    imported."""
    config_class = ALGORITHM_CONFIGS[algorithm].config_class
    example = REPO / pipeline_named(algorithm).default_config
    done = python_forks.run(
        VALIDATE, [config_class.__module__, config_class.__name__, str(example)]
    )
    assert done.returncode == 0, done.stderr
    assert done.heavy == [], f"{config_class.__module__} loaded {done.heavy}"


def test_the_table_of_config_classes_is_torch_free(python_forks: PythonForks) -> None:
    done = python_forks.run("import nemo_rl_core.pipeline.algorithm_configs")
    assert done.returncode == 0 and "torch" not in done.heavy, done.stderr


@pytest.mark.parametrize("algorithm", ["distillation", "dpo", "grpo", "ppo", "rm", "sft"])
def test_the_algorithm_module_names_it_master_config_as_nemo_rl_does(algorithm: str) -> None:
    """``from nemo_rl.algorithms.<algorithm> import MasterConfig`` (NeMo RL's scripts) is the
    class this project validates that algorithm's config with."""
    module = importlib.import_module(f"nemo_rl_core.algorithms.{algorithm}")
    assert module.MasterConfig is ALGORITHM_CONFIGS[algorithm].config_class
