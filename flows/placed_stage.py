"""A stage where ``cluster.placement`` puts it: task runs of its pool's stage workers (its
shards first where it fans out, one task run per node where it trains across machines), or
task runs in this process (the training stage of several ranks, and a stage whose model is
sharded over them: orders to the warm rank group of this machine's ranks,
``flows.placed_nodes``). The dispatch sits above both kinds of placed job
(``flows.placement``, ``flows.placed_nodes``), which it chooses between."""

from functools import partial
from typing import Any

from flows.placed_nodes import run_placed_nodes
from flows.placement import (
    PlacedTask,
    flow_run_block,
    placed_pool,
    run_job,
    skipped,
    stored_part,
    stored_stage,
)
from flows.pool_tasks import heartbeat_name, pool_tasks
from nemo_rl_core.config.cluster import TRAIN_STAGE
from nemo_rl_core.distributed.virtual_cluster import runs_across_ranks
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.pipeline.runtime import runtime_for
from nemo_rl_core.pipeline.spec import shard_part, split_round
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.stage import run_stage_tasks, stage_inputs


def run_placed_stage(
    config: Any, run: RunRef, iteration: int, name: str, upstream: dict[str, StageRef]
) -> StageRef:
    """Stage ``name`` where ``cluster.placement`` puts it: task runs of its pool's stage
    workers (its shards first, where it fans out), the training stage on this machine's
    ranks (a warm rank group this process starts once for the flow run), or task runs in
    this process. A placed stage (or one on ranks) is skipped where the manifest holds it
    complete for the same inputs."""
    runtime = runtime_for(run)
    spec = runtime.pipeline.stage(name)
    across_ranks = runs_across_ranks(config, spec.spans_ranks(config))
    # a stage on the training ranks runs on the training stage's rank group: on its pool
    pool = placed_pool(config, TRAIN_STAGE if across_ranks else name)
    if pool is None and not across_ranks:
        return run_stage_tasks(config, run, iteration, name, upstream)
    storage = open_storage(run)
    given = {"run": run, "iteration": iteration, "name": name, "storage_block": flow_run_block()}
    count = config.orchestration.fan_out.get(split_round(name)[0], 1)
    if pool is not None and count > 1:  # (a stage across ranks never fans out)
        inputs = stage_inputs(runtime, spec, iteration, upstream)
        shards: dict[str, StageRef] = {}
        missing: dict[str, PlacedTask[StageRef]] = {}
        for index in range(count):
            part = shard_part(index, count)
            label = f"shard {index} of {count} of stage {name!r} of iteration {iteration}"
            if (entry := storage.completed_part(iteration, name, part, inputs)) is not None:
                skipped(run, label, pool)
                shards[part] = StageRef(entry.outputs)
                continue
            missing[part] = PlacedTask(
                pool_tasks(pool).shard,
                {**given, "index": index, "count": count, "upstream": upstream},
                heartbeat_name(name, index, count),
                label,
                partial(stored_part, storage, iteration, name, part, inputs),
            )
        refs = run_job(config, run, iteration, pool, list(missing.values()))
        upstream = {**upstream, **shards, **dict(zip(missing, refs, strict=True))}
    inputs = stage_inputs(runtime, spec, iteration, upstream)
    label = f"stage {name!r} of iteration {iteration}"
    if (entry := storage.completed_stage(iteration, name, inputs)) is not None:
        skipped(run, label, pool)
        return StageRef(entry.outputs)
    if across_ranks:
        return run_placed_nodes(config, run, iteration, name, pool, upstream, inputs)
    assert pool is not None, "a one-process stage comes this far only placed on a pool"
    merged = PlacedTask(
        pool_tasks(pool).stage,
        {**given, "upstream": upstream},
        heartbeat_name(name),
        label,
        partial(stored_stage, storage, iteration, name, inputs),
    )
    [ref] = run_job(config, run, iteration, pool, [merged])
    return ref
