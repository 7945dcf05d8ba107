"""NeMo RL v0.7.0's own ``examples/`` for tests, read at test time from a git mirror of
NVIDIA-NeMo/RL (``NEMO_RL_MIRROR``, default ``../.mirror/NVIDIA-NeMo+RL/repo`` beside the
checkout, the mirror the conformance runner reads); nothing of NeMo RL is stored in the
project. The ``nemo_rl_configs`` fixture (``tests/conftest.py``) exports them once per session.
"""

import os
import subprocess
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.pipeline.registry import pipeline_for_config
from nemo_rl_core.utils.config import load_config_with_overrides

ROOT = Path(__file__).resolve().parents[1]
MIRROR = Path(os.environ.get("NEMO_RL_MIRROR", ROOT.parent / ".mirror/NVIDIA-NeMo+RL/repo"))
TAG = "v0.7.0"
# modelopt/: the ``defaults:`` of NeMo RL's quantization recipes
EXAMPLE_DIRS = ("configs", "prompts", "modelopt", "nemo_gym")

# Model, data and sizes: what a CPU run of a NeMo RL config may change, nothing else.
SMALL = [
    "policy.model_name=tiny-llama",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "policy.logprob_batch_size=4",
    "policy.max_total_sequence_length=160",
    "policy.precision=float32",
]
SMALL_GRPO = [
    "grpo.num_prompts_per_step=2",
    "grpo.num_generations_per_prompt=4",
    "grpo.max_num_steps=2",
    "grpo.max_val_samples=4",
    "grpo.val_batch_size=4",
]


def export_examples(target: Path) -> Path:
    """NeMo RL's ``examples/`` at :data:`TAG` under ``target``; returns its ``configs/``."""
    archive = subprocess.run(
        ["git", "-C", str(MIRROR), "archive", TAG, *(f"examples/{d}" for d in EXAMPLE_DIRS)],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target / "examples" / "configs"


def validated(path: Path, overrides: list[str]) -> Any:
    """A NeMo RL config validated into its algorithm's master config, as the flows load it."""
    raw = load_config_with_overrides(path, overrides)
    return load_master_config(str(path), overrides, pipeline_for_config(raw).config_class)
