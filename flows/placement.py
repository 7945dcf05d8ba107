"""Stages placed on Prefect work pools (``cluster.placement``): each runs as a flow run of the
``stage`` deployment of its pool (``stage/<pool>``, ``flows.stage_run``) on a worker of that
pool, reading and writing the run's storage, and the iteration flow waits for it.

- Before any work every placed pool, and its ``stage`` deployment, must exist (``check_placement``).
- A stage whose manifest entry is complete for the same inputs is skipped here, as a local one
  is, without starting a flow run.
- A flow run that no worker of the pool starts within ``cluster.placement_wait_seconds`` is
  cancelled and the iteration flow fails, naming the pool.
- A placed stage that fails fails the iteration flow (its task already retried transient
  errors on the pool, as a local stage's does); running the flow again continues there.
- A placed stage whose process is lost is marked ``Crashed`` and started again, up to a local
  stage's retries: lost is a flow run Prefect saw crash, or one still ``Running`` whose heartbeat
  on storage stopped for ``NEMO_RL_CORE_LEASE_TTL_S`` (a killed worker takes its flow-run
  processes along without a word to the server), or that wrote no first beat within
  ``cluster.placement_wait_seconds``. The waiter times the heartbeat on its own clock, so the
  machines' clocks need not agree. A stage run declared lost that is still alive (a stalled
  machine) ends itself at its next beat, so that it does not commit beside its retry.
- A placed stage that finds an input damaged says so in its stage-run record on storage; the
  waiter raises the same ``DamagedInputError`` a local stage would, and the iteration re-makes
  the input by re-running its producer, wherever that is placed.
"""

import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled

from flows.lease import lease_ttl_s, mark_crashed
from nemo_rl_core.pipeline.context import DamagedInputError, StageRef
from nemo_rl_core.pipeline.runtime import runtime_for
from nemo_rl_core.pipeline.spec import Pipeline, split_round
from nemo_rl_core.pipeline.stage_keys import check_placed_stages
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.manifest import DamagedInput, StageRun
from nemo_rl_core.utils.config import ConfigError
from tasks.faults import kill_process_tree
from tasks.stage import (
    STAGE_TASK_OPTIONS,
    run_stage_tasks,
    stage_inputs,
    stage_logger,
    where_this_runs,
)

STAGE_FLOW = "stage"
POLL_S = 1.0
FORWARDED_ENV = "NEMO_RL_CORE_"
"""Variables with this prefix (lease TTL, storage budget, injected faults) go along to a
placed stage's flow run, so it behaves as the same stage would in the iteration flow."""


class PlacementError(RuntimeError):
    """A placed stage did not finish on its pool; the message names the pool."""


class StageRunLost(RuntimeError):
    """A placed stage's process is gone without finishing (crashed, or its heartbeat stopped)."""


def deployment_name(pool: str) -> str:
    return f"{STAGE_FLOW}/{pool}"


def placed_pool(config: Any, name: str) -> str | None:
    """The work pool ``cluster.placement`` puts stage ``name`` on (a refill round
    ``reward.2`` goes where ``reward`` goes), or None: it runs in the iteration flow."""
    cluster = getattr(config, "cluster", None)
    return None if cluster is None else cluster.placement.get(split_round(name)[0])


def check_placement(config: Any, pipeline: Pipeline) -> None:
    """Before any work: placed stages are the algorithm's, and each pool exists on the
    Prefect server with its ``stage`` deployment; ``ConfigError`` naming the key and pool."""
    cluster = getattr(config, "cluster", None)
    if cluster is None or not cluster.placement:
        return
    check_placed_stages(config, pipeline)
    with get_client(sync_client=True) as client:
        pools = sorted(pool.name for pool in client.read_work_pools())
        for stage, pool in sorted(cluster.placement.items()):
            if pool not in pools:
                raise ConfigError(
                    f"cluster.placement.{stage}: work pool {pool!r} does not exist on the "
                    f"Prefect server {client.api_url}; its pools are {pools}. Create it "
                    f"(prefect work-pool create {pool} --type process) or name one of those"
                )
            try:
                client.read_deployment_by_name(deployment_name(pool))
            except ObjectNotFound:
                raise ConfigError(
                    f"cluster.placement.{stage}: work pool {pool!r} has no deployment "
                    f"{deployment_name(pool)!r}; add one like stage/train-pool to prefect.yaml "
                    "and run prefect deploy"
                ) from None


def run_placed_stage(
    config: Any, run: RunRef, iteration: int, name: str, upstream: dict[str, StageRef]
) -> StageRef:
    """Stage ``name`` where ``cluster.placement`` puts it: a flow run on its work pool, or
    task runs in this flow run."""
    pool = placed_pool(config, name)
    if pool is None:
        return run_stage_tasks(config, run, iteration, name, upstream)
    runtime = runtime_for(run)
    inputs = stage_inputs(runtime, runtime.pipeline.stage(name), iteration, upstream)
    entry = open_storage(run).completed_stage(iteration, name, inputs)
    if entry is not None:
        stage_logger().info(
            "run %s iteration %d stage %s: complete with these inputs, skipped (placed on %s)",
            run.run_id,
            iteration,
            name,
            pool,
        )
        return StageRef(entry.outputs)
    retries = int(STAGE_TASK_OPTIONS["retries"])
    for attempt in range(retries + 1):
        flow_run = start_stage_run(run, iteration, name, upstream, pool)
        try:
            return wait_for_stage_run(config, run, iteration, name, pool, flow_run.id)
        except StageRunLost as lost:
            if attempt == retries:
                raise PlacementError(
                    f"stage {name!r} of iteration {iteration} on work pool {pool!r}: lost "
                    f"{retries + 1} times, last: {lost}"
                ) from lost
            stage_logger().warning(
                "run %s: %s; running it again on work pool %r (retry %d of %d)",
                run.run_id,
                lost,
                pool,
                attempt + 1,
                retries,
            )
    raise AssertionError("unreachable: the last attempt returns or raises")


def start_stage_run(
    run: RunRef, iteration: int, name: str, upstream: Mapping[str, StageRef], pool: str
) -> FlowRun:
    """A flow run of ``stage/<pool>`` for this stage, started now (not waited for); it gets
    the iteration flow's credentials block and ``NEMO_RL_CORE_*`` environment."""
    context = FlowRunContext.get()
    block = (context.parameters or {}).get("storage_block") if context is not None else None
    env = {key: value for key, value in os.environ.items() if key.startswith(FORWARDED_ENV)}
    # Prefect's async_dispatch types every call as R | Coroutine; from sync code it is R.
    flow_run: FlowRun = run_deployment(  # type: ignore[assignment]
        deployment_name(pool),
        parameters={
            "run_id": run.run_id,
            "storage_root": run.storage_root,
            "iteration": iteration,
            "name": name,
            "upstream": {stage: ref.to_dict() for stage, ref in upstream.items()},
            "storage_block": block,
        },
        flow_run_name=f"{name}-it{iteration}-{run.run_id}",
        timeout=0,
        # A subflow link would leave a placeholder task run Pending: we poll ourselves.
        as_subflow=False,
        job_variables={"env": env} if env else None,
    )
    return flow_run


def wait_for_stage_run(
    config: Any, run: RunRef, iteration: int, name: str, pool: str, flow_run_id: UUID
) -> StageRef:
    """Wait for a placed stage's flow run; its stored outputs once it completed.

    ``PlacementError`` if no worker starts it within ``cluster.placement_wait_seconds`` or it
    fails; ``StageRunLost`` if its process is gone (the caller runs it again)."""
    wait_s = config.cluster.placement_wait_seconds
    submitted = time.monotonic()
    heartbeat = Heartbeat(run, iteration, name, str(flow_run_id), first_beat_s=wait_s)
    with get_client(sync_client=True) as client:
        while True:
            flow_run = client.read_flow_run(flow_run_id)
            state = flow_run.state
            label = f"stage {name!r} of iteration {iteration} on work pool {pool!r}"
            if state is None or state.is_scheduled() or state.is_pending():
                if time.monotonic() - submitted > wait_s:
                    message = (
                        f"{label}: no worker of the pool started it within "
                        f"cluster.placement_wait_seconds={wait_s:g} ({workers_of(client, pool)}); "
                        f"start one: prefect worker start --pool {pool}"
                    )
                    client.set_flow_run_state(flow_run_id, Cancelled(message=message), force=True)
                    raise PlacementError(message)
            elif state.is_completed():
                return stored_outputs(run, iteration, name, label)
            elif state.is_crashed():
                raise StageRunLost(f"{label}: flow run {flow_run.name} crashed: {state.message}")
            elif state.is_final():
                if (damage := damage_reported(run, iteration, name, flow_run_id)) is not None:
                    raise damage
                raise PlacementError(
                    f"{label}: flow run {flow_run.name} ended {state.name}: {state.message}"
                )
            elif (silent := heartbeat.silent_for()) is not None:
                why = f"its heartbeat on storage stopped {silent:.0f} s ago"
                for line in mark_crashed(str(flow_run_id), why):
                    stage_logger().warning("run %s: %s", run.run_id, line)
                raise StageRunLost(f"{label}: flow run {flow_run.name} is lost: {why}")
            time.sleep(POLL_S)


def stored_outputs(run: RunRef, iteration: int, name: str, label: str) -> StageRef:
    entry = open_storage(run).read_manifest(iteration).complete(name)
    if entry is None:
        raise PlacementError(f"{label}: its flow run completed but the manifest has no entry")
    return StageRef(entry.outputs)


def damage_reported(
    run: RunRef, iteration: int, name: str, flow_run_id: UUID
) -> DamagedInputError | None:
    """The damaged input this stage's flow run found and recorded (``stage_heartbeat``)."""
    record = open_storage(run).read_stage_run(iteration, name)
    if record is None or record.ran_on.flow_run != str(flow_run_id) or record.damaged is None:
        return None
    return DamagedInputError(record.damaged.key, record.damaged.detail)


def workers_of(client: SyncPrefectClient, pool: str) -> str:
    workers = client.read_workers_for_work_pool(pool)
    shown = ", ".join(f"{worker.name} {worker.status}" for worker in workers)
    return f"its workers: {shown}" if workers else "it has no worker"


class Heartbeat:
    """The waiter's view of a running placed stage's heartbeat on storage: when it last saw
    the record change, by its own monotonic clock. Before its first beat a flow run is still
    starting (imports, storage, on a busy machine), which may take ``first_beat_s``."""

    def __init__(
        self, run: RunRef, iteration: int, name: str, flow_run_id: str, first_beat_s: float
    ) -> None:
        self.run, self.iteration, self.name, self.flow_run_id = run, iteration, name, flow_run_id
        self.first_beat_s = first_beat_s
        self.last_beat: object = None
        self.seen_at: float | None = None  # when the flow run was first seen running

    def silent_for(self) -> float | None:
        """Seconds since the last beat, if longer than the stage's TTL (None: alive)."""
        record = open_storage(self.run).read_stage_run(self.iteration, self.name)
        if record is not None and record.ran_on.flow_run != self.flow_run_id:
            record = None  # an earlier attempt's
        beat = None if record is None else record.beat
        now = time.monotonic()
        if self.seen_at is None or beat != self.last_beat:
            self.seen_at, self.last_beat = now, beat
            return None
        allowed = self.first_beat_s if record is None else record.ttl_s
        silent = now - self.seen_at
        return silent if silent > allowed else None


def declared_lost(flow_run_id: str | None) -> bool:
    """Whether Prefect holds this flow run ended while it still runs (an unreachable API
    says nothing: the stage goes on)."""
    if flow_run_id is None:
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(flow_run_id)).state
    except Exception:  # noqa: BLE001 - see the docstring
        return False
    return state is not None and state.is_final()


@contextmanager
def stage_heartbeat(run: RunRef, iteration: int, name: str) -> Iterator[None]:
    """Beat on storage every third of ``NEMO_RL_CORE_LEASE_TTL_S`` while a placed stage runs,
    saying who runs it (pool, worker, host, pid): the waiting iteration flow reads it. A
    beat that finds this flow run ended (its waiter declared it lost and marked it
    ``Crashed``) ends the process, which would otherwise commit beside its retry. A damaged
    input the stage finds goes into the record, for the waiter to have its producer re-run."""
    ttl = lease_ttl_s()
    storage = open_storage(run)
    record = StageRun(where_this_runs(), pid=os.getpid(), ttl_s=ttl)
    storage.write_stage_run(iteration, name, record)
    stop = threading.Event()
    log = stage_logger()

    def keep_beating() -> None:
        nonlocal record
        while not stop.wait(ttl / 3):
            if declared_lost(record.ran_on.flow_run):
                log.error("run %s: stage %s was declared lost; ending it", run.run_id, name)
                kill_process_tree()
            record = replace(record, beat=record.beat + 1)
            try:
                storage.write_stage_run(iteration, name, record)
            except Exception as err:  # noqa: BLE001 - a missed beat must not kill the stage
                log.warning("run %s: heartbeat of stage %s failed: %s", run.run_id, name, err)

    beater = threading.Thread(target=keep_beating, name=f"heartbeat-{name}", daemon=True)
    beater.start()
    damaged = None
    try:
        yield
    except DamagedInputError as err:
        damaged = DamagedInput(err.key, err.detail)
        raise
    finally:
        stop.set()
        beater.join()  # before the last write: no beat may overwrite the damage record
        if damaged is not None:
            storage.write_stage_run(iteration, name, replace(record, damaged=damaged))
