"""Deadlines: ``checkpointing.checkpoint_must_save_by`` stops a flow run after the iteration
whose checkpoint is committed near the limit, and the next flow run continues; a stage past
``orchestration.stage_timeout_seconds`` fails the flow run (not retried), and the parameters
the flow run resolved continue the run at that stage. What the flow run shows in Prefect:
its name and tags name the run, each task run its stage and iteration, untagged."""

import time
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterTags
from prefect.client.schemas.sorting import FlowRunSort
from toy_runs import ToyRuns, toy_flow

from flows.labels import flow_run_name
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.faults import FAULT_ENV


def test_a_run_stops_at_the_deadline_and_continues(toy: ToyRuns) -> None:
    summary = toy.run("deadline", "checkpointing.checkpoint_must_save_by=00:00:00:00")
    assert summary["iterations"] == [0]
    assert open_storage(RunRef(str(toy.root), "deadline")).latest_checkpoint() == 1
    assert toy.run("deadline")["iterations"] == [1, 2]


def test_a_flow_run_name_carries_the_run_id_once() -> None:
    assert flow_run_name("grpo", "exp1") == "grpo-exp1"
    assert flow_run_name("grpo", "grpo-20261125-201356-1a2b3c") == "grpo-20261125-201356-1a2b3c"


def recorded_task_runs(client: Any, flow_run_id: Any, last: set[str]) -> list:
    """The flow run's task runs once the API server has recorded the ``last`` ones: it
    writes task-run events in batches, once a second (``prefect.toml``)."""
    deadline = time.monotonic() + 30
    while True:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
        if last <= {task_run.name for task_run in task_runs} or time.monotonic() > deadline:
            return task_runs
        time.sleep(0.2)


def test_a_timed_out_stage_fails_the_run_and_its_parameters_continue_it(
    toy: ToyRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The update stage hangs in its work; a timeout far shorter than Prefect's own task-run
    # setup could fire inside Prefect's engine instead of in the stage.
    monkeypatch.setenv(FAULT_ENV, "update@0:stall")
    timeout = "++orchestration.stage_timeout_seconds.update=2"
    with pytest.raises(TimeoutError):
        toy.run(None, "toy.max_num_steps=1", timeout)
    monkeypatch.delenv(FAULT_ENV)
    (run_dir,) = (toy.root / "runs").iterdir()
    run_id = run_dir.name
    before = toy.finished_at(run_id, 0)
    assert sorted(before) == ["answer", "prompts", "score"]

    with get_client(sync_client=True) as client:
        tagged = FlowRunFilter(tags=FlowRunFilterTags(all_=[f"run:{run_id}"]))
        (failed,) = client.read_flow_runs(flow_run_filter=tagged)
        assert failed.state.is_failed()
        assert failed.name == run_id  # a generated id starts with "toy-"
        assert {"algorithm:toy", f"run:{run_id}"} <= set(failed.tags)
        # What a retry of the flow run would pass: the run id it got, not null.
        assert failed.parameters["run_id"] == run_id
        assert failed.parameters["storage_root"] == str(toy.root)

        toy_flow(**{**failed.parameters, "overrides": toy.overrides("toy.max_num_steps=1")})
        runs = client.read_flow_runs(flow_run_filter=tagged, sort=FlowRunSort.START_TIME_ASC)
        assert [r.state.type.value for r in runs] == ["FAILED", "COMPLETED"]
        task_runs = recorded_task_runs(client, runs[1].id, {"checkpoint-it0"})
    after = toy.finished_at(run_id, 0)
    # The stages before the timed-out one were kept: their config digest leaves out
    # orchestration:, which the continuing run no longer sets.
    assert {stage: after[stage] for stage in before} == before
    assert toy.stages(run_id, 0)["update"]["status"] == "complete"
    names = {task_run.name for task_run in task_runs}
    assert {"answer-it0", "update-it0", "checkpoint-it0"} <= names, names
    assert all(task_run.tags == [] for task_run in task_runs)
