"""Stages on two work pools, on the real local stack (PostgreSQL, Prefect server, moto S3,
process workers): the iteration flow runs on the stack's worker, generate and reward run
as flow runs of ``stage/rollout-pool`` on that pool's worker, logprob and train as flow runs
of ``stage/train-pool`` on its own (``examples/configs/grpo_math_tiny_pools.yaml``).

The weights such a run ends with are the one-process run's bit for bit, each stage's
manifest entry names the pool, worker and host that ran it, an output damaged after its
commit on one pool is found by the next placed stage and re-made by its producer's pool,
and a train-pool worker SIGKILLed in the middle of a train stage, then started again, costs
a retried stage flow run and not a bit of the weights."""

import socket
import time
from collections.abc import Iterator

import pytest
from local_stack import LocalStack, kill_tree
from reliability_helpers import (
    REPO,
    assert_no_half_written_objects,
    assert_same_weights,
    final_weights,
)

from nemo_rl_core.storage.run_storage import RunStorage

pytestmark = [pytest.mark.stack, pytest.mark.e2e]
CONFIG = REPO / "examples" / "configs" / "grpo_math_tiny_pools.yaml"
PLACED = {
    "generate": "rollout-pool",
    "reward": "rollout-pool",
    "logprob": "train-pool",
    "train": "train-pool",
}
LEASE_TTL_S = 10  # also the placed stages' heartbeat: a lost one is seen within seconds


@pytest.fixture(scope="module")
def pool_workers(
    local_stack: LocalStack, stack_deployments: dict[str, str]
) -> Iterator[dict[str, str]]:
    """A worker on each stage pool for this module; each pool's worker name."""
    pools = sorted(set(PLACED.values()))
    for pool in pools:
        local_stack.restart_worker(pool)
    yield {pool: f"{pool}-worker-{local_stack.ports['api']}" for pool in pools}
    for pool in pools:
        local_stack.stop_worker(pool)


def s3_run(stack: LocalStack, run_id: str) -> RunStorage:
    return RunStorage(f"s3://{stack.bucket}", run_id, storage_options=stack.storage_options)


def start_run(stack: LocalStack, deployments: dict[str, str], run_id: str, fault: str = "") -> str:
    return stack.start_flow_run(
        deployments["grpo/manual"],
        {"run_id": run_id, "config_path": str(CONFIG)},
        env={"NEMO_RL_CORE_LEASE_TTL_S": str(LEASE_TTL_S), "NEMO_RL_CORE_FAULT": fault},
    )


@pytest.mark.timeout(3600)
def test_two_pools_survive_damage_and_a_killed_worker_to_the_one_process_weights(
    local_stack: LocalStack, stack_deployments: dict[str, str], pool_workers: dict, clean_run
) -> None:
    """One run carries every fault, so that the stack pays its flow-run start-ups once:
    generate@1 (rollout-pool) commits, then a byte of its output flips, which reward, in
    another flow run on that pool, finds, and the iteration has generate run again; then
    train-pool's worker dies in the middle of train@1 and is started again."""
    run_id = "two-pools"
    storage = s3_run(local_stack, run_id)
    flow_run_id = start_run(local_stack, stack_deployments, run_id, "generate@1:damage")
    deadline = time.monotonic() + 1800
    # The train stage of the last iteration beats its heartbeat first thing: then it loads
    # the policy and optimizer, trains and commits, seconds of work in which it dies.
    while storage.read_stage_run(1, "train") is None:
        assert time.monotonic() < deadline, local_stack.log_tail("worker@train-pool")
        time.sleep(0.1)
    killed = kill_tree(local_stack.worker_pid("train-pool"))
    assert "train" not in storage.read_manifest(1).stages, "train finished before the kill"
    time.sleep(LEASE_TTL_S)
    local_stack.restart_worker("train-pool")
    assert local_stack.worker_pid("train-pool") not in killed

    final = local_stack.wait_for_flow_run(flow_run_id, timeout=1800)
    logs = local_stack.flow_run_logs(flow_run_id)
    assert final["state_type"] == "COMPLETED", logs[-30:]
    assert any("re-executing stage 'generate' of iteration 1" in line for line in logs), logs
    [repair] = storage.read_manifest(1).repairs
    assert repair.key.startswith("iter_000001/generate/"), repair
    retried = [line for line in logs if "is lost: its heartbeat on storage stopped" in line]
    assert retried and "work pool 'train-pool'" in retried[0], logs[-30:]
    for iteration in (0, 1):
        stages = storage.read_manifest(iteration).stages
        for stage, entry in stages.items():
            ran_on = entry.ran_on
            assert ran_on is not None, (iteration, stage)
            pool = PLACED.get(stage, local_stack.env_vars["NEMO_RL_WORK_POOL"])
            worker = pool_workers.get(pool, f"local-worker-{local_stack.ports['api']}")
            assert (ran_on.pool, ran_on.worker) == (pool, worker), (iteration, stage)
            assert ran_on.host == socket.gethostname()
            if stage in PLACED:
                assert ran_on.flow_run != flow_run_id, "a placed stage ran in the iteration flow"
    assert_no_half_written_objects(storage)
    assert_same_weights(final_weights(RunStorage(str(clean_run), "clean")), final_weights(storage))
