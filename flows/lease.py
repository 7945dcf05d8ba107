"""Hold a run's storage lease for the life of a flow run.

The lease has a short time-to-live and a background thread renews it, so two flow runs
of one experiment never drive it at once, and a run that was killed (no renewals) stops
blocking the next one within ``NEMO_RL_CORE_LEASE_TTL_S`` seconds. The renewal thread
logs to the flow run's own log (it is handed the run's logger), and a renewal that finds
the lease taken stops the run before its next commit (``RunStorage`` refuses it).

A killed flow run leaves its Prefect state (and its task run's) ``Running`` forever and its
lease until it expires. The run that takes the expired lease over marks the dead flow run
and its running task runs ``Crashed``; ``python -m flows.lease --break`` frees a lease at once
when its holder's flow run is in a final state (and refuses while it is not).
"""

import argparse
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.lease import (
    Lease,
    LeaseHeldError,
    LeaseLostError,
    break_lease,
    read_lease,
)
from tasks.stage import stage_logger

DEFAULT_TTL_S = 120.0


def lease_ttl_s() -> float:
    return float(os.environ.get("NEMO_RL_CORE_LEASE_TTL_S", DEFAULT_TTL_S))


@contextmanager
def hold_lease(run: RunRef, owner: str) -> Iterator[Lease]:
    """Take the lease (``LeaseHeldError`` if another live run has it) and keep it renewed."""
    ttl = lease_ttl_s()
    lease = open_storage(run).acquire_lease(owner=owner, ttl_s=ttl, flow_run_id=current_flow_run())
    stop = threading.Event()
    log = stage_logger()  # bound to this flow run: the thread has no run context of its own
    taken_over = lease.taken_over or {}
    dead = taken_over.get("flow_run_id")
    if dead:
        expired = datetime.fromtimestamp(taken_over["expires_at"], UTC).isoformat()
        why = f"its lease on run {run.run_id} expired at {expired} without a release"
        for line in mark_crashed(dead, why):
            log.warning("run %s: %s", run.run_id, line)

    def keep_renewed() -> None:
        while not stop.wait(ttl / 3):
            try:
                lease.renew()
            except LeaseLostError as err:
                log.error("run %s: %s", run.run_id, err)
                return
            except Exception as err:  # noqa: BLE001 - a failed renewal must not kill the run here
                log.warning("run %s: lease renewal failed: %s", run.run_id, err)

    renewer = threading.Thread(target=keep_renewed, name=f"lease-{run.run_id}", daemon=True)
    renewer.start()
    try:
        yield lease
    except BaseException:
        # The run's own failure is what its final state must name; a failed release (the
        # store being down is often why the run failed) is logged beside it, never instead.
        stop.set()
        renewer.join()
        try:
            lease.release()
        except Exception as err:  # noqa: BLE001
            log.warning("run %s: releasing the lease failed too: %s", run.run_id, err)
        raise
    stop.set()
    renewer.join()
    lease.release()


def current_flow_run() -> str | None:
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return str(context.flow_run.id) if context and context.flow_run else None


def mark_crashed(flow_run_id: str, why: str) -> list[str]:
    """Mark a dead flow run and its task runs still ``Running``/``Pending`` as ``Crashed``;
    returns what was marked. Prefect errors are reported, never raised: the caller's own
    work must not fail for the bookkeeping of a run that is already gone."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    unfinished = TaskRunFilterState(
        type=TaskRunFilterStateType(
            any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED]
        ),
        name=None,
    )

    marked = []
    try:
        with get_client(sync_client=True) as client:
            flow_run = client.read_flow_run(UUID(flow_run_id))
            task_runs = client.read_task_runs(  # a long run has more than a page of them
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
                task_run_filter=TaskRunFilter(state=unfinished),
            )
            for task_run in task_runs:
                if task_run.state is not None and not task_run.state.is_final():
                    message = f"its process is gone: {why}"
                    client.set_task_run_state(task_run.id, Crashed(message=message), force=True)
                    marked.append(f"task run {task_run.name} marked Crashed ({why})")
            if flow_run.state is not None and not flow_run.state.is_final():
                client.set_flow_run_state(flow_run.id, Crashed(message=why), force=True)
                marked.append(f"flow run {flow_run.name} ({flow_run.id}) marked Crashed ({why})")
    except Exception as err:  # noqa: BLE001 - see the docstring
        marked.append(f"could not mark flow run {flow_run_id} Crashed: {err}")
    return marked


def break_dead_lease(run: RunRef) -> str:
    """Free the run's lease if its holder is provably gone: a flow run in a final state (or
    one Prefect no longer knows). ``LeaseHeldError`` while the holder may still be alive."""
    storage = open_storage(run)
    record = read_lease(storage)
    if record is None:
        return f"run {run.run_id} holds no lease"
    holder = record.get("flow_run_id")
    if holder is None:
        raise LeaseHeldError(
            f"run {run.run_id} is leased by {record.get('owner')!r}, not a Prefect flow run: "
            "nothing proves it is gone; stop that process or wait for the lease to expire"
        )
    state = _flow_run_state(holder)
    if state is not None and not state.is_final():
        raise LeaseHeldError(
            f"run {run.run_id} is leased by flow run {holder}, which is {state.name}: cancel "
            f"it first (prefect flow-run cancel {holder}) or wait for the lease to expire"
        )
    if not break_lease(storage, record):
        return f"run {run.run_id}: the lease changed meanwhile (renewed or taken); left alone"
    marks = mark_crashed(holder, f"its lease on run {run.run_id} was broken by an operator")
    shown = "; ".join(marks) if marks else "nothing left running"
    return f"run {run.run_id}: lease of flow run {holder} broken; {shown}"


def _flow_run_state(flow_run_id: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_flow_run(UUID(flow_run_id)).state
        except ObjectNotFound:
            return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m flows.lease", description="Break the lease of a run whose holder is gone."
    )
    parser.add_argument("--break", dest="break_it", action="store_true", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--storage-root", default="results")
    args = parser.parse_args()
    try:
        print(break_dead_lease(RunRef(args.storage_root, args.run_id)))
    except LeaseHeldError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
