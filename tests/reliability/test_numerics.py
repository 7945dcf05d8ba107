"""Numerics: a loss that turns non-finite fails the train stage with an error naming the
iteration, is not retried, and commits no checkpoint from the broken update.

``reference_policy_kl_penalty=1e39`` overflows float32 to inf; times the KL term (0 at the
first step, where policy and reference agree) it makes the loss NaN: a real forward and
backward pass of the real policy, no mock."""

from pathlib import Path

import pytest
from reliability_helpers import CONFIG, run_dir

from flows.grpo import grpo
from nemo_rl_core.storage.run_storage import RunStorage

pytestmark = pytest.mark.e2e


def test_nan_loss_fails_train_naming_the_iteration_without_a_checkpoint(
    prefect_api, tmp_path: Path
) -> None:
    overrides = ["grpo.max_num_steps=1", "loss_fn.reference_policy_kl_penalty=1e39"]
    with pytest.raises(FloatingPointError, match=r"iteration 0: .*(loss is nan|non-finite)"):
        grpo(config_path=str(CONFIG), overrides=overrides, run_id="nan", storage_root=str(tmp_path))
    storage = RunStorage(str(tmp_path), "nan")
    assert storage.committed_checkpoints() == []
    assert not (run_dir(tmp_path, "nan") / "checkpoints").exists(), "a checkpoint was started"
    stages = storage.read_manifest(0).stages
    assert set(stages) == {"prompts", "generate", "reward", "logprob", "advantage"}
    assert not (run_dir(tmp_path, "nan") / "iter_000000" / "train").exists()
