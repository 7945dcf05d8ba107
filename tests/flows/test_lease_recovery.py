"""After a crash: the run that takes over an expired lease marks the dead flow run and its
task run Crashed, and an operator can break a lease whose holder's flow run has ended."""

import time
from pathlib import Path

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.states import Failed, Running

from flows.lease import break_dead_lease, hold_lease
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.lease import LeaseHeldError, read_lease


@flow
def killed_flow() -> None:
    """Stands for a flow run whose process was SIGKILLed mid-stage."""


@task
def killed_task() -> None:
    """Stands for the stage that was running when it died."""


def dead_flow_run(flow_state=None) -> tuple[str, str]:
    """A flow run and its task run left ``Running`` in Prefect, as a SIGKILL leaves them."""
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(killed_flow, state=flow_state or Running())
        task_run = client.create_task_run(
            killed_task, flow_run_id=flow_run.id, dynamic_key="0", state=Running()
        )
    return str(flow_run.id), str(task_run.id)


def states(flow_run_id: str, task_run_id: str) -> tuple[str, str]:
    with get_client(sync_client=True) as client:
        return (
            client.read_flow_run(flow_run_id).state.type.value,
            client.read_task_run(task_run_id).state.type.value,
        )


def test_taking_over_an_expired_lease_marks_the_dead_run_crashed(tmp_path: Path) -> None:
    run = RunRef(str(tmp_path), "crashed")
    flow_run_id, task_run_id = dead_flow_run()
    open_storage(run).acquire_lease("killed worker", ttl_s=0.05, flow_run_id=flow_run_id)
    time.sleep(0.1)

    @flow
    def next_night() -> None:
        with hold_lease(run, owner="next night"):
            pass

    next_night()
    assert states(flow_run_id, task_run_id) == ("CRASHED", "CRASHED")


def test_a_lease_is_broken_only_once_its_holder_has_ended(tmp_path: Path) -> None:
    run = RunRef(str(tmp_path), "stuck")
    alive, _ = dead_flow_run()
    open_storage(run).acquire_lease("live worker", ttl_s=3600, flow_run_id=alive)
    with pytest.raises(LeaseHeldError, match="which is Running: cancel it first"):
        break_dead_lease(run)
    assert read_lease(open_storage(run)) is not None

    run = RunRef(str(tmp_path), "ended")
    ended, its_task = dead_flow_run(Failed(message="worker lost"))
    open_storage(run).acquire_lease("dead worker", ttl_s=3600, flow_run_id=ended)
    message = break_dead_lease(run)
    assert "broken" in message and read_lease(open_storage(run)) is None
    assert states(ended, its_task) == ("FAILED", "CRASHED")
    open_storage(run).acquire_lease("operator's rerun", ttl_s=60)  # free at once


def test_a_lease_without_a_flow_run_is_not_broken(tmp_path: Path) -> None:
    run = RunRef(str(tmp_path), "cli")
    open_storage(run).acquire_lease("host pid 1", ttl_s=3600)
    with pytest.raises(LeaseHeldError, match="not a Prefect flow run"):
        break_dead_lease(run)
