"""A continued run whose stored progress vanished is refused, not silently restarted.

A run used to start again at iteration 0 without a word when its iterations were gone (a
wiped store, deleted folders). Before a flow run plans its iterations, what the run's
storage holds is held against what records it should hold, and what survives decides:

- checkpoints gone, manifests there (or only older checkpoints): the manifests record a
  newer committed step than the newest checkpoint there: refused, naming both. The
  weights to continue from are gone; training on from an older step would leave the
  later manifests describing weights nobody has.
- manifests gone, checkpoints there: the newest committed checkpoint holds the weights,
  the optimizer and the dataloader's position, all that continuing needs: the run goes on
  from it, with a warning naming the iterations whose records (metrics, rollouts) are gone.
- nothing stored but ``config.yaml``, or nothing at all: the storage cannot say, so the
  run's earlier flow runs are asked (Prefect keeps them, tagged ``run:<run_id>`` with the
  storage root among their parameters): one that completed stages means the run had
  progress here, which is gone: refused, naming that flow run. None (a run killed while
  its models loaded, or a new run): it starts at iteration 0, saying so if a config was
  stored.

A refused run is started over deliberately with a new run id, or with ``start_over``
(``--start-over``), which deletes what is stored of the run and trains from iteration 0;
earlier flow runs than the newest that started over are not asked again.
"""

from dataclasses import dataclass
from functools import partial
from typing import Any

from flows.labels import run_tag
from flows.lease import current_flow_run
from flows.listing import PAGE, every_entry
from nemo_rl_core.pipeline.spec import Pipeline
from nemo_rl_core.storage.handles import RunRef
from nemo_rl_core.storage.progress import StoredProgress
from nemo_rl_core.storage.refusal import RunRefusedError
from nemo_rl_core.storage.run_storage import RunStorage

START_OVER = "start_over"  # the training flows' parameter (``--start-over``)


class LostProgressError(RunRefusedError):
    """The run's records say it had progress that its storage no longer holds."""


@dataclass(frozen=True)
class EarlierFlowRun:
    """A flow run that drove the run on this storage root before, and what it completed."""

    name: str
    flow_run_id: str
    state: str
    started: str
    stages_completed: int
    last_stage: str | None


def check_progress_survives(pipeline: Pipeline, run: RunRef, storage: RunStorage) -> list[str]:
    """``LostProgressError`` if the run's stored progress was lost; else the warnings to log
    (records lost that continuing does not need, or a config stored with nothing else)."""
    committing = pipeline.committing_stage
    if committing is None:  # nothing carries from one iteration to the next
        return []
    found = storage.stored_progress(committing.name)
    if found.lost_steps:
        raise LostProgressError(_lost_checkpoints(run, storage, found))
    if found.empty:
        earlier = earlier_flow_run(run)
        if earlier is not None:
            raise LostProgressError(_lost_everything(run, storage, found, earlier))
        if found.has_config:
            return [
                f"run {run.run_id}: {storage.run_url} holds config.yaml but no iteration and "
                "no checkpoint, and no earlier flow run of it completed a stage: starting at "
                "iteration 0"
            ]
        return []
    missing = found.missing_iterations()
    if missing:
        return [
            f"run {run.run_id}: iteration(s) {_ranges(missing)} have no stored records "
            f"(manifest, batches, rollouts: their metrics are gone); continuing from committed "
            f"checkpoint step {found.newest_checkpoint}, which holds the weights, the optimizer "
            "and the dataloader's position"
        ]
    return []


def earlier_flow_run(run: RunRef) -> EarlierFlowRun | None:
    """The newest earlier flow run of ``run`` on its storage root that completed stages
    (since the newest one that started over), or None."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    this = current_flow_run()
    with get_client(sync_client=True) as client:
        flow_runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[run_tag(run.run_id)])),
            sort=FlowRunSort.START_TIME_DESC,
        )
        for flow_run in flow_runs:
            if (
                str(flow_run.id) == this
                or flow_run.parameters.get("storage_root") != run.storage_root
            ):
                continue
            completed = every_entry(partial(_completed_page, client, flow_run.id))
            if completed:
                return EarlierFlowRun(
                    name=flow_run.name,
                    flow_run_id=str(flow_run.id),
                    state=flow_run.state.type.value if flow_run.state is not None else "unknown",
                    started=_when(flow_run.start_time),
                    stages_completed=len(completed),
                    last_stage=completed[0].name,
                )
            if flow_run.parameters.get(START_OVER):
                return None  # what ran before it was discarded on purpose
    return None


def _completed_page(client: Any, flow_run_id: Any, offset: int) -> list[Any]:
    """One page of the flow run's completed task runs, newest first."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import TaskRunSort

    completed = TaskRunFilterStateType(any_=[StateType.COMPLETED])
    return client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
        task_run_filter=TaskRunFilter(state=TaskRunFilterState(type=completed, name=None)),
        sort=TaskRunSort.EXPECTED_START_TIME_DESC,
        limit=PAGE,
        offset=offset,
    )


def _lost_checkpoints(run: RunRef, storage: RunStorage, found: StoredProgress) -> str:
    there = (
        f"the newest committed checkpoint there is step {found.newest_checkpoint}"
        if found.committed
        else "no committed checkpoint is there"
    )
    return (
        f"run {run.run_id}: its manifests record checkpoint step {found.recorded_step} "
        f"committed ({found.recorded_in}: its committing stage is complete), but {there} "
        f"({storage.run_url}/checkpoints): the weights to continue from are gone. "
        f"{_how_to_start_over(run)}"
    )


def _lost_everything(
    run: RunRef, storage: RunStorage, found: StoredProgress, earlier: EarlierFlowRun
) -> str:
    held = "only config.yaml" if found.has_config else "nothing"
    last = f", the last {earlier.last_stage}" if earlier.last_stage else ""
    return (
        f"run {run.run_id}: {storage.run_url} holds {held} (no iteration, no checkpoint), but "
        f"Prefect records flow run {earlier.name} ({earlier.flow_run_id}, {earlier.state}, "
        f"started {earlier.started}) driving this run on {run.storage_root} and completing "
        f"{earlier.stages_completed} stage task run(s){last}: its stored progress is gone "
        f"(a wiped store, deleted folders). {_how_to_start_over(run)}"
    )


def _how_to_start_over(run: RunRef) -> str:
    return (
        "Nothing of the run was changed. To start over deliberately, use a new run id, or pass "
        f"--start-over (flow parameter {START_OVER}=true), which deletes what is stored of run "
        f"{run.run_id} and trains from iteration 0"
    )


def _ranges(numbers: list[int]) -> str:
    """``0-2, 5`` for [0, 1, 2, 5]."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _when(moment: Any) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else "at an unknown time"
