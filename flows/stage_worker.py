"""A stage worker: ``python -m flows.stage_worker --pool rollout-pool`` runs the stages that
``cluster.placement`` puts on that pool, one at a time, in this long-lived process, which
keeps the run's models and engine loaded from one iteration to the next
(``flows.pool_tasks``). Start one per device a pool has; N workers run N stages (or shards)
at once. It needs a Prefect server (``PREFECT_API_URL``) and the run's storage, and, on more
than one machine, task-scheduling storage that every machine reaches
(``PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK``; the stack's ``env.sh`` names an S3 block).

It is a Prefect task worker (``prefect.task_worker.TaskWorker``) of the pool's task keys,
with the delivery made for one engine per process:

- it takes the next task run off its subscription only when idle, and acknowledges it once
  it has run it: until then Prefect's server keeps the run with this worker, so it never
  hands a busy worker a second run while another worker of the pool idles, and gives the run
  to another worker (or this one, restarted) when this one's connection closes first;
- a delivered run that already ended (its waiter declared it lost and submitted it anew, or
  gave up on it) is acknowledged without being run;
- the stage tasks keep their own options: Prefect's default for served tasks would cache
  results by their inputs and hand back a stored result when a damaged stage is re-made.
"""

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import websockets.exceptions
from prefect import Task
from prefect.client.schemas.objects import TaskRun
from prefect.client.subscriptions import Subscription
from prefect.context import AsyncClientContext, SyncClientContext
from prefect.exceptions import ObjectNotFound
from prefect.settings import get_current_settings
from prefect.task_worker import TaskWorker

from flows.pool_tasks import pool_tasks
from tasks.stage import STAGE_POOL_ENV, STAGE_WORKER_ENV

log = logging.getLogger("nemo_rl_core.stage_worker")


class RunAtATimeSubscription(Subscription[TaskRun]):
    """Prefect's subscription to scheduled task runs, acknowledging a run when told to (its
    own acknowledges each run as it arrives)."""

    async def __anext__(self) -> TaskRun:
        while True:
            try:
                await self._ensure_connected()
                return self.model.model_validate_json(await self.websocket.recv())
            except (ConnectionRefusedError, websockets.exceptions.ConnectionClosed, TimeoutError):
                # The server gave back what this connection held, or was too busy to answer
                # the new one's handshake in time (a loaded server on SQLite): connect again.
                self._websocket = None
                if hasattr(self._connect, "protocol"):
                    await self._connect.__aexit__(None, None, None)
                await asyncio.sleep(0.5)

    async def acknowledge(self) -> None:
        with contextlib.suppress(RuntimeError, websockets.exceptions.ConnectionClosed):
            await self.websocket.send(orjson.dumps({"type": "ack"}).decode())


class StageTaskWorker(TaskWorker):
    """A task worker of stage tasks (``label``: whose, for its log) that runs one task run at
    a time (see the module docstring): a pool's stage worker, or rank 0 of a warm rank group
    (``flows.rank_group``)."""

    def __init__(self, tasks: Sequence[Task[..., Any]], label: str) -> None:
        super().__init__(*tasks, limit=1)
        self.tasks = list(tasks)  # as given: no result cache, our task keys
        self.label = label

    async def _subscribe_to_task_scheduling(self) -> None:
        subscription = RunAtATimeSubscription(
            TaskRun,
            "/task_runs/subscriptions/scheduled",
            keys=self.task_keys,
            client_id=self.client_id,
            base_url=get_current_settings().api.url,
        )
        log.info("serving %s (task keys %s)", self.label, sorted(self.task_keys))
        async for task_run in subscription:
            try:
                if await self._still_wanted(task_run) and await self._acquire_token(task_run.id):
                    await self._safe_submit_scheduled_task_run(task_run)
            finally:
                await subscription.acknowledge()

    async def _still_wanted(self, task_run: TaskRun) -> bool:
        try:
            state = (await self._client.read_task_run(task_run.id)).state
        except ObjectNotFound:  # the server queues a run before its creation is committed
            return True
        if state is not None and state.is_final():
            log.info(
                "task run %s (%s) is already %s: not run", task_run.id, task_run.name, state.name
            )
            return False
        return True


@contextlib.asynccontextmanager
async def worker_clients() -> AsyncIterator[None]:
    """Prefect's client contexts for a task worker's life: its task engine (sync) and its
    reads of the task-scheduling block (async) take their clients from them (``get_client``)
    instead of opening one each per task run (~20-40 ms each, issue 30)."""
    with SyncClientContext():
        async with AsyncClientContext():
            yield


async def serve(pool: str) -> None:
    async with worker_clients():
        await StageTaskWorker(pool_tasks(pool).all, f"pool {pool!r}").astart()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.stage_worker", description=__doc__)
    parser.add_argument("--pool", required=True, help="the pool cluster.placement names")
    parser.add_argument(
        "--name", default=None, help="how runs' manifests name this worker (default: host-pid)"
    )
    args = parser.parse_args()
    if get_current_settings().api.url is None:
        sys.exit(
            "error: PREFECT_API_URL is unset: a stage worker serves a Prefect server's "
            "task runs (on the stack: source .infra/env.sh)"
        )
    os.environ[STAGE_POOL_ENV] = args.pool
    os.environ[STAGE_WORKER_ENV] = args.name or f"{socket.gethostname()}-{os.getpid()}"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # The runtime says when it loads a model or refits the engine: the run's log shows it.
    logging.getLogger("nemo_rl_core").setLevel(logging.INFO)
    asyncio.run(serve(args.pool))


if __name__ == "__main__":
    main()
