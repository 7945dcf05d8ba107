"""Stages placed on work pools (``cluster.placement``), where no worker is needed to tell:
a placement the server cannot honour is refused before any work, naming the key and pool;
a pool whose deployment no worker starts fails the run after ``placement_wait_seconds``,
naming the pool; a placed stage whose heartbeat stops is seen as lost. Two pools with
workers, and a worker killed mid-stage, are on the stack (tests/stack/test_placement_on_stack.py)."""

import json
import socket
import time
import uuid
from pathlib import Path

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.context import FlowRunContext
from prefect.workers.process import ProcessWorker

from flows.grpo import grpo
from flows.placement import Heartbeat, PlacementError, damage_reported, stage_heartbeat
from nemo_rl_core.pipeline.context import DamagedInputError
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.utils.config import ConfigError

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples/configs/grpo_math_tiny_fast.yaml"
IDLE_POOL = "idle-pool"


def run(root: Path, run_id: str, overrides: list[str]) -> dict:
    return grpo(config_path=str(CONFIG), overrides=overrides, run_id=run_id, storage_root=str(root))


@pytest.fixture(scope="module")
def idle_pool() -> str:
    """A process pool with the stage flow deployed on it, and no worker."""
    with get_client(sync_client=True) as client:
        template = ProcessWorker.get_default_base_job_template()
        client.create_work_pool(
            WorkPoolCreate(name=IDLE_POOL, type="process", base_job_template=template)
        )
        flow_id = client.create_flow_from_name("stage")
        client.create_deployment(
            flow_id=flow_id,
            name=IDLE_POOL,
            work_pool_name=IDLE_POOL,
            entrypoint="flows/stage_run.py:stage_flow",
        )
    return IDLE_POOL


def test_a_pool_that_does_not_exist_is_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cluster.placement.train: work pool 'no-such-pool'"):
        run(tmp_path, "nowhere", ["++cluster.placement.train=no-such-pool"])
    assert not (tmp_path / "runs").exists(), "wrote before refusing"


def test_a_stage_the_algorithm_lacks_is_refused_by_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cluster.placement.genrate: grpo has no stage"):
        run(tmp_path, "typo", ["++cluster.placement.genrate=some-pool"])
    assert not (tmp_path / "runs").exists()


def test_a_pool_without_a_worker_fails_after_the_wait_naming_it(
    tmp_path: Path, idle_pool: str
) -> None:
    overrides = [f"++cluster.placement.generate={idle_pool}", "++cluster.placement_wait_seconds=3"]
    started = time.monotonic()
    with pytest.raises(PlacementError, match=f"work pool '{idle_pool}'.*it has no worker"):
        run(tmp_path, "idle", overrides)
    assert time.monotonic() - started < 120
    manifest = json.loads((tmp_path / "runs/idle/iter_000000/MANIFEST.json").read_text())
    # The stage before it ran here, and says where: this host, in no worker's flow run.
    assert sorted(manifest["stages"]) == ["prompts"]
    ran_on = manifest["stages"]["prompts"]["ran_on"]
    assert (ran_on["host"], ran_on["pool"], ran_on["worker"]) == (socket.gethostname(), None, None)
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs() if r.name == "generate-it0-idle"]
    assert [r.state.type.value for r in runs if r.state] == ["CANCELLED"], runs


@flow
def beat_then_stop(root: str) -> float | None:
    """A placed stage's heartbeat as its waiter sees it: alive while it beats (every third
    of the TTL), lost once it stopped for longer than the TTL."""
    run_ref = RunRef(root, "beats")
    context = FlowRunContext.get()
    assert context is not None and context.flow_run is not None
    waiter = Heartbeat(run_ref, 1, "train", str(context.flow_run.id), first_beat_s=1.5)
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


def test_a_stopped_heartbeat_is_lost_a_beating_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEMO_RL_CORE_LEASE_TTL_S", "1.5")
    silent = beat_then_stop(str(tmp_path))
    assert silent is not None and 1.5 < silent < 3


@flow
def find_damage(root: str) -> DamagedInputError | None:
    """A placed stage that finds its input damaged, as its waiter then sees it."""
    run_ref = RunRef(root, "damaged")
    context = FlowRunContext.get()
    assert context is not None and context.flow_run is not None
    flow_run_id = context.flow_run.id
    with pytest.raises(DamagedInputError), stage_heartbeat(run_ref, 1, "reward"):
        assert damage_reported(run_ref, 1, "reward", flow_run_id) is None
        raise DamagedInputError("iter_000001/generate/batch.arrow", "has sha256 ab, not cd")
    assert damage_reported(run_ref, 1, "reward", uuid.uuid4()) is None, "another run's record"
    return damage_reported(run_ref, 1, "reward", flow_run_id)


def test_a_placed_stage_reports_a_damaged_input_for_its_producer_to_be_re_made(
    tmp_path: Path,
) -> None:
    damage = find_damage(str(tmp_path))
    assert isinstance(damage, DamagedInputError)
    assert (damage.key, damage.stage, damage.iteration) == (
        "iter_000001/generate/batch.arrow",
        "generate",
        1,
    )
    assert damage.detail == "has sha256 ab, not cd"
