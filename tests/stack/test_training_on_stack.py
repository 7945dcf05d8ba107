"""Training through the real stack: deployments picked up by the worker, S3 storage,
the nightly schedule continuing one experiment, and the lease refusing a concurrent run.
(A ``grpo/manual`` run committing its checkpoints on S3: the last run of
tests/reliability/test_killed_mid_stage.py.)"""

import datetime as dt
import threading
import time

import pytest
import s3fs
from local_stack import LocalStack

pytestmark = [pytest.mark.stack, pytest.mark.e2e]
# Sampling with transformers keeps these runs short; the embedded tests exercise vLLM.
FAST = [
    "policy.generation.backend=hf",
    "grpo.num_prompts_per_step=2",
    "policy.train_global_batch_size=8",
]


def committed_steps(stack: LocalStack, run_id: str) -> list[int]:
    fs = s3fs.S3FileSystem(**stack.storage_options)
    root = f"{stack.bucket}/runs/{run_id}/checkpoints"
    fs.invalidate_cache()
    steps = [p.rsplit("_", 1)[-1] for p in fs.ls(root)] if fs.exists(root) else []
    return sorted(int(s) for s in steps if fs.exists(f"{root}/step_{s}/COMMITTED"))


def test_nightly_schedule_is_registered(
    local_stack: LocalStack, stack_deployments: dict[str, str]
) -> None:
    deployment = local_stack.api("GET", f"/deployments/{stack_deployments['grpo/nightly']}")
    assert [s["schedule"]["cron"] for s in deployment["schedules"]] == ["0 2 * * *"]
    # The session's deployments are shared: an earlier test may have paused every schedule.
    (schedule,) = deployment["schedules"]
    local_stack.api(
        "PATCH", f"/deployments/{deployment['id']}/schedules/{schedule['id']}", {"active": True}
    )
    query = {
        "deployments": {"id": {"any_": [stack_deployments["grpo/nightly"]]}},
        "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}},
    }
    deadline = time.monotonic() + 90  # the server's scheduler picks a new schedule up in seconds
    while not (upcoming := local_stack.api("POST", "/flow_runs/filter", query)):
        assert time.monotonic() < deadline, local_stack.log_tail("server")
        time.sleep(1)
    local_stack.run("prefect", "deployment", "schedule", "pause", "--all")
    times = [dt.datetime.fromisoformat(run["expected_start_time"]) for run in upcoming]
    assert all((t.hour, t.minute) == (2, 0) for t in times), times


def test_nightly_runs_continue_one_experiment_and_a_concurrent_one_is_refused(
    local_stack: LocalStack, stack_deployments: dict[str, str]
) -> None:
    nightly = stack_deployments["grpo/nightly"]
    params = {
        "run_id": "stack-nightly",
        "steps_per_run": 1,
        "overrides": [*FAST, "grpo.max_num_steps=10"],
    }
    first_id = local_stack.start_flow_run(nightly, params)
    first = local_stack.wait_for_flow_run(first_id, timeout=1200)
    assert first["state_type"] == "COMPLETED", "\n".join(local_stack.flow_run_logs(first_id)[-30:])
    assert committed_steps(local_stack, "stack-nightly") == [1]

    # The next night and an accidental concurrent manual run of the same experiment (a
    # second nightly would wait for the deployment's one slot): one continues, one is refused.
    manual = stack_deployments["grpo/manual"]
    ids = [local_stack.start_flow_run(deployment, params) for deployment in (nightly, manual)]
    finals = {}
    threads = [
        threading.Thread(
            target=lambda i=i: finals.update({i: local_stack.wait_for_flow_run(i, 1200)})
        )
        for i in ids
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    states = sorted(finals[i]["state_type"] for i in ids)
    assert states == ["COMPLETED", "FAILED"], states
    refused = next(i for i in ids if finals[i]["state_type"] == "FAILED")
    messages = "\n".join(local_stack.flow_run_logs(refused)) + finals[refused]["state"]["message"]
    assert "lease" in messages.lower(), messages[-2000:]
    assert committed_steps(local_stack, "stack-nightly") == [1, 2]
