"""The one Prefect task every stage runs as, and the manifest rule that runs it at most once
per inputs.

``stage`` looks the stage up in its algorithm's declaration, derives the inputs that decide
whether a stored result still holds (the config, the outputs it reads, the weights and
dataloader versions it depends on) and goes through ``run_stage``: if the manifest already
holds a complete entry for the same inputs, its stored outputs are returned and nothing is
recomputed (a failed flow run, run again with the same run_id, continues at the failed
stage); otherwise the stage computes, writes each output atomically and records it.

The training stage of a world above one rank runs SPMD instead, on ranks that stay up for
the flow run (``flows.rank_group``, ordered by ``flows.placed_nodes``); rank 0 commits the
stage as ``run_stage`` does (``tasks.spmd_rank.run_rank_stage``, on every rank).
"""

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

import torch
from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import MissingContextError
from prefect.futures import wait
from prefect.task_engine import TaskRunTimeoutError

from nemo_rl_core.distributed.world import is_distributed
from nemo_rl_core.pipeline.context import BATCH, StageContext, StageRef, StageResult
from nemo_rl_core.pipeline.runtime import RunRuntime, runtime_for
from nemo_rl_core.pipeline.spec import SHARD_PREFIX, Stage, shard_part, split_round
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.manifest import RanOn
from nemo_rl_core.storage.outage import StorageUnreachableError
from nemo_rl_core.storage.run_storage import IntegrityError, StorageError
from tasks.faults import StageFaults

T = TypeVar("T")
P = ParamSpec("P")


def stage_logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("nemo_rl_core.stage")


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry storage/worker outages, never deterministic errors.

    A stage past its ``orchestration.stage_timeout_seconds`` is not retried: it would most
    likely take as long again; it fails, and the run continues there when run again."""
    exc = state.data
    if isinstance(exc, IntegrityError | StorageUnreachableError | TaskRunTimeoutError):
        return False  # corrupt data, an outage that spent the whole budget, a stage too slow
    return isinstance(exc, StorageError | ConnectionError | TimeoutError)


STAGE_TASK_OPTIONS: dict[str, Any] = {
    "retries": 2,
    "retry_delay_seconds": [2, 10],
    "retry_condition_fn": is_transient,
    "cache_policy": NO_CACHE,
    "persist_result": False,
}
"""The Prefect task options every stage shares.

Retries only for transient storage or worker outages. No Prefect cache and no result
persistence: the run's manifest already decides what is done (``run_stage``), and
Prefect's default cache policy hashes every call's inputs and the task's source and
looks for a stored result, ~8 ms per task run for nothing (bench/RESULTS.md, issue 8).
"""


STAGE_POOL_ENV = "NEMO_RL_STAGE_POOL"
STAGE_WORKER_ENV = "NEMO_RL_STAGE_WORKER"
"""Set by a stage worker (``flows.stage_worker``) in its own process: the pool it serves and
its name, which the stages it runs record."""


def where_this_runs() -> RanOn:
    """The pool, worker, host, process, flow run and task run executing this code (the
    manifest records them with each stage), and the number of ranks of a stage run across
    processes: a stage worker's pool and name, else the work pool and worker of the flow run
    (None outside a worker's flow run). A placed stage's task run belongs to the iteration
    flow run that submitted it."""
    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    task_context = TaskRunContext.get()
    work_pool = flow_run.work_pool_name if flow_run is not None else None
    return RanOn(
        pool=os.environ.get(STAGE_POOL_ENV, work_pool),
        worker=os.environ.get(STAGE_WORKER_ENV, os.environ.get("PREFECT__WORKER_NAME")),
        host=socket.gethostname(),
        flow_run=str(flow_run.id) if flow_run is not None else None,
        # rank 0 of a stage run across processes (tasks.spmd_rank.run_rank_stage)
        ranks=torch.distributed.get_world_size() if is_distributed() else None,
        pid=os.getpid(),
        task_run=str(task_context.task_run.id) if task_context is not None else None,
    )


def run_stage(
    run: RunRef,
    iteration: int,
    stage: str,
    inputs: dict[str, str],
    compute: Callable[[], StageResult],
    part: str | None = None,
) -> StageRef:
    """The stage's stored outputs, computing them only if the manifest lacks them.

    ``inputs`` maps input names to content digests (checksums of upstream outputs, the
    config digest, the weights version); ``compute`` makes the outputs and metrics. A
    ``part`` of a split stage (a shard) is recorded in an entry of its own, not the manifest.
    """
    storage = open_storage(run)
    log = stage_logger()
    label = stage if part is None else f"{stage}/{part}"
    if part is None:
        entry = storage.completed_stage(iteration, stage, inputs)
    else:
        entry = storage.completed_part(iteration, stage, part, inputs)
    if entry is not None:
        log.info(
            "run %s iteration %d stage %s: complete with these inputs, skipped",
            run.run_id,
            iteration,
            label,
        )
        return StageRef(entry.outputs)
    faults = StageFaults.asked(label, iteration)
    # One log line per stage, at its commit: every line is a row the API server writes, and
    # the task run's own state already says that the stage is running.
    started = time.perf_counter()
    faults.before_compute()
    result = compute()
    metrics = {**result.metrics, "seconds": time.perf_counter() - started}
    faults.after_compute()
    prefix = "" if part is None else f"{part}."
    refs = storage.write_outputs(iteration, stage, result.outputs, prefix)
    ran_on = where_this_runs()
    if part is None:
        storage.record_stage(iteration, stage, inputs, refs, metrics, ran_on)
    else:
        storage.record_part(iteration, stage, part, inputs, refs, metrics, ran_on)
    log.info(
        "run %s iteration %d stage %s: committed %s (%.2f s of compute)",
        run.run_id,
        iteration,
        label,
        sorted(refs),
        metrics["seconds"],
    )
    if damaged := faults.after_commit(storage, refs):
        log.warning("fault injected: damaged %s", damaged)
    return StageRef(refs)


def stage_inputs(
    runtime: RunRuntime, spec: Stage, iteration: int, upstream: Mapping[str, StageRef]
) -> dict[str, str]:
    """What decides a stage's output: the config, every output it reads, and the versions
    (weights, dataloader position) it depends on. A stage that reads older weights than its
    iteration's (async GRPO's generate) records their step too: the manifest says which
    checkpoint made the batch, and a resume or rerun reads that one, not the newest."""
    inputs = {"config": runtime.config_digest}
    for name, ref in sorted(upstream.items()):
        for output, digest in ref.digests().items():
            inputs[f"{name}.{output}"] = digest
    step = runtime.pipeline.weights_step(runtime.config, spec.name, iteration)
    for kind in spec.versions:
        inputs[f"{kind}_version"] = runtime.version(kind, step if kind == "policy" else iteration)
    if runtime.pipeline.lags(runtime.config, spec.name):
        inputs["policy_step"] = str(step)
    return inputs


@task(name="stage", task_run_name="{name}-it{iteration}", **STAGE_TASK_OPTIONS)
def stage(run: RunRef, iteration: int, name: str, upstream: dict[str, StageRef]) -> StageRef:
    """Stage ``name`` of ``iteration`` as its algorithm declares it (``name`` may carry a
    refill round: ``reward.2``), from ``upstream``'s outputs (the stages it reads, and the
    shards of a split stage, which it merges)."""
    runtime = runtime_for(run)
    spec = runtime.pipeline.stage(name)
    inputs = stage_inputs(runtime, spec, iteration, upstream)
    context = StageContext(runtime, iteration, upstream, name)
    count = len(shards_in(upstream))
    shards = [shard_part(i, count) for i in range(count)]  # in sample order
    if spec.fan_out is not None and shards:
        merge = spec.fan_out.merge
        return run_stage(
            run, iteration, name, inputs, lambda: merge(context, [context.batch(s) for s in shards])
        )
    return run_stage(run, iteration, name, inputs, lambda: spec.compute(context))


@task(name="stage-shard", task_run_name="{name}-shard{index}-it{iteration}", **STAGE_TASK_OPTIONS)
def stage_shard(
    run: RunRef, iteration: int, name: str, index: int, count: int, upstream: dict[str, StageRef]
) -> StageRef:
    """Shard ``index`` of ``count`` of split stage ``name``: its slice's ``batch``, recorded
    beside the stage's outputs (``iter_<n>/<stage>/shard-<i>-of-<n>.entry.json``)."""
    runtime = runtime_for(run)
    spec = runtime.pipeline.stage(name)
    if spec.fan_out is None:
        raise ValueError(f"stage {name!r} does not split into shards")
    shard = spec.fan_out.shard
    inputs = stage_inputs(runtime, spec, iteration, upstream)
    context = StageContext(runtime, iteration, upstream, name)
    return run_stage(
        run,
        iteration,
        name,
        inputs,
        lambda: StageResult({BATCH: shard(context, index, count)}),
        part=shard_part(index, count),
    )


def shards_in(upstream: Mapping[str, StageRef]) -> list[str]:
    return [name for name in upstream if name.startswith(SHARD_PREFIX)]


def stage_task_for(config: Any, name: str, task: "Task[P, T]") -> "Task[P, T]":
    """``task`` (a stage, or a shard of one) with the stage's
    ``orchestration.stage_timeout_seconds`` (``name`` may carry a refill round: ``reward.2``
    has ``reward``'s timeout), or without a timeout."""
    seconds = config.orchestration.stage_timeout_seconds.get(split_round(name)[0])
    return task if seconds is None else task.with_options(timeout_seconds=seconds)


def run_stage_tasks(
    config: Any, run: RunRef, iteration: int, name: str, upstream: dict[str, StageRef]
) -> StageRef:
    """Stage ``name`` as task runs: where ``orchestration.fan_out`` splits it, its shards
    first, concurrently (all of them finish, or fail, before the merge; a run continued
    after a failed shard computes that shard alone), then the stage that merges them. (The
    training stage of a world above one rank runs on ranks: ``flows.placed_stage``.)"""
    count = config.orchestration.fan_out.get(split_round(name)[0], 1)
    if count > 1:
        shard_task = stage_task_for(config, name, stage_shard)
        futures = [
            shard_task.submit(run, iteration, name, i, count, upstream) for i in range(count)
        ]
        wait(futures)
        upstream = {**upstream, **{shard_part(i, count): f.result() for i, f in enumerate(futures)}}
    return stage_task_for(config, name, stage)(run, iteration, name, upstream)
