"""A finished run continued (the nightly after its last step) says so instead of completing
silently, and the ``max_num_steps`` parameter continues it past its old limit."""

from pathlib import Path

import pytest
from prefect.client.orchestration import get_client

from flows.grpo import grpo

pytestmark = pytest.mark.e2e
FAST = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_math_tiny_fast.yaml"


def test_finished_run_says_so_and_max_num_steps_continues_it(tmp_path: Path) -> None:
    args = {"config_path": str(FAST), "run_id": "nightly", "storage_root": str(tmp_path)}
    first = grpo(**args, max_num_steps=1)
    assert first["iterations"] == [0]

    state = grpo(**args, max_num_steps=1, return_state=True)
    assert state.is_completed()
    assert "run nightly is finished: all 1 steps are committed" in state.message
    assert "max_num_steps" in state.message
    summary = state.result()
    assert summary["iterations"] == [] and summary["message"] == state.message
    with get_client(sync_client=True) as client:
        artifact = client.read_latest_artifacts()
    assert any(a.key == "nightly-nothing-to-do" for a in artifact)

    more = grpo(**args, max_num_steps=2)
    assert more["iterations"] == [1]
