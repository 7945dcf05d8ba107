"""Killed mid-stage: the flow's process is SIGKILLed after a stage computed and before
it committed (``NEMO_RL_CORE_FAULT=<stage>@1:kill``); the same run_id, run again, completes
with the final weights of an uninterrupted run bit for bit and no half-written object."""

import json
import time
from pathlib import Path

import pytest
from reliability_helpers import (
    FAST,
    ITERATIONS,
    assert_no_half_written_objects,
    assert_same_weights,
    final_weights,
    flow_subprocess,
    run_dir,
)

from flows.grpo import GRPO_STAGES
from tasks.stage import FAULT_ENV

pytestmark = pytest.mark.e2e
LEASE_TTL_S = 3  # the killed run's lease must expire before the resume takes it


@pytest.mark.parametrize("stage", ["generate", "reward", "train"])
def test_killed_stage_resumes_to_identical_weights(
    stage: str, clean_run: Path, tmp_path: Path
) -> None:
    env = {"NEMO_RL_CORE_LEASE_TTL_S": str(LEASE_TTL_S)}
    killed = flow_subprocess(tmp_path, "killed", FAST, {**env, FAULT_ENV: f"{stage}@1:kill"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    manifest = run_dir(tmp_path, "killed") / "iter_000001" / "MANIFEST.json"
    assert stage not in json.loads(manifest.read_text())["stages"], "the kill came too late"
    assert_no_half_written_objects(tmp_path, "killed")

    time.sleep(LEASE_TTL_S + 1)
    resumed = flow_subprocess(tmp_path, "killed", FAST, env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    assert_same_weights(final_weights(clean_run, "clean"), final_weights(tmp_path, "killed"))
    assert_no_half_written_objects(tmp_path, "killed")
    for iteration in range(ITERATIONS):
        path = run_dir(tmp_path, "killed") / f"iter_{iteration:06d}" / "MANIFEST.json"
        stages = json.loads(path.read_text())["stages"]
        assert {s for s, e in stages.items() if e["status"] == "complete"} == set(GRPO_STAGES)
