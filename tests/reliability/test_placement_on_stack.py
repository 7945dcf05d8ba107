"""Stages on two pools of stage workers, on the real local stack (PostgreSQL, Prefect server,
moto S3, the process worker that runs the iteration flow): generate and reward on
``rollout-pool``, which has two workers and splits generate over them, logprob, advantage and
train on ``train-pool`` (``examples/configs/grpo_math_tiny_pools.yaml``), as one task run of the
iteration flow run, its parameters in the stack's S3 task-scheduling block.

The weights such a run ends with are the one-process run's bit for bit, each stage's manifest
entry names the pool, worker and host that ran it, an output damaged after its commit on one
pool is found by the next placed stage and re-made by its producer's pool, and a train-pool
worker that dies in the middle of a train stage (``NEMO_RL_CORE_FAULT=train@1:kill``) is said
in the flow run's state message within 30 s, then started again, and costs a stage run and
not a bit of the weights."""

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_stack import LocalStack
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
    "advantage": "train-pool",
    "train": "train-pool",
}
# generate in two shards of whole engine batches, one per rollout worker
SPLIT = ["policy.generation_batch_size=2", "++orchestration.fan_out.generate=2"]
LEASE_TTL_S = "10"  # also the placed stages' heartbeat: a stalled one is seen within seconds
ROLLOUT_WORKERS = ("rollout-pool", "rollout-pool#2")


@pytest.fixture(scope="module")
def clean_split_run(prefect_api, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted one-process run with the same config (the shards' batches)."""
    from flows.grpo import grpo

    root = tmp_path_factory.mktemp("clean-split")
    grpo(
        config_path=str(CONFIG),
        overrides=["~cluster", *SPLIT],
        run_id="clean",
        storage_root=str(root),
    )
    return root


@pytest.fixture(scope="module")
def stage_workers(local_stack: LocalStack, stack_deployments: dict[str, str]) -> Iterator[None]:
    """Two rollout-pool workers (the one that runs generate@1 damages its output) and a
    train-pool worker that dies in the middle of train@1."""
    damage = {"NEMO_RL_CORE_FAULT": "generate@1:damage", "NEMO_RL_CORE_LEASE_TTL_S": LEASE_TTL_S}
    for name in ROLLOUT_WORKERS:
        local_stack.restart_worker(name, env=damage)
    kill = {"NEMO_RL_CORE_FAULT": "train@1:kill", "NEMO_RL_CORE_LEASE_TTL_S": LEASE_TTL_S}
    local_stack.restart_worker("train-pool", env=kill)
    yield
    local_stack.stop_workers(*ROLLOUT_WORKERS, "train-pool")


def s3_run(stack: LocalStack, run_id: str) -> RunStorage:
    return RunStorage(f"s3://{stack.bucket}", run_id, storage_options=stack.storage_options)


def worker_name(stack: LocalStack, name: str) -> str:
    """The name stack.sh gives the stage worker ``worker@<name>``."""
    pool, _, index = name.partition("#")
    return f"{pool}-worker-{stack.ports['api']}" + (f"-{index}" if index else "")


@pytest.mark.timeout(3600)
def test_two_pools_survive_damage_and_a_killed_worker_to_the_one_process_weights(
    local_stack: LocalStack, stage_workers: None, clean_split_run: Path
) -> None:
    """One run carries every fault, so that the stack pays its workers' start-ups once:
    generate@1 (rollout-pool, in two shards) commits, then a byte of its output flips, which
    reward, on that pool, finds, and the iteration has generate run again; then train-pool's
    worker dies in the middle of train@1 and is started again."""
    run_id = "two-pools"
    storage = s3_run(local_stack, run_id)
    flow_run_id = local_stack.start_flow_run(
        local_stack.api("GET", "/deployments/name/grpo/manual")["id"],
        {"run_id": run_id, "config_path": str(CONFIG), "overrides": SPLIT},
        env={"NEMO_RL_CORE_LEASE_TTL_S": LEASE_TTL_S},
    )
    doomed = local_stack.worker_pid("train-pool")
    deadline = time.monotonic() + 1800
    while local_stack.live_stage_workers("train-pool"):
        assert time.monotonic() < deadline, local_stack.log_tail("worker@train-pool")
        time.sleep(0.5)
    died = time.monotonic()
    assert "train" not in storage.read_manifest(1).stages, "train finished before the kill"
    said = "pool 'train-pool' has no live stage worker"
    while said not in (
        local_stack.api("GET", f"/flow_runs/{flow_run_id}")["state"]["message"] or ""
    ):
        assert time.monotonic() - died < 30, local_stack.api("GET", f"/flow_runs/{flow_run_id}")
        time.sleep(0.5)
    local_stack.restart_worker("train-pool", env={"NEMO_RL_CORE_LEASE_TTL_S": LEASE_TTL_S})
    assert local_stack.worker_pid("train-pool") != doomed

    final = local_stack.wait_for_flow_run(flow_run_id, timeout=1800)
    logs = local_stack.flow_run_logs(flow_run_id)
    assert final["state_type"] == "COMPLETED", logs[-30:]
    assert any("re-executing stage 'generate' of iteration 1" in line for line in logs), logs
    [repair] = storage.read_manifest(1).repairs
    assert repair.key.startswith("iter_000001/generate/"), repair
    local_stack.wait_for_log(flow_run_id, "has a live stage worker again")
    workers = {pool: {worker_name(local_stack, pool)} for pool in ("train-pool",)}
    workers["rollout-pool"] = {worker_name(local_stack, name) for name in ROLLOUT_WORKERS}
    for iteration in (0, 1):
        for stage, entry in storage.read_manifest(iteration).stages.items():
            ran_on = entry.ran_on
            assert ran_on is not None and ran_on.host == socket.gethostname(), (stage, ran_on)
            assert ran_on.flow_run == flow_run_id, "a stage ran outside the iteration flow run"
            if stage in PLACED:
                assert ran_on.pool == PLACED[stage], (iteration, stage)
                assert ran_on.worker in workers[PLACED[stage]], (iteration, stage, ran_on)
            else:
                assert ran_on.worker == f"local-worker-{local_stack.ports['api']}"
        folder = f"{storage.objects.run_path}/iter_{iteration:06d}/generate"
        shards = [
            json.loads(storage.fs.cat_file(f"{folder}/shard-{i}-of-2.entry.json")) for i in (0, 1)
        ]
        assert {shard["ran_on"]["worker"] for shard in shards} == workers["rollout-pool"], shards
    train = storage.read_manifest(1).stages["train"].ran_on
    assert train is not None and train.pid == local_stack.worker_pid("train-pool"), train
    assert_no_half_written_objects(storage)
    assert_same_weights(
        final_weights(RunStorage(str(clean_split_run), "clean")), final_weights(storage)
    )
