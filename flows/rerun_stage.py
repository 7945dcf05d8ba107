"""Rerun exactly one stage of one iteration from its stored inputs.

The stage and every stage that reads it (directly or through others, as the run's
algorithm declares) are marked stale first; the stage is recomputed now, the later ones
when the training flow continues the run.
    python -m flows.rerun_stage --run-id RUN --iteration 1 --stage reward --storage-root results
"""

import argparse
import json

from prefect import flow

from flows.labels import labelled_run
from flows.lease import hold_lease
from flows.placed_nodes import close_rank_groups
from flows.placed_stage import run_placed_stage
from flows.placement import check_placement
from flows.run_setup import lease_owner
from flows.storage_block import load_storage_block
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.pipeline.runtime import close_runtime, runtime_for
from nemo_rl_core.pipeline.spec import split_round
from nemo_rl_core.storage.handles import RunRef, open_storage


@flow(name="rerun-stage", log_prints=True)
def rerun_stage(
    run_id: str,
    iteration: int,
    stage: str,
    storage_root: str = "results",
    storage_block: str | None = None,
) -> dict:
    """Recompute ``stage`` of ``iteration`` of run ``run_id``; returns its stored outputs."""
    run = RunRef(storage_root, run_id)
    load_storage_block(storage_root, storage_block)
    storage = open_storage(run)
    pipeline = runtime_for(run).pipeline
    if stage not in pipeline.stage_names:
        raise ValueError(
            f"stage {stage!r} is not one of {list(pipeline.stage_names)} "
            f"({pipeline.name} run {run_id!r})"
        )
    entries = storage.read_manifest(iteration).stages
    refilled = pipeline.refill.stages if pipeline.refill else ()

    def recorded(name: str) -> str | None:
        """A refill repeats stages as ``reward.1``, ``reward.2``: the rest of the iteration
        read the last round; a refill stage, rerun at round 0, reads round 0."""
        rounds = sorted((split_round(r)[1], r) for r in entries if split_round(r)[0] == name)
        if not rounds:
            return None
        return rounds[0][1] if stage in refilled and name in refilled else rounds[-1][1]

    spec = pipeline.stage(stage)
    missing = [name for name in spec.reads if recorded(name) is None]
    if missing:
        raise ValueError(
            f"run {run_id!r} iteration {iteration}: stage {stage!r} needs the outputs of "
            f"{missing}, which were never recorded; continue the run instead"
        )
    upstream = {
        name: StageRef(entries[found].outputs)
        for name in spec.all_reads
        if (found := recorded(name)) is not None
    }
    affected = set(pipeline.downstream_of(stage))
    # Later refill rounds depend on what this round kept, whichever stage of it reran.
    stale = [
        recorded
        for recorded in entries
        if split_round(recorded)[0] in affected
        or (stage in refilled and split_round(recorded)[0] in refilled and split_round(recorded)[1])
    ]
    name = f"rerun-{run_id}-{stage}-it{iteration}"
    with (
        labelled_run(pipeline.name, run, name=name),
        hold_lease(run, owner=f"{lease_owner()} rerun-stage {stage}@{iteration}"),
    ):
        try:
            config = runtime_for(run).config
            check_placement(config, pipeline)
            storage.mark_stale(iteration, [stage, *stale])
            return run_placed_stage(config, run, iteration, stage, upstream).to_dict()
        finally:
            close_rank_groups(run)
            close_runtime(run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m flows.rerun_stage", description=__doc__)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--storage-root", default="results")
    args = parser.parse_args()
    print(json.dumps(rerun_stage(args.run_id, args.iteration, args.stage, args.storage_root)))
