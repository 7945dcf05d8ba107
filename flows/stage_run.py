"""The flow ``stage``: one stage of one iteration of a stored run, as a flow run of its own.

It is deployed once per work pool (``prefect.yaml``: ``stage/rollout-pool``,
``stage/train-pool``); the iteration flow starts it where ``cluster.placement`` puts a stage
and waits for it (``flows.placement``). It reads its inputs from the run's storage and
commits its outputs and manifest entry there, exactly as the stage's task in the iteration
flow would (a complete entry for the same inputs is skipped), and beats a heartbeat on
storage while it runs, so the waiter learns when a lost worker took it along.
"""

from typing import Any

from prefect import flow

from flows.labels import labelled_run
from flows.placement import stage_heartbeat
from flows.run_setup import load_storage_block
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.pipeline.runtime import close_runtime, runtime_for
from nemo_rl_core.storage.handles import RunRef
from tasks.stage import run_stage_tasks


@flow(name="stage", log_prints=True)
def stage_flow(
    run_id: str,
    storage_root: str,
    iteration: int,
    name: str,
    upstream: dict[str, dict[str, dict[str, Any]]],
    storage_block: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Run stage ``name`` of ``iteration`` of run ``run_id`` from ``upstream``'s stored
    outputs (as the iteration flow passes them); returns the stage's stored outputs."""
    run = RunRef(storage_root, run_id)
    load_storage_block(storage_root, storage_block)
    with stage_heartbeat(run, iteration, name):
        runtime = runtime_for(run)
        refs = {stage: StageRef.from_dict(outputs) for stage, outputs in upstream.items()}
        with labelled_run(runtime.pipeline.name, run, name=f"{name}-it{iteration}-{run_id}"):
            try:
                return run_stage_tasks(runtime.config, run, iteration, name, refs).to_dict()
            finally:
                close_runtime(run)
