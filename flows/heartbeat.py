"""The heartbeat of a placed task run on the run's storage: the stage worker running it beats
(``stage_heartbeat``), the iteration flow waiting for it reads the beats (``Heartbeat``).

A killed worker says nothing to anyone, and Prefect keeps its task run ``Running``; the
beats stopping is how the waiter learns of it. The waiter times the beats on its own clock,
so the machines' clocks need not agree. The record (``runs/<id>/stage_runs/iter_<n>.<name>.json``)
also says who runs the task (pool, worker, host, pid, task run), and carries a damaged input
the task found back to the waiter, which has its producer re-made.
"""

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from uuid import UUID

from prefect.client.orchestration import get_client

from flows.lease import lease_ttl_s
from nemo_rl_core.pipeline.context import DamagedInputError
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.manifest import DamagedInput, StageRun
from tasks.faults import kill_process_tree
from tasks.stage import stage_logger, where_this_runs


@contextmanager
def stage_heartbeat(run: RunRef, iteration: int, name: str) -> Iterator[None]:
    """Beat on storage every third of ``NEMO_RL_CORE_LEASE_TTL_S`` while a placed task runs
    (``name``: its stage, or the stage and part: ``generate.shard-0-of-2``). A beat that finds
    this task run ended (its waiter declared it lost and marked it ``Crashed``) ends the
    process, which would otherwise commit beside the retry. A damaged input the task finds
    goes into the record, for the waiter to have its producer re-run."""
    ttl = lease_ttl_s()
    storage = open_storage(run)
    record = StageRun(where_this_runs(), pid=os.getpid(), ttl_s=ttl)
    storage.write_stage_run(iteration, name, record)
    stop = threading.Event()
    log = stage_logger()

    def keep_beating() -> None:
        nonlocal record
        while not stop.wait(ttl / 3):
            if declared_lost(record.ran_on.task_run):
                log.error("run %s: %s was declared lost; ending this process", run.run_id, name)
                kill_process_tree()
            record = replace(record, beat=record.beat + 1)
            try:
                storage.write_stage_run(iteration, name, record)
            except Exception as err:  # noqa: BLE001 - a missed beat must not kill the stage
                log.warning("run %s: heartbeat of %s failed: %s", run.run_id, name, err)

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


def declared_lost(task_run_id: str | None) -> bool:
    """Whether Prefect holds this task run ended while it still runs (an unreachable API
    says nothing: the stage goes on)."""
    if task_run_id is None:
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_task_run(UUID(task_run_id)).state
    except Exception:  # noqa: BLE001 - see the docstring
        return False
    return state is not None and state.is_final()


class Heartbeat:
    """The waiter's view of one placed task run's beats: when it last saw its record change,
    by its own monotonic clock. Before its first beat a task run is still starting (reading
    its parameters, on a busy machine), which may take ``first_beat_s``."""

    def __init__(
        self, run: RunRef, iteration: int, name: str, task_run_id: str, first_beat_s: float
    ) -> None:
        self.run, self.iteration, self.name, self.task_run_id = run, iteration, name, task_run_id
        self.first_beat_s = first_beat_s
        self.last_beat: object = None
        self.seen_at: float | None = None  # when the task run was first seen running

    def silent_for(self) -> float | None:
        """Seconds since the last beat, if longer than the task's TTL (None: alive)."""
        record = open_storage(self.run).read_stage_run(self.iteration, self.name)
        if record is not None and record.ran_on.task_run != self.task_run_id:
            record = None  # an earlier task run's
        # A task run Prefect delivered again after its worker died beats anew from 0.
        beat = None if record is None else (record.ran_on.host, record.pid, record.beat)
        now = time.monotonic()
        if self.seen_at is None or beat != self.last_beat:
            self.seen_at, self.last_beat = now, beat
            return None
        allowed = self.first_beat_s if record is None else record.ttl_s
        silent = now - self.seen_at
        return silent if silent > allowed else None


def damage_reported(
    run: RunRef, iteration: int, name: str, task_run_id: str
) -> DamagedInputError | None:
    """The damaged input this task run found and recorded (``stage_heartbeat``)."""
    record = open_storage(run).read_stage_run(iteration, name)
    if record is None or record.ran_on.task_run != task_run_id or record.damaged is None:
        return None
    return DamagedInputError(record.damaged.key, record.damaged.detail)
