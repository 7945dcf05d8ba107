"""``checkpointing.checkpoint_must_save_by``: the flow run stops after the iteration whose
checkpoint is committed near the limit, and the next flow run of the run continues."""

from pathlib import Path

import pytest

from flows.grpo import grpo
from nemo_rl_core.storage.handles import RunRef, open_storage

pytestmark = pytest.mark.e2e


def test_run_stops_at_the_deadline_and_continues(tiny_config: Path, tmp_path: Path) -> None:
    def run(*overrides: str) -> dict:
        return grpo(
            config_path=str(tiny_config),
            overrides=["grpo.max_num_steps=2", *overrides],
            run_id="deadline",
            storage_root=str(tmp_path),
        )

    assert run("checkpointing.checkpoint_must_save_by=00:00:00:00")["iterations"] == [0]
    assert open_storage(RunRef(str(tmp_path), "deadline")).latest_checkpoint() == 1
    assert run()["iterations"] == [1]
