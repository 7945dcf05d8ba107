"""The Prefect tasks a pool's stage workers serve: one stage of one iteration, one shard
of a stage that fans out, or one node of a stage run across processes (its torchrun, whose
ranks stay up for the flow run's iterations: ``flows.rank_group``), run in a long-lived worker process that keeps the run's models
and engine warm.

A task worker takes the runs of the task keys it serves (``Task.task_key``): each pool's tasks
carry a key of their own (``stage@rollout-pool``), so a run placed on ``rollout-pool`` goes to
that pool's workers only. The iteration flow submits with the same tasks
(``Task.apply_async``), so both sides agree on the key.

Warm: the worker keeps the runtime (config, tokenizer, policy, engine) of the run and flow
run that last gave it a task, as the one-process flow keeps it for its flow run: the next
iteration's stage loads only the new weights, in place (a refit). A task of another run, or
of a new flow run of the same run (its config may have changed), closes it and opens anew.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import Any, TypeVar

from prefect import Task, task
from prefect.task_engine import TaskRunTimeoutError
from prefect.utilities.timeout import timeout

from flows.heartbeat import stage_heartbeat
from flows.lease import current_flow_run
from flows.storage_block import load_storage_block
from nemo_rl_core.distributed.node_launch import Rendezvous, RendezvousNotes, launch_node
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.pipeline.runtime import close_runtime, runtime_for
from nemo_rl_core.pipeline.spec import shard_part, split_round
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.stage import STAGE_TASK_OPTIONS, stage, stage_shard

T = TypeVar("T")
CHAIN_JOIN = "+"


def chain_name(names: list[str]) -> str:
    """How a chain of stages run as one task run is named: ``generate+reward``."""
    return CHAIN_JOIN.join(names)


def chain_stages(name: str) -> list[str]:
    return name.split(CHAIN_JOIN)


class StageTimeoutError(RuntimeError):
    """A placed stage ran past its ``orchestration.stage_timeout_seconds`` (not retried, as a
    local stage past it is not)."""


def heartbeat_name(name: str, index: int | None = None, count: int | None = None) -> str:
    """The name a placed task's heartbeat is recorded under: the stage, a chain's stages
    joined by ``_`` (a storage name takes no ``+``), or stage and shard."""
    if index is None or count is None:
        return name.replace(CHAIN_JOIN, "_")
    return f"{name}.{shard_part(index, count)}"


def node_heartbeat_name(name: str, node_rank: int, nnodes: int) -> str:
    """The name a node task's heartbeat is recorded under: ``train.node-0-of-2``."""
    return f"{name}.node-{node_rank}-of-{nnodes}"


_held: list[tuple[RunRef, str | None]] = []  # the run and flow run whose runtime is warm here


def warm_runtime_for(run: RunRef) -> None:
    """Keep this process's runtime of ``run`` warm across the tasks of one flow run; a task
    of another run or flow run closes the held runtime first (one engine per worker)."""
    flow_run = current_flow_run()
    if _held == [(run, flow_run)]:
        return
    for held_run, _ in _held:
        close_runtime(held_run)
    _held[:] = [(run, flow_run)]
    runtime_for(run)


def run_here(
    run: RunRef, iteration: int, beat: str, storage_block: str | None, compute: Callable[[], T]
) -> T:
    """``compute()`` (stages or a shard of ``run``) in this stage worker: with the run's
    storage credentials and warm runtime, beating on storage as ``beat``."""
    load_storage_block(run.storage_root, storage_block)
    with stage_heartbeat(run, iteration, beat):
        warm_runtime_for(run)
        return compute()


def within_stage_timeout(run: RunRef, name: str, compute: Callable[[], T]) -> T:
    """``compute()`` (stage ``name`` or a shard of it) under the stage's
    ``orchestration.stage_timeout_seconds`` (the worker's tasks serve every stage, so the
    limit is applied here, per stage)."""
    stage_name = split_round(name)[0]
    seconds = runtime_for(run).config.orchestration.stage_timeout_seconds.get(stage_name)
    try:
        with timeout(seconds=seconds, timeout_exc_type=TaskRunTimeoutError):
            return compute()
    except TaskRunTimeoutError as err:
        raise StageTimeoutError(
            f"stage {name!r} ran past orchestration.stage_timeout_seconds.{stage_name}={seconds:g}"
        ) from err


def run_stage_here(
    run: RunRef,
    iteration: int,
    name: str,
    upstream: dict[str, StageRef],
    storage_block: str | None = None,
) -> StageRef:
    """Stage ``name`` of ``iteration`` in this stage worker (merging the shards ``upstream``
    holds, if it fanned out)."""
    return run_here(
        run,
        iteration,
        heartbeat_name(name),
        storage_block,
        lambda: within_stage_timeout(run, name, lambda: stage.fn(run, iteration, name, upstream)),
    )


def run_chain_here(
    run: RunRef,
    iteration: int,
    name: str,
    upstream: dict[str, StageRef],
    storage_block: str | None = None,
) -> dict[str, StageRef]:
    """Consecutive stages of ``iteration`` placed on this pool, one after the other in this
    stage worker as one task run (``name``: the stages joined by ``+``, in order), each fed
    the outputs it reads from ``upstream`` and the stages before it; their outputs by
    stage. One task run instead of one per stage spares its submission, pickup and state
    proposals, which cost more than a small stage's compute (bench/RESULTS.md, issue 30)."""

    def run_chain() -> dict[str, StageRef]:
        pipeline = runtime_for(run).pipeline
        done = dict(upstream)
        names = chain_stages(name)
        for stage_name in names:
            reads = {r: done[r] for r in pipeline.stage(stage_name).all_reads if r in done}
            done[stage_name] = within_stage_timeout(
                run,
                stage_name,
                partial(stage.fn, run, iteration, stage_name, reads),
            )
        return {stage_name: done[stage_name] for stage_name in names}

    return run_here(run, iteration, heartbeat_name(name), storage_block, run_chain)


def run_shard_here(
    run: RunRef,
    iteration: int,
    name: str,
    index: int,
    count: int,
    upstream: dict[str, StageRef],
    storage_block: str | None = None,
) -> StageRef:
    """Shard ``index`` of ``count`` of stage ``name`` of ``iteration`` in this stage worker."""
    return run_here(
        run,
        iteration,
        heartbeat_name(name, index, count),
        storage_block,
        lambda: within_stage_timeout(
            run, name, lambda: stage_shard.fn(run, iteration, name, index, count, upstream)
        ),
    )


def rank_group_key(pool: str | None, attempt: str) -> str:
    """The task key rank 0 of one warm rank group (one attempt of a stage across nodes of
    ``pool``, or across this machine's ranks: ``pool`` None) serves, and the iteration flow
    submits its orders with: ``stage-ranks@train-pool/<attempt>``, ``stage-ranks/<attempt>``."""
    return f"stage-ranks@{pool}/{attempt}" if pool is not None else f"stage-ranks/{attempt}"


def rank_group_program(
    run: RunRef, orders: str, idle_s: float, release_devices: bool = False
) -> list[str]:
    """What torchrun starts on every rank of a warm rank group of ``run`` serving the task
    key ``orders`` (``python``'s arguments), stopping after ``idle_s`` without an order,
    naming the flow run that orders it; with ``release_devices`` its ranks move their models
    to host memory after each order (``flows.placed_nodes.between_orders``)."""
    program = [
        "-m",
        "flows.rank_group",
        f"--run-id={run.run_id}",
        f"--storage-root={run.storage_root}",
        f"--orders={orders}",
        f"--idle-s={idle_s}",
    ]
    if release_devices:
        program.append("--release-devices")
    if (flow_run := current_flow_run()) is not None:
        program.append(f"--flow-run={flow_run}")
    return program


def run_node_here(
    run: RunRef,
    iteration: int,
    name: str,
    node_rank: int,
    rendezvous: Rendezvous,
    orders: str,
    idle_s: float,
    storage_block: str | None = None,
) -> None:
    """Node ``node_rank`` of a warm rank group of stage ``name`` (started for ``iteration``):
    this machine's ranks of ``rendezvous``, started here with torchrun, which serve the
    stage's orders (task runs of key ``orders``, one per iteration) until told to stop
    (``flows.rank_group``), until none came for ``idle_s``, or until the iteration flow run
    that ordered it has ended; returns once they ended. No stage timeout here: the group
    outlives one stage, and its rank 0 applies the timeout to each order."""
    program = rank_group_program(run, orders, idle_s)
    beat = node_heartbeat_name(name, node_rank, rendezvous.nnodes)
    notes = RendezvousNotes(open_storage(run), iteration, name, rendezvous.attempt)
    run_here(
        run,
        iteration,
        beat,
        storage_block,
        lambda: launch_node(program, node_rank, rendezvous, notes),
    )


@dataclass(frozen=True)
class PoolTasks:
    """The tasks a pool's workers serve, keyed to that pool."""

    pool: str
    stage: Task[..., StageRef]
    chain: Task[..., dict[str, StageRef]]
    shard: Task[..., StageRef]
    node: Task[..., None]

    @property
    def all(self) -> tuple[Task[..., Any], ...]:
        return (self.stage, self.chain, self.shard, self.node)

    @property
    def task_keys(self) -> list[str]:
        return [task.task_key for task in self.all]


@cache
def pool_tasks(pool: str) -> PoolTasks:
    """The stage, chain, shard and node tasks of ``pool``: what its workers serve and the
    iteration flow submits, keyed ``stage@<pool>``, ``stages@<pool>``, ``stage-shard@<pool>``
    and ``stage-node@<pool>``. Named as the stages' local task runs are (``generate-it3``,
    ``generate+reward-it3``); a stage's options (retries of transient errors, no Prefect cache)
    as a local stage's, but a node is never retried alone: its attempt's other nodes are gone,
    and the waiter runs the whole attempt again (``flows.placed_nodes``). A node task run is
    named for the iteration its rank group started at (``train-node0-it0``)."""
    options = {**STAGE_TASK_OPTIONS, "task_run_name": "{name}-it{iteration}"}
    shard_options = {**options, "task_run_name": "{name}-shard{index}-it{iteration}"}
    node_options = {
        **options,
        "retries": 0,
        "task_run_name": "{name}-node{node_rank}-it{iteration}",
    }
    tasks = PoolTasks(
        pool,
        task(name="stage", **options)(run_stage_here),
        task(name="stages", **options)(run_chain_here),
        task(name="stage-shard", **shard_options)(run_shard_here),
        task(name="stage-node", **node_options)(run_node_here),
    )
    # Prefect derives a task's key from its function's name and its code's hash, which
    # holds the checkout's path: a key of our own is the same on every machine.
    tasks.stage.task_key = f"stage@{pool}"
    tasks.chain.task_key = f"stages@{pool}"
    tasks.shard.task_key = f"stage-shard@{pool}"
    tasks.node.task_key = f"stage-node@{pool}"
    return tasks
