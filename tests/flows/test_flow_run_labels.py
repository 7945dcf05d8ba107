"""What a training flow run shows in Prefect: its name and tags name the run, each task
run's name its stage and iteration (untagged: a tag costs each stage a round trip); a stage past ``orchestration.stage_timeout_seconds``
fails the flow run, and the parameters it resolved continue the run at that stage."""

import json
import time
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterTags,
)
from prefect.client.schemas.sorting import FlowRunSort

from flows.grpo import grpo
from flows.labels import flow_run_name
from tasks.faults import FAULT_ENV

pytestmark = pytest.mark.e2e
FAST = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_math_tiny_fast.yaml"
ONE_STEP = ["grpo.max_num_steps=1"]


def stages_of(root: Path, run_id: str) -> dict:
    path = root / "runs" / run_id / "iter_000000" / "MANIFEST.json"
    return json.loads(path.read_text())["stages"]


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


def test_flow_run_name_carries_the_run_id_once() -> None:
    assert flow_run_name("grpo", "exp1") == "grpo-exp1"
    assert flow_run_name("grpo", "grpo-20261125-201356-1a2b3c") == "grpo-20261125-201356-1a2b3c"


def test_timed_out_stage_fails_the_run_and_its_parameters_continue_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The train stage hangs in its work; a timeout far shorter than Prefect's own task-run
    # setup could fire inside Prefect's engine instead of in the stage.
    monkeypatch.setenv(FAULT_ENV, "train@0:stall")
    timeout = "++orchestration.stage_timeout_seconds.train=2"
    with pytest.raises(TimeoutError):
        grpo(config_path=str(FAST), overrides=[*ONE_STEP, timeout], storage_root=str(tmp_path))
    monkeypatch.delenv(FAULT_ENV)
    (run_dir,) = (tmp_path / "runs").iterdir()
    run_id = run_dir.name
    before = stages_of(tmp_path, run_id)
    assert sorted(before) == ["advantage", "generate", "logprob", "prompts", "reward"]

    with get_client(sync_client=True) as client:
        tagged = FlowRunFilter(tags=FlowRunFilterTags(all_=[f"run:{run_id}"]))
        (failed,) = client.read_flow_runs(flow_run_filter=tagged)
        assert failed.state.is_failed()
        assert failed.name == run_id  # a generated id starts with "grpo-"
        assert {"algorithm:grpo", f"run:{run_id}"} <= set(failed.tags)
        # What a retry of the flow run would pass: the run id it got, not null.
        assert failed.parameters["run_id"] == run_id
        assert failed.parameters["storage_root"] == str(tmp_path)

        grpo(**{**failed.parameters, "overrides": ONE_STEP})
        runs = client.read_flow_runs(flow_run_filter=tagged, sort=FlowRunSort.START_TIME_ASC)
        assert [r.state.type.value for r in runs] == ["FAILED", "COMPLETED"]
        task_runs = recorded_task_runs(client, runs[1].id, {"checkpoint-it0"})
    after = stages_of(tmp_path, run_id)
    # The stages before the timed-out one were kept: their config digest leaves out
    # orchestration:, which the continuing run no longer sets.
    for stage, entry in before.items():
        assert after[stage]["finished_at"] == entry["finished_at"], stage
    assert after["train"]["status"] == "complete"
    names = {task_run.name for task_run in task_runs}
    assert {"generate-it0", "train-it0", "checkpoint-it0"} <= names, names
    for task_run in task_runs:
        assert task_run.tags == [], task_run.name
