"""A stage where ``cluster.placement`` puts it: task runs of its pool's stage workers (its
shards first where it fans out, one task run per node where it trains across machines), or
task runs in this process (the training stage of several ranks: a warm rank group of this
machine's ranks, ``flows.placed_nodes``). The dispatch sits above both kinds of placed job
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
from nemo_rl_core.distributed.virtual_cluster import runs_across_ranks
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.pipeline.runtime import runtime_for
from nemo_rl_core.pipeline.spec import shard_part, split_round
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.stage import run_stage_tasks, stage_inputs, stage_logger


def run_placed_stage(
    config: Any, run: RunRef, iteration: int, name: str, upstream: dict[str, StageRef]
) -> StageRef:
    """Stage ``name`` where ``cluster.placement`` puts it: task runs of its pool's stage
    workers (its shards first, where it fans out), or task runs in this process."""
    pool = placed_pool(config, name)
    runtime = runtime_for(run)
    storage = open_storage(run)
    spec = runtime.pipeline.stage(name)
    if pool is None:
        if runs_across_ranks(config, spec.commits):
            return run_local_ranks(config, run, iteration, name, upstream)
        return run_stage_tasks(config, run, iteration, name, upstream)
    tasks = pool_tasks(pool)
    given = {"run": run, "iteration": iteration, "name": name, "storage_block": flow_run_block()}
    count = config.orchestration.fan_out.get(split_round(name)[0], 1)
    if count > 1:
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
                tasks.shard,
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
    if runs_across_ranks(config, spec.commits):
        return run_placed_nodes(config, run, iteration, name, pool, upstream, inputs)
    merged = PlacedTask(
        tasks.stage,
        {**given, "upstream": upstream},
        heartbeat_name(name),
        label,
        partial(stored_stage, storage, iteration, name, inputs),
    )
    [ref] = run_job(config, run, iteration, pool, [merged])
    return ref


def run_local_ranks(
    config: Any, run: RunRef, iteration: int, name: str, upstream: dict[str, StageRef]
) -> StageRef:
    """The training stage on this machine's ``cluster.gpus_per_node`` ranks: ordered from
    the flow run's warm rank group, started by this process once for the flow run; skipped
    where the manifest holds it complete for the same inputs."""
    runtime = runtime_for(run)
    inputs = stage_inputs(runtime, runtime.pipeline.stage(name), iteration, upstream)
    if (entry := open_storage(run).completed_stage(iteration, name, inputs)) is not None:
        stage_logger().info(
            "run %s iteration %d stage %s: complete with these inputs, skipped",
            run.run_id,
            iteration,
            name,
        )
        return StageRef(entry.outputs)
    return run_placed_nodes(config, run, iteration, name, None, upstream, inputs)
