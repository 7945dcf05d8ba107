"""Killed mid-stage, on the real local stack (PostgreSQL, Prefect server, process worker,
moto S3): one run_id is driven by successive runs of the ``grpo/manual`` deployment, each
SIGKILLed (``NEMO_RL_CORE_FAULT=<stage>@1:kill`` in the flow run's environment) after the
next stage of iteration 1 computed and before it committed, so each run continues where
the one before died; a last run without a fault completes.

Each killed run is the worker's flow-run child, Prefect marks it CRASHED, its stale lease
expires (3 s TTL) and the next run takes it over; the final weights equal an uninterrupted
run's (the embedded default on file://) bit for bit, and the bucket holds no half-written
object: every manifest output verifies by sha256."""

import re
import time
from datetime import datetime

import pytest
from local_stack import FINAL_STATES, LocalStack
from reliability_helpers import (
    CONFIG,
    assert_no_half_written_objects,
    assert_same_weights,
    final_weights,
)

from nemo_rl_core.pipeline.algorithms import GRPO
from nemo_rl_core.storage.lease import read_lease
from nemo_rl_core.storage.run_storage import RunStorage
from tasks.faults import FAULT_ENV

# The stages of a training iteration (validation is off in these configs).
TRAINING_STAGES = [name for name in GRPO.stage_names if name != "validate"]
pytestmark = [pytest.mark.stack, pytest.mark.e2e]
RUN_ID = "killed-mid-stage"
LEASE_TTL_S = 3


def _run_watching_processes(
    stack: LocalStack, deployment: str, parameters: dict, env: dict[str, str]
) -> tuple[dict, set[int]]:
    """Start a flow run of ``deployment`` and wait for its end; also returns the pids of
    the worker's flow-run processes seen meanwhile."""
    flow_run_id = stack.start_flow_run(deployment, parameters, env)
    seen: set[int] = set()
    deadline = time.monotonic() + 600
    while (flow_run := stack.api("GET", f"/flow_runs/{flow_run_id}"))[
        "state_type"
    ] not in FINAL_STATES:
        assert time.monotonic() < deadline, stack.log_tail("worker")
        seen.update(stack.flow_run_pids())
        time.sleep(0.5)
    return flow_run, seen


def _finished_at(storage: RunStorage) -> dict[tuple[int, str], datetime]:
    return {
        (iteration, stage): entry.finished_at
        for iteration in storage.iterations()
        for stage, entry in storage.read_manifest(iteration).stages.items()
    }


# Eight flow-run processes start one after another, after the session's stack, deployments
# and clean run (set up by whichever stack test comes first): far beyond 900 s under load.
@pytest.mark.timeout(3600)
def test_each_stage_killed_on_the_stack_resumes_to_identical_weights(
    local_stack: LocalStack, stack_deployments: dict[str, str], clean_run
) -> None:
    storage = RunStorage(
        f"s3://{local_stack.bucket}", RUN_ID, storage_options=local_stack.storage_options
    )
    deployment = stack_deployments["grpo/manual"]
    parameters = {"run_id": RUN_ID, "config_path": str(CONFIG)}
    env = {"NEMO_RL_CORE_LEASE_TTL_S": str(LEASE_TTL_S)}
    worker = local_stack.worker_pid()
    committed: dict[tuple[int, str], datetime] = {}
    for done, stage in enumerate(TRAINING_STAGES):
        flow_run, flow_run_pids = _run_watching_processes(
            local_stack, deployment, parameters, {**env, FAULT_ENV: f"{stage}@1:kill"}
        )
        message = flow_run["state"]["message"] or ""
        assert flow_run["state_type"] == "CRASHED" and "-9" in message, (stage, message)
        # The lease it left names the killed process: the worker's child running this flow run.
        owner = read_lease(storage)["owner"]
        assert f"flow-run {flow_run['id']}" in owner, owner
        killed = int(re.search(r" pid (\d+) ", owner)[1])
        assert killed in flow_run_pids and killed not in local_stack.flow_run_pids()
        assert local_stack.worker_pid() == worker, "the worker itself must survive"

        stages = storage.read_manifest(1).stages
        assert sorted(stages) == sorted(TRAINING_STAGES[:done]), f"killed at {stage}: {stages}"
        finished = _finished_at(storage)
        assert {k: finished[k] for k in committed} == committed, "a committed stage was redone"
        committed = finished
        assert_no_half_written_objects(storage)

    final, _ = _run_watching_processes(local_stack, deployment, parameters, env)
    assert final["state_type"] == "COMPLETED", local_stack.flow_run_logs(final["id"])[-30:]
    finished = _finished_at(storage)
    assert {k: finished[k] for k in committed} == committed, "a committed stage was redone"
    for iteration in (0, 1):
        stages = storage.read_manifest(iteration).stages
        assert {s for s, e in stages.items() if e.complete} == set(TRAINING_STAGES)
    assert storage.committed_checkpoints() == [1, 2], "the manual deployment's checkpoints on S3"
    assert read_lease(storage) is None, "the last run released its lease"
    assert_no_half_written_objects(storage)
    clean = final_weights(RunStorage(str(clean_run), "clean"))
    assert_same_weights(clean, final_weights(storage))
