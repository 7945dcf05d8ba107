"""Stages placed on pools of warm stage workers (``cluster.placement``): the iteration flow
submits each as a Prefect task run (``Task.apply_async``) that a stage worker of the pool
(``flows.stage_worker``: a Prefect task worker) runs in a process that keeps the run's
models and engine loaded, and waits for it. The task run belongs to the iteration flow run
(it shows in the flow run's graph), its parameters go through Prefect's task-scheduling
storage, and its outputs, as every stage's, go to the run's storage.

- Before any work: the placed stages are the algorithm's, and the flow talks to a Prefect
  server (task workers connect to one; the ephemeral API has none); each pool's live workers
  are logged, a pool without one at once (``check_placement``).
- A stage whose manifest entry is complete for the same inputs is skipped without a task run.
- A stage that fans out (``orchestration.fan_out``) is a job of shard task runs on its pool,
  one per shard, then the merge there; a shard that fails is run again alone.
- Nobody to run it: a pool with no live worker (Prefect's ``/task_workers/filter``: the server
  forgets a worker within a second of its connection closing) is said within
  ``WORKERS_CHECK_S`` in the log and in the flow run's state message; a task run that makes no
  progress (not started, or its worker gone) for ``cluster.placement_wait_seconds`` is
  cancelled and the flow fails, naming the pool.
- Lost: a worker that dies gives its task run back (Prefect's server queues it again when
  the worker's connection closes), and a restarted or other worker of the pool runs it. A
  task run whose heartbeat on storage (``flows.heartbeat``) stopped for
  ``NEMO_RL_CORE_LEASE_TTL_S`` while the pool has a live worker is marked ``Crashed`` and
  submitted again, up to a local stage's retries; a crashed one too.
- A stage that fails fails the iteration flow (its task retried transient errors on the pool,
  as a local stage's does); running the flow again continues there. One that found an input
  damaged raises the same ``DamagedInputError`` a local stage would, and the iteration
  re-makes the input by re-running its producer, wherever that is placed.

A job is one or more task runs on one pool, waited for together. A stage made of several
processes (the ranks of one torch.distributed job) runs as one task run per node, waited
for and run again together (``flows.placed_nodes``).
"""

import contextvars
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar
from uuid import UUID

from prefect import Task
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import State
from prefect.context import AsyncClientContext, FlowRunContext
from prefect.settings import get_current_settings
from prefect.states import Cancelled, Crashed, Pending, Running
from prefect.task_runs import TaskRunWaiter
from prefect.utilities.asyncutils import run_coro_as_sync

from flows.busy_retry import retrying_soon
from flows.heartbeat import Heartbeat, damage_reported
from flows.lease import current_flow_run
from flows.pool_tasks import chain_name, heartbeat_name, pool_tasks
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.pipeline.runtime import RunRuntime, runtime_for
from nemo_rl_core.pipeline.spec import Pipeline, split_round
from nemo_rl_core.pipeline.stage_keys import check_placed_stages
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.run_storage import RunStorage
from nemo_rl_core.utils.config import ConfigError
from tasks.stage import STAGE_TASK_OPTIONS, stage_inputs, stage_logger

POLL_S = 1.0  # longest wait for a task run's final state before the liveness checks run
WORKERS_CHECK_S = 5.0  # how often the server is asked for the pool's live workers
R = TypeVar("R")  # what a placed task run gives back: a stage's outputs, or a chain's
START_WORKER = (
    "python -m flows.stage_worker --pool {pool} (on the stack: infra/stack.sh start worker@{pool})"
)


class PlacementError(RuntimeError):
    """A placed stage did not finish on its pool; the message names the pool."""


def placed_pool(config: Any, name: str) -> str | None:
    """The pool ``cluster.placement`` puts stage ``name`` on (a refill round ``reward.2``
    goes where ``reward`` goes), or None: it runs in the iteration flow."""
    cluster = getattr(config, "cluster", None)
    return None if cluster is None else cluster.placement.get(split_round(name)[0])


def check_placement(config: Any, pipeline: Pipeline) -> None:
    """Before any work: placed stages are the algorithm's and a Prefect server is there for
    stage workers to serve (``ConfigError`` naming the key); each pool's live workers are
    logged, and a pool without one is said at once (its stages wait for one)."""
    cluster = getattr(config, "cluster", None)
    if cluster is None or not cluster.placement:
        return
    check_placed_stages(config, pipeline)
    if get_current_settings().api.url is None:
        stage, pool = sorted(cluster.placement.items())[0]
        raise ConfigError(
            f"cluster.placement.{stage}: pool {pool!r} is served by stage workers, which "
            "connect to a Prefect server, and this flow runs on Prefect's ephemeral API "
            "(PREFECT_API_URL is unset): start one (infra/stack.sh start; source "
            ".infra/env.sh), or leave cluster.placement out to run every stage here"
        )
    with get_client(sync_client=True) as client:
        for pool in sorted(set(cluster.placement.values())):
            workers = live_workers(client, pool)
            if workers:
                stage_logger().info("pool %r: %d live stage worker(s)", pool, len(workers))
            else:
                stage_logger().warning(
                    "pool %r has no live stage worker; its stages wait up to "
                    "cluster.placement_wait_seconds=%g for one: start one with %s",
                    pool,
                    cluster.placement_wait_seconds,
                    START_WORKER.format(pool=pool),
                )


def live_workers(client: SyncPrefectClient, pool: str) -> list[str]:
    """The task workers the server holds connected for ``pool``'s tasks (their client ids)."""
    keys = pool_tasks(pool).task_keys
    response = client.request(
        "POST", "/task_workers/filter", json={"task_worker_filter": {"task_keys": keys}}
    )
    response.raise_for_status()
    return sorted(worker["identifier"] for worker in response.json())


@dataclass(frozen=True)
class PlacedTask(Generic[R]):
    """One task run of a placed job: the pool task and its parameters, the name its heartbeat
    is recorded under, how messages name it, and how its committed outputs are read."""

    task: Task[..., R]
    parameters: dict[str, Any]
    heartbeat: str
    label: str
    stored: Callable[[], R | None]


def run_placed_chain(
    config: Any, run: RunRef, iteration: int, names: list[str], upstream: dict[str, StageRef]
) -> dict[str, StageRef]:
    """Consecutive stages ``names`` that ``cluster.placement`` puts on one pool (none fans
    out), as one task run of its stage workers; their outputs by stage. Skipped without a
    task run when the manifest holds all of them complete for the same inputs."""
    pool = placed_pool(config, names[0])
    assert pool is not None and all(placed_pool(config, n) == pool for n in names), names
    runtime, storage = runtime_for(run), open_storage(run)
    name = chain_name(names)
    label = f"stages {names} of iteration {iteration}"
    stored = partial(stored_chain, runtime, storage, iteration, names, upstream)
    if (refs := stored()) is not None:
        skipped(run, label, pool)
        return refs
    given = {"run": run, "iteration": iteration, "name": name, "upstream": upstream}
    chain = PlacedTask(
        pool_tasks(pool).chain,
        {**given, "storage_block": flow_run_block()},
        heartbeat_name(name),
        label,
        stored,
    )
    [refs] = run_job(config, run, iteration, pool, [chain])
    return refs


def stored_chain(
    runtime: RunRuntime,
    storage: RunStorage,
    iteration: int,
    names: list[str],
    upstream: dict[str, StageRef],
) -> dict[str, StageRef] | None:
    """The outputs a chain of placed stages committed, each for the inputs the stages before
    it make, from the manifest as stored now; None unless all are complete."""
    manifest = storage.read_manifest(iteration)
    done, refs = dict(upstream), {}
    for name in names:
        spec = runtime.pipeline.stage(name)
        reads = {r: done[r] for r in spec.all_reads if r in done}
        entry = manifest.complete(name)
        if entry is None or entry.inputs != stage_inputs(runtime, spec, iteration, reads):
            return None
        done[name] = refs[name] = StageRef(entry.outputs)
    return refs


def on_pool(pool: str | None) -> str:
    """Where a placed job runs, as messages say it (``pool`` None: the training stage on
    this machine's ranks)."""
    return f"on pool {pool!r}" if pool is not None else "on this machine's ranks"


def skipped(run: RunRef, label: str, pool: str | None) -> None:
    stage_logger().info(
        "run %s: %s is complete with these inputs, skipped (placed %s)",
        run.run_id,
        label,
        on_pool(pool),
    )


def stored_stage(
    storage: RunStorage, iteration: int, name: str, inputs: dict[str, str]
) -> StageRef | None:
    """The outputs a placed stage committed for ``inputs``, from the manifest as stored now
    (another process wrote it); the next stage checks the bytes as it reads them."""
    entry = storage.read_manifest(iteration).complete(name)
    return None if entry is None or entry.inputs != inputs else StageRef(entry.outputs)


def stored_part(
    storage: RunStorage, iteration: int, name: str, part: str, inputs: dict[str, str]
) -> StageRef | None:
    entry = storage.completed_part(iteration, name, part, inputs)
    return None if entry is None else StageRef(entry.outputs)


def flow_run_block() -> str | None:
    """The credentials block the iteration flow run was given, for its placed stages."""
    context = FlowRunContext.get()
    return (context.parameters or {}).get("storage_block") if context is not None else None


def run_job(
    config: Any, run: RunRef, iteration: int, pool: str, job: list[PlacedTask[R]]
) -> list[R]:
    """Run a job's tasks on ``pool``, a task run each, and wait for all of them; their stored
    outputs in order. A lost one is run again alone. ``PlacementError`` naming the pool, or
    the stage's own damage report (``DamagedInputError``).

    A task run's end comes as Prefect's event (``TaskRunWaiter``), as it happens; once a
    second (``POLL_S``) the waiter also reads the runs' states and heartbeats, and asks
    whether the pool has a live worker."""
    wait_s = config.cluster.placement_wait_seconds
    watch = PoolWatch.of(pool)
    ended = threading.Event()  # set by Prefect's event loop when one of the runs ends
    # Submitted side by side (a submission is a few requests), each in a copy of this flow
    # run's context, taken here: a task run of this flow run, queued before any is taken.
    contexts = [contextvars.copy_context() for _ in job]
    with ThreadPoolExecutor(max_workers=len(job) or 1, thread_name_prefix="submit") as submitter:
        submitted = submitter.map(
            lambda context, placed: context.run(
                PlacedRun, placed, run, iteration, pool, wait_s, ended
            ),
            contexts,
            job,
        )
        waiting = dict(enumerate(submitted))
    done: dict[int, R] = {}
    checked_at = time.monotonic()
    try:
        while waiting:
            check = time.monotonic() - checked_at >= POLL_S
            if check:
                watch.check()
                checked_at = time.monotonic()
            ended.clear()
            for index, placed_run in list(waiting.items()):
                if (ref := placed_run.poll(watch, check)) is not None:
                    done[index] = ref
                    del waiting[index]
            if waiting:
                ended.wait(timeout=max(0.0, checked_at + POLL_S - time.monotonic()))
    finally:
        watch.settle()
    return [done[index] for index in range(len(job))]


class PlacedRun(Generic[R]):
    """One placed task and its current task run: submitted now, and again when lost."""

    def __init__(
        self,
        placed: PlacedTask[R],
        run: RunRef,
        iteration: int,
        pool: str,
        wait_s: float,
        ended: threading.Event,
    ) -> None:
        self.placed, self.run, self.iteration, self.pool = placed, run, iteration, pool
        self.wait_s, self.ended = wait_s, ended
        self.retries_left = int(STAGE_TASK_OPTIONS["retries"])
        self.submit()

    def submit(self) -> None:
        TaskRunWaiter.instance()  # listening before the run can end
        self.task_run_id = apply_async(self.placed.task, self.placed.parameters)
        TaskRunWaiter.add_done_callback(self.task_run_id, self.ended.set)
        self.heartbeat = Heartbeat(
            self.run, self.iteration, self.placed.heartbeat, str(self.task_run_id), self.wait_s
        )
        self.progress_at = time.monotonic()  # when it last made progress (or was submitted)

    def state(self, check: bool) -> State | None:
        return task_run_state(self.task_run_id, check)

    def poll(self, watch: "PoolWatch", check: bool) -> R | None:
        """Its stored outputs once its task run completed, else None (still waiting); with
        ``check``, its liveness: it is submitted again when lost, and the job fails when no
        worker ran it for ``placement_wait_seconds``."""
        label = f"{self.placed.label} on pool {self.pool!r}"
        state = self.state(check)
        if state is None:
            return None
        if state.is_completed():
            ref = self.placed.stored()
            if ref is None:
                raise PlacementError(f"{label}: its task run completed but committed nothing")
            return ref
        if state.is_crashed():
            self.run_again(f"task run {self.task_run_id} crashed: {state.message}")
        elif state.is_final():
            damage = damage_reported(
                self.run, self.iteration, self.placed.heartbeat, str(self.task_run_id)
            )
            if damage is not None:
                raise damage
            raise PlacementError(
                f"{label}: task run {self.task_run_id} ended {state.name}: {state.message}"
            )
        elif state.is_running():
            silent = self.heartbeat.silent_for()
            if silent is None:
                self.progress_at = time.monotonic()
            elif watch.live:  # else Prefect holds it for the next worker of the pool to start
                why = f"its heartbeat on storage stopped {silent:.0f} s ago"
                mark_task_run_crashed(self.task_run_id, why)
                self.run_again(f"task run {self.task_run_id} is lost: {why}")
        if time.monotonic() - self.progress_at > self.wait_s:
            with get_client(sync_client=True) as client:
                message = (
                    f"{label}: no stage worker of the pool ran it for "
                    f"cluster.placement_wait_seconds={self.wait_s:g} "
                    f"(live workers: {live_workers(client, self.pool) or 'none'}); start one: "
                    f"{START_WORKER.format(pool=self.pool)}"
                )
                client.set_task_run_state(self.task_run_id, Cancelled(message=message), force=True)
            raise PlacementError(message)
        return None

    def run_again(self, why: str) -> None:
        label = f"{self.placed.label} on pool {self.pool!r}"
        if self.retries_left == 0:
            raise PlacementError(
                f"{label}: lost {int(STAGE_TASK_OPTIONS['retries']) + 1} times, last: {why}"
            )
        self.retries_left -= 1
        stage_logger().warning("run %s: %s: %s; running it again", self.run.run_id, label, why)
        self.submit()


def task_run_state(task_run_id: UUID, check: bool) -> State | None:
    """A waited-for task run's final state, as Prefect's event told it; with ``check``, else
    its state as the server holds it (up to a second behind: prefect.toml batches task-run
    states)."""
    final = run_coro_as_sync(TaskRunWaiter.wait_for_task_run(task_run_id, timeout=0))
    if final is not None or not check:
        return final
    with get_client(sync_client=True) as client:
        return client.read_task_run(task_run_id).state or Pending()


def apply_async(task: Task[..., Any], parameters: dict[str, Any]) -> UUID:
    """Submit a task run of ``task`` (Prefect's ``Task.apply_async``), creating it with this
    process's submission client."""

    def submit() -> UUID:
        # In a copy of this thread's context only: the client is bound to the run-sync loop.
        AsyncClientContext.__var__.set(submission_client(get_current_settings().api.url))
        return task.apply_async(kwargs=parameters).task_run_id

    return contextvars.copy_context().run(submit)


_submission_clients: dict[str | None, AsyncClientContext] = {}
_submission_lock = threading.Lock()


def submission_client(api_url: str | None) -> AsyncClientContext:
    """One Prefect async client per process and API for submitting placed task runs, open in
    Prefect's run-sync event loop, where ``Task.apply_async`` runs. Prefect's task-run
    creation and its read of the task-scheduling block take their client from
    ``AsyncClientContext`` (``get_client``); without one each opens and closes its own, ~20-40
    ms apiece on the loaded 2-core machine (bench/RESULTS.md, issue 30). It stays open for the
    process's life (a flow run's), and retries a busy server's answer soon
    (``flows.busy_retry``)."""
    with _submission_lock:
        if api_url not in _submission_clients:
            context = AsyncClientContext()
            retrying_soon(context.client)
            run_coro_as_sync(context.client.__aenter__())
            _submission_clients[api_url] = context
        return _submission_clients[api_url]


def mark_task_run_crashed(task_run_id: UUID, why: str) -> None:
    """Mark a task run whose process is gone ``Crashed``; should that process still live (a
    stalled machine), its next heartbeat finds this and ends it."""
    with get_client(sync_client=True) as client:
        client.set_task_run_state(
            task_run_id, Crashed(message=f"its process is gone: {why}"), force=True
        )


class PoolWatch:
    """What the iteration flow run tells about a pool's workers while it waits on the pool:
    whether the server holds a live one (asked every ``WORKERS_CHECK_S``); when none, a
    warning in its log and its state message, and a line again when one is back. One per
    pool and flow run, across its jobs."""

    _watches: dict[tuple[str, str | None], "PoolWatch"] = {}
    _lock = threading.Lock()

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.live = True
        self.asked_at = -WORKERS_CHECK_S
        self.told = False

    @classmethod
    def of(cls, pool: str) -> "PoolWatch":
        with cls._lock:
            return cls._watches.setdefault((pool, current_flow_run()), cls(pool))

    def check(self) -> None:
        if time.monotonic() - self.asked_at < WORKERS_CHECK_S:
            return
        self.asked_at = time.monotonic()
        with get_client(sync_client=True) as client:
            self.live = bool(live_workers(client, self.pool))
            if not self.live and not self.told:
                message = (
                    f"pool {self.pool!r} has no live stage worker: its stages wait for one "
                    f"(start one: {START_WORKER.format(pool=self.pool)})"
                )
                stage_logger().warning(message)
                set_flow_run_message(client, message)
                self.told = True
            elif self.live and self.told:
                self.all_clear(client)

    def settle(self) -> None:
        """A job on the pool is done (a worker ran it): clear a warning still shown."""
        if self.told:
            with get_client(sync_client=True) as client:
                self.all_clear(client)

    def all_clear(self, client: SyncPrefectClient) -> None:
        stage_logger().info("pool %r has a live stage worker again", self.pool)
        set_flow_run_message(client, None)
        self.told = False


def set_flow_run_message(client: SyncPrefectClient, message: str | None) -> None:
    """Show ``message`` as this flow run's state message (the UI's run header), or clear it."""
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None:
        client.set_flow_run_state(context.flow_run.id, Running(message=message), force=True)
