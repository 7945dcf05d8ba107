"""Stages placed on pools of warm stage workers (``cluster.placement``), against the test
session's Prefect server, with stage workers (``python -m flows.stage_worker``) in processes
of their own:

- a placement that cannot run is refused before any work, naming the key;
- a pool with no live worker is said at once (log, the flow run's state message), and its
  stage fails the run after ``placement_wait_seconds``, naming the pool;
- placed stages are task runs of the iteration flow run, run by one long-lived worker that
  loads its models once and refits its engine in place, and the weights end the one-process
  run's bit for bit;
- generate and logprob fan out over two workers, each with its own engine, bit for bit the
  one-process stage;
- a worker killed in the middle of a stage is said within 30 s, and the stage runs again on
  a restarted worker, to the same weights;
- a heartbeat that stops is seen as lost; a damaged input a placed stage found reaches its
  waiter.

The two-pool stack (PostgreSQL, S3, process worker) is tests/reliability/test_placement_on_stack.py.
"""

import contextvars
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from local_stack import wait_for_text
from prefect import flow, task
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterName,
    LogFilter,
)
from prefect.client.schemas.objects import TaskRun
from prefect.context import TaskRunContext
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL, temporary_settings
from safetensors.torch import load_file

from flows.grpo import grpo
from flows.heartbeat import Heartbeat, damage_reported, stage_heartbeat
from flows.listing import PAGE, every_entry
from flows.placement import PlacementError, check_placement, live_workers
from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.pipeline.algorithms import GRPO
from nemo_rl_core.pipeline.context import DamagedInputError
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.manifest import StageEntry
from nemo_rl_core.utils.config import ConfigError

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples/configs/grpo_math_tiny_fast.yaml"
WARM_POOL = "warm-pool"
PLACED = ("generate", "logprob", "train")
CHAINED = ("generate", "reward", "logprob", "train")  # advantage, between them, stays here
# Shards hold whole engine batches and logprob microbatches of 2 samples (4 per iteration),
# long enough for the two shards of a stage to overlap.
CHUNKED = [
    "policy.generation_batch_size=2",
    "policy.logprob_batch_size=2",
    "policy.generation.max_new_tokens=48",
]
SPLIT = ["++orchestration.fan_out.generate=2", "++orchestration.fan_out.logprob=2"]


def run(root: Path, run_id: str, overrides: list[str]) -> dict:
    return grpo(config_path=str(CONFIG), overrides=overrides, run_id=run_id, storage_root=str(root))


def placed_on(pool: str, stages: tuple[str, ...] = PLACED) -> list[str]:
    return [f"++cluster.placement.{stage}={pool}" for stage in stages]


def manifest(root: Path, run_id: str, iteration: int) -> dict[str, StageEntry]:
    return open_storage(RunRef(str(root), run_id)).read_manifest(iteration).stages


def final_weights(root: Path, run_id: str) -> dict:
    return load_file(root / "runs" / run_id / "checkpoints" / "step_000002" / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and all(a[name].equal(b[name]) for name in a)


def flow_run_of(name: str) -> Any:
    with get_client(sync_client=True) as client:
        [found] = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name]))
        )
        return found


def flow_run_messages(flow_run_id: Any) -> list[str]:
    with get_client(sync_client=True) as client:
        return [state.message or "" for state in client.read_flow_run_states(flow_run_id)]


def stored_task_run(client: SyncPrefectClient, task_run_id: str) -> TaskRun:
    """A task run as the server holds it, once it does: a task run of the flow's own process
    reaches the server as an event, which can come after the flow run's end."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return client.read_task_run(uuid.UUID(task_run_id))
        except ObjectNotFound:
            assert time.monotonic() < deadline, f"task run {task_run_id} never reached the server"
            time.sleep(0.2)


def logs_of(flow_run_id: Any) -> list[str]:
    """Every log line of the flow run (a run's stages log more than one page)."""
    with get_client(sync_client=True) as client:
        entries = every_entry(
            lambda offset: client.read_logs(
                log_filter=LogFilter(flow_run_id={"any_": [flow_run_id]}),
                limit=PAGE,
                offset=offset,
            )
        )
    return [entry.message for entry in entries]


@contextmanager
def stage_workers(
    pool: str, tmp_path: Path, count: int = 1, env: dict[str, str] | None = None
) -> Iterator[list[subprocess.Popen]]:
    """``count`` stage workers of ``pool``, each a process of its own on this session's
    Prefect server, up (the server lists them) before the block starts."""
    procs = [start_worker(pool, tmp_path, f"{pool}-{i}", env) for i in range(count)]
    try:
        wait_for_workers(pool, count)
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(60)


def start_worker(
    pool: str, tmp_path: Path, name: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    log = (tmp_path / f"{name}-{uuid.uuid4().hex[:6]}.log").open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "flows.stage_worker", "--pool", pool, "--name", name],
        cwd=REPO,
        env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for_workers(pool: str, count: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while len(live_workers(client, pool)) < count:
            assert time.monotonic() < deadline, f"{count} workers of {pool} not up"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-process runs every placed run must match: as configured, and with the
    engine batches and microbatches that shards are made of."""
    root = tmp_path_factory.mktemp("whole")
    run(root, "whole", [])
    run(root, "chunked", CHUNKED)
    return root


def test_placement_needs_a_prefect_server() -> None:
    """Stage workers serve a Prefect server's task runs; the ephemeral API has none."""
    config = load_master_config(str(CONFIG), ["++cluster.placement.train=train-pool"])
    with (
        temporary_settings(restore_defaults={PREFECT_API_URL}),
        pytest.raises(ConfigError, match="cluster.placement.train: .*ephemeral API"),
    ):
        check_placement(config, GRPO)


def test_a_stage_the_algorithm_lacks_is_refused_by_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cluster.placement.genrate: grpo has no stage"):
        run(tmp_path, "typo", ["++cluster.placement.genrate=some-pool"])
    assert not (tmp_path / "runs").exists()


def test_a_fan_out_wider_than_the_batch_is_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"orchestration.fan_out.logprob=3: wider .* at most 2"):
        run(tmp_path, "wide", [*CHUNKED, "++orchestration.fan_out.logprob=3"])
    with pytest.raises(ConfigError, match="fan_out.generate=2: .*policy.generation_batch_size"):
        run(tmp_path, "unchunked", ["++orchestration.fan_out.generate=2"])
    assert not (tmp_path / "runs").exists(), "wrote before refusing"


def test_a_pool_without_a_worker_is_said_and_fails_after_the_wait(tmp_path: Path) -> None:
    overrides = [*placed_on("idle-pool", ("generate",)), "++cluster.placement_wait_seconds=3"]
    started = time.monotonic()
    with pytest.raises(PlacementError, match="pool 'idle-pool': no stage worker of the pool ran"):
        run(tmp_path, "idle", overrides)
    assert time.monotonic() - started < 120
    # The stage before it ran here, and says where: this host, in no worker.
    stages = manifest(tmp_path, "idle", 0)
    assert sorted(stages) == ["prompts"]
    ran_on = stages["prompts"].ran_on
    assert ran_on is not None
    assert (ran_on.host, ran_on.pool, ran_on.worker) == (socket.gethostname(), None, None)
    flow_run = flow_run_of("grpo-idle")
    said = [m for m in flow_run_messages(flow_run.id) if "has no live stage worker" in m]
    assert said and "pool 'idle-pool'" in said[0], flow_run_messages(flow_run.id)
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )
    [generate] = [t for t in task_runs if t.task_key == "stage@idle-pool"]
    assert generate.state is not None and generate.state.is_cancelled(), generate.state


def test_placed_stages_run_warm_in_the_iteration_flow_run(tmp_path: Path, whole: Path) -> None:
    """One worker runs generate, reward, logprob and train of both iterations in one
    process: it loads the policy and starts the engine once and refits the engine in place;
    the consecutive generate, reward and logprob are one task run of the iteration flow run,
    train (after advantage, in the flow) another; the weights are the one-process run's."""
    with stage_workers(WARM_POOL, tmp_path) as [worker]:
        run(tmp_path, "placed", placed_on(WARM_POOL, CHAINED))
        # the worker sends its logs in batches: its last ones, before it is killed
        flow_run_id = flow_run_of("grpo-placed").id
        wait_for_text(lambda: logs_of(flow_run_id), "generation engine refit in place to step 1")
    assert_same_weights(final_weights(whole, "whole"), final_weights(tmp_path, "placed"))
    flow_run = flow_run_of("grpo-placed")
    with get_client(sync_client=True) as client:
        for iteration in (0, 1):
            for stage, entry in manifest(tmp_path, "placed", iteration).items():
                ran_on = entry.ran_on
                assert ran_on is not None and ran_on.task_run is not None, stage
                assert ran_on.flow_run == str(flow_run.id), (stage, ran_on)
                task_run = stored_task_run(client, ran_on.task_run)
                assert task_run.flow_run_id == flow_run.id, (stage, task_run)
                chain = "generate+reward+logprob" if stage in CHAINED[:3] else stage
                assert task_run.name == f"{chain}-it{iteration}", (stage, task_run.name)
                if stage in CHAINED:
                    assert (ran_on.pool, ran_on.worker) == (WARM_POOL, f"{WARM_POOL}-0")
                    assert ran_on.pid == worker.pid, (stage, ran_on)
                else:
                    assert ran_on.pool is None and ran_on.pid == os.getpid(), (stage, ran_on)
    logs = logs_of(flow_run.id)
    assert sum("generation engine started" in line for line in logs) == 1, logs
    assert sum("policy loaded" in line for line in logs) == 1, logs
    assert any("generation engine refit in place to step 1" in line for line in logs), logs


def test_generate_and_logprob_fan_out_over_two_workers_bit_for_bit(
    tmp_path: Path, whole: Path
) -> None:
    """Each shard is a task run of its own, taken by whichever worker is free: the two
    workers share them; merged, the stages' outputs are one process's bit for bit."""
    with stage_workers(WARM_POOL, tmp_path, count=2):
        run(tmp_path, "split", [*CHUNKED, *SPLIT, *placed_on(WARM_POOL)])
    workers = set()
    for iteration in (0, 1):
        split, unsplit = (
            manifest(tmp_path, "split", iteration),
            manifest(whole, "chunked", iteration),
        )
        for stage in ("generate", "logprob"):
            outputs = split[stage].outputs["batch"]
            assert outputs.sha256 == unsplit[stage].outputs["batch"].sha256, stage
            folder = tmp_path / "runs" / "split" / f"iter_{iteration:06d}" / stage
            for index in (0, 1):
                entry = json.loads((folder / f"shard-{index}-of-2.entry.json").read_text())
                assert entry["ran_on"]["pool"] == WARM_POOL
                workers.add(entry["ran_on"]["worker"])
    assert workers == {f"{WARM_POOL}-0", f"{WARM_POOL}-1"}
    assert_same_weights(final_weights(whole, "chunked"), final_weights(tmp_path, "split"))


def test_a_killed_worker_is_said_and_its_stage_runs_again_on_a_restarted_one(
    tmp_path: Path, whole: Path
) -> None:
    """The worker SIGKILLs itself in the middle of train@1 (after computing, before its
    commit); within 30 s the flow run says the pool has no live worker; a worker started
    then runs the stage, and the weights are the undisturbed run's."""
    pool, ttl = "kill-pool", "6"
    finished: dict[str, Any] = {}

    def placed_run() -> None:
        try:
            finished["result"] = run(tmp_path, "killed", placed_on(pool, ("train",)))
        except BaseException as err:  # noqa: BLE001 - the test reports it
            finished["error"] = err

    env = {"NEMO_RL_CORE_FAULT": "train@1:kill", "NEMO_RL_CORE_LEASE_TTL_S": ttl}
    with stage_workers(pool, tmp_path, env=env) as [doomed]:
        # In a copy of this context: it holds the session's Prefect settings (the server).
        runner = threading.Thread(target=contextvars.copy_context().run, args=(placed_run,))
        runner.start()
        deadline = time.monotonic() + 900
        while doomed.poll() is None:
            assert "error" not in finished and time.monotonic() < deadline, finished
            time.sleep(0.2)
        assert doomed.returncode == -9, "the worker did not die by SIGKILL at train@1"
        died = time.monotonic()
        flow_run = flow_run_of("grpo-killed")
        while not any(
            "pool 'kill-pool' has no live stage worker" in m for m in flow_run_messages(flow_run.id)
        ):
            assert time.monotonic() - died < 30, flow_run_messages(flow_run.id)
            time.sleep(0.5)
        with stage_workers(pool, tmp_path, env={"NEMO_RL_CORE_LEASE_TTL_S": ttl}) as [restarted]:
            runner.join(timeout=900)
    assert "error" not in finished, finished.get("error")
    assert_same_weights(final_weights(whole, "whole"), final_weights(tmp_path, "killed"))
    train = manifest(tmp_path, "killed", 1)["train"].ran_on
    assert train is not None and train.pid == restarted.pid, train
    said_by = time.monotonic() + 15  # Prefect's log worker sends the run's lines in batches
    while not any("has a live stage worker again" in line for line in logs_of(flow_run.id)):
        assert time.monotonic() < said_by, "the flow run never said the pool's worker is back"
        time.sleep(0.5)


def test_a_stalled_worker_is_declared_lost_and_its_stage_runs_on_another(
    tmp_path: Path, whole: Path
) -> None:
    """A worker that stops in the middle of train@1 (SIGSTOP: its connection to the server
    stays open, so Prefect gives nothing back) stops beating; the waiter marks its task run
    Crashed and submits the stage again, which the pool's other worker runs; woken up, the
    stalled worker finds its run ended at its next beat and ends itself, without a commit."""
    pool, ttl = "stall-pool", "3"
    finished: dict[str, Any] = {}

    def placed_run() -> None:
        try:
            finished["result"] = run(tmp_path, "stalled", placed_on(pool, ("train",)))
        except BaseException as err:  # noqa: BLE001 - the test reports it
            finished["error"] = err

    storage = open_storage(RunRef(str(tmp_path), "stalled"))
    stalling = {"NEMO_RL_CORE_FAULT": "train@1:stall", "NEMO_RL_CORE_LEASE_TTL_S": ttl}
    with stage_workers(pool, tmp_path, env=stalling) as [stalled]:
        runner = threading.Thread(target=contextvars.copy_context().run, args=(placed_run,))
        runner.start()
        deadline = time.monotonic() + 900
        while (record := storage.read_stage_run(1, "train")) is None:
            assert "error" not in finished and time.monotonic() < deadline, finished
            time.sleep(0.2)
        assert record.pid == stalled.pid, record
        with stage_workers(pool, tmp_path, env={"NEMO_RL_CORE_LEASE_TTL_S": ttl}) as [other]:
            os.kill(stalled.pid, signal.SIGSTOP)
            runner.join(timeout=900)
            os.kill(stalled.pid, signal.SIGCONT)
            assert stalled.wait(timeout=60) == -9, "the stalled worker outlived its lost run"
    assert "error" not in finished, finished.get("error")
    assert_same_weights(final_weights(whole, "whole"), final_weights(tmp_path, "stalled"))
    train = manifest(tmp_path, "stalled", 1)["train"].ran_on
    assert train is not None and train.pid == other.pid, train
    logs = logs_of(flow_run_of("grpo-stalled").id)
    assert any("is lost: its heartbeat on storage stopped" in line for line in logs), logs


@task
def beat_then_stop(root: str) -> float | None:
    """A placed task's heartbeat as its waiter sees it: alive while it beats (every third
    of the TTL), lost once it stopped for longer than the TTL."""
    run_ref = RunRef(root, "beats")
    context = TaskRunContext.get()
    assert context is not None
    waiter = Heartbeat(run_ref, 1, "train", str(context.task_run.id), first_beat_s=1.5)
    with stage_heartbeat(run_ref, 1, "train"):
        record = open_storage(run_ref).read_stage_run(1, "train")
        assert record is not None and record.ran_on.host == socket.gethostname(), record
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert waiter.silent_for() is None
            time.sleep(0.2)
    stopped = time.monotonic()
    while (silent := waiter.silent_for()) is None and time.monotonic() < stopped + 5:
        time.sleep(0.2)
    return silent


@flow
def beats(root: str) -> float | None:
    return beat_then_stop(root)


def test_a_stopped_heartbeat_is_lost_a_beating_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_RL_CORE_LEASE_TTL_S", "1.5")
    silent = beats(str(tmp_path))
    assert silent is not None and 1.5 < silent < 3


@task
def find_damage(root: str) -> tuple[str, str, int, str] | None:
    """A placed stage that finds its input damaged, as its waiter then sees it."""
    run_ref = RunRef(root, "damaged")
    context = TaskRunContext.get()
    assert context is not None
    task_run_id = str(context.task_run.id)
    with pytest.raises(DamagedInputError), stage_heartbeat(run_ref, 1, "reward"):
        assert damage_reported(run_ref, 1, "reward", task_run_id) is None
        raise DamagedInputError("iter_000001/generate/batch.arrow", "has sha256 ab, not cd")
    assert damage_reported(run_ref, 1, "reward", str(uuid.uuid4())) is None, "another's record"
    found = damage_reported(run_ref, 1, "reward", task_run_id)
    return None if found is None else (found.key, found.stage, found.iteration, found.detail)


@flow
def damage(root: str) -> tuple[str, str, int, str] | None:
    return find_damage(root)


def test_a_placed_stage_reports_a_damaged_input_for_its_producer_to_be_re_made(
    tmp_path: Path,
) -> None:
    assert damage(str(tmp_path)) == (
        "iter_000001/generate/batch.arrow",
        "generate",
        1,
        "has sha256 ab, not cd",
    )
