"""Every algorithm's config is torch-free: importing its config class and validating its
example config loads neither torch nor transformers, so ``python -m flows <algorithm>``
refuses a config mistake in seconds (``bench/fail_fast.py`` times it)."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_rl_core.pipeline.algorithm_configs import ALGORITHM_CONFIGS
from nemo_rl_core.pipeline.registry import pipeline_named

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "vllm", "prefect")
VALIDATE = (
    "import importlib, sys\n"
    "from nemo_rl_core.utils.config import load_config_file\n"
    "module, name, config = sys.argv[1:]\n"
    "config_class = getattr(importlib.import_module(module), name)\n"
    "load_config_file(config, [], config_class)\n"
    f"print(*[m for m in {HEAVY!r} if m in sys.modules])\n"
)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_CONFIGS))
def test_the_config_imports_and_validates_without_torch(algorithm: str) -> None:
    config_class = ALGORITHM_CONFIGS[algorithm].config_class
    example = REPO / pipeline_named(algorithm).default_config
    done = subprocess.run(
        [sys.executable, "-c", VALIDATE, config_class.__module__, config_class.__name__, example],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"{config_class.__module__} loaded {done.stdout.split()}"


def test_the_table_of_config_classes_is_torch_free() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, nemo_rl_core.pipeline.algorithm_configs; print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize("algorithm", ["distillation", "dpo", "grpo", "ppo", "rm", "sft"])
def test_the_algorithm_module_names_it_master_config_as_nemo_rl_does(algorithm: str) -> None:
    """``from nemo_rl.algorithms.<algorithm> import MasterConfig`` (NeMo RL's scripts) is the
    class this project validates that algorithm's config with."""
    module = importlib.import_module(f"nemo_rl_core.algorithms.{algorithm}")
    assert module.MasterConfig is ALGORITHM_CONFIGS[algorithm].config_class
