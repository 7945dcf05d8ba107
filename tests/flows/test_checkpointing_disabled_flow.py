"""NeMo RL's smoke config (``grpo_smoke.yaml``: ``checkpointing.enabled: false``) runs as a
staged run: each iteration still hands its weights to the next through a committed
checkpoint, and only the newest stays, which is what continuing the run needs."""

from pathlib import Path

import pytest
from nemo_rl_examples import SMALL, validated

from flows.grpo import grpo
from flows.run_setup import config_notes
from nemo_rl_core.storage.handles import RunRef, open_storage

pytestmark = pytest.mark.e2e

OVERRIDES = [*SMALL, "data.train.dataset_name=arithmetic", "grpo.max_num_steps=3"]


def test_the_log_says_once_what_checkpointing_disabled_keeps(nemo_rl_configs: Path) -> None:
    config = validated(nemo_rl_configs / "grpo_smoke.yaml", OVERRIDES)
    assert not config.checkpointing.enabled
    [note] = config_notes(config)
    assert "checkpointing.enabled is false" in note and "only the newest" in note


def test_smoke_config_keeps_only_the_checkpoint_a_continued_run_needs(
    nemo_rl_configs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(nemo_rl_configs.parents[1])  # its prompt_file paths are relative
    run = RunRef(str(tmp_path / "store"), "smoke")
    parameters = {
        "config_path": str(nemo_rl_configs / "grpo_smoke.yaml"),
        "overrides": OVERRIDES,
        "run_id": run.run_id,
        "storage_root": run.storage_root,
    }
    first = grpo(**parameters, steps_per_run=2)
    assert first["iterations"] == [0, 1]
    assert open_storage(run).committed_checkpoints() == [2]
    rest = grpo(**parameters)
    assert rest["iterations"] == [2]
    assert open_storage(run).committed_checkpoints() == [3]
