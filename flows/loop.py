"""What every training flow is: open the run, hold its lease, plan the iterations, run each
one's due stages in their declared order (re-making a damaged input on the way), then
report it (``flows.progress``: a terminal line, the loggers, readable rollouts, Prefect
artifacts; a summary and the curves at the end); warm objects (the runtime, the rank groups
of a stage across nodes) are closed when the flow run ends."""

from collections.abc import Callable
from functools import partial
from typing import Any

from prefect import Flow, flow

from flows.labels import labelled_run
from flows.lease import hold_lease
from flows.placed_nodes import close_rank_groups
from flows.placed_stage import run_placed_stage
from flows.placement import placed_pool, run_placed_chain
from flows.progress import IterationReports
from flows.run_ahead import RolloutsAhead, rollouts_ahead
from flows.run_setup import build_models, config_notes, lease_owner, open_run, plan_iterations
from nemo_rl_core.distributed.virtual_cluster import runs_across_ranks
from nemo_rl_core.pipeline.context import PREVIOUS, DamagedInputError, StageRef
from nemo_rl_core.pipeline.runtime import close_runtime
from nemo_rl_core.pipeline.spec import Pipeline, Stage, round_name
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.refusal import RunRefusedError
from nemo_rl_core.utils.timer import TimeoutChecker
from tasks.stage import stage_logger


def run_pipeline_iteration(
    pipeline: Pipeline,
    config: Any,
    run: RunRef,
    iteration: int,
    final_step: int,
    ahead: RolloutsAhead | None = None,
) -> None:
    """The iteration's due stages in declared order, each fed the outputs it reads; the
    refill stages run again, round after round, until their batch is complete. With
    ``ahead`` (async GRPO), the run-ahead stages' outputs come from its background rollouts.
    Consecutive due stages placed on one pool run as one task run there (``chain_pool``)."""
    done: dict[str, StageRef] = {}
    chain: list[Stage] = []
    for spec in pipeline.stages:
        ahead_stage = ahead is not None and spec.name in ahead.stages
        due = spec.is_due(config, iteration, final_step)
        pool = None if ahead_stage else chain_pool(pipeline, config, spec)
        if chain and (ahead_stage or due) and pool != chain_pool(pipeline, config, chain[0]):
            run_chain(pipeline, config, run, iteration, final_step, chain, done)
            chain = []
        if ahead is not None and ahead_stage:
            if spec.name == ahead.stages[0] and due:
                done |= ahead.take(iteration)
        elif due and pool is not None:
            chain.append(spec)
        else:
            run_due_stage(pipeline, config, run, iteration, final_step, spec, done)
    run_chain(pipeline, config, run, iteration, final_step, chain, done)


def chain_pool(pipeline: Pipeline, config: Any, spec: Stage) -> str | None:
    """The pool ``spec`` runs on as part of a chain of consecutive stages placed there, or
    None: it runs alone (not placed, fanned out, refilled round after round, or across
    ranks)."""
    refill = pipeline.refill
    if refill is not None and refill.enabled(config) and spec.name in refill.stages:
        return None
    if config.orchestration.fan_out.get(spec.name, 1) > 1:
        return None
    if runs_across_ranks(config, spec.spans_ranks(config)):
        return None  # one task run per node (flows.placed_nodes)
    return placed_pool(config, spec.name)


def run_chain(
    pipeline: Pipeline,
    config: Any,
    run: RunRef,
    iteration: int,
    final_step: int,
    chain: list[Stage],
    done: dict[str, StageRef],
) -> None:
    """Due stages placed on one pool, one after the other: one task run there for two or
    more, the stage's own for one; their refs join ``done``."""
    if len(chain) == 1:
        run_due_stage(pipeline, config, run, iteration, final_step, chain[0], done)
    elif chain:
        reads = {name for spec in chain for name in spec.all_reads if name in done}
        upstream = {name: done[name] for name in sorted(reads)}
        done |= run_placed_chain(config, run, iteration, [spec.name for spec in chain], upstream)


def run_rollout(
    pipeline: Pipeline, config: Any, run: RunRef, final_step: int, iteration: int
) -> dict[str, StageRef]:
    """The run-ahead stages of one iteration (what ``RolloutsAhead`` runs in its thread)."""
    done: dict[str, StageRef] = {}
    names = pipeline.run_ahead.stages if pipeline.run_ahead is not None else ()
    for name in names:
        run_due_stage(pipeline, config, run, iteration, final_step, pipeline.stage(name), done)
    return done


def run_due_stage(
    pipeline: Pipeline,
    config: Any,
    run: RunRef,
    iteration: int,
    final_step: int,
    spec: Stage,
    done: dict[str, StageRef],
) -> None:
    """Stage ``spec`` if due, fed the outputs in ``done`` that it reads; its ref joins
    ``done``. The last refill stage runs the refill rounds after it."""
    if not spec.is_due(config, iteration, final_step):
        return
    upstream = {name: done[name] for name in spec.all_reads if name in done}
    done[spec.name] = run_placed_stage(config, run, iteration, spec.name, upstream)
    refill = pipeline.refill
    if pipeline.refilling(config) and refill and spec.name == refill.stages[-1]:
        round_index = 0
        while not batch_complete(run, done[spec.name], refill.complete_output):
            round_index += 1
            for name in refill.stages:
                reads = pipeline.stage(name).all_reads
                upstream = {r: done[r] for r in reads if r in done}
                upstream[PREVIOUS] = done[name]
                recorded = round_name(name, round_index)
                done[name] = run_placed_stage(config, run, iteration, recorded, upstream)


def batch_complete(run: RunRef, ref: StageRef, output: str) -> bool:
    return bool(open_storage(run).read_json(ref.outputs[output])["complete"])


def run_iteration(iteration_body: Callable[[], None], run: RunRef, iteration: int) -> list[str]:
    """Run one iteration's stages; returns the keys of damaged inputs that were re-made.

    A stage that reads an input of this iteration whose bytes no longer match the manifest
    (``DamagedInputError``) does not trust it: the producing stage is marked stale and the
    iteration runs again, in this flow run. Stages before the producer are skipped (complete,
    same inputs), the producer recomputes from its stored inputs, and the stages after it
    recompute unless the re-made object is bit-identical, as deterministic stages make it
    (their inputs name its sha256). Each object is re-made once; damaged twice, it fails.
    """
    remade: list[str] = []
    while True:
        try:
            iteration_body()
            return remade
        except DamagedInputError as err:
            if err.iteration != iteration or err.key in remade:
                raise
            stage_logger().warning(
                "run %s: %s; re-executing stage %r of iteration %d",
                run.run_id,
                err,
                err.stage,
                iteration,
            )
            storage = open_storage(run)
            storage.record_repair(iteration, err.key, err.detail)
            storage.mark_stale(iteration, [err.stage])
            remade.append(err.key)


def run_iterations(
    pipeline: Pipeline,
    config_path: str,
    overrides: list[str] | None,
    run_id: str | None,
    storage_root: str | None,
    steps_per_run: int | None,
    storage_block: str | None,
    start_over: bool = False,
) -> dict:
    """Run the planned iterations of ``pipeline`` (fewer when ``checkpoint_must_save_by``
    comes near; from iteration 0, discarding what is stored, with ``start_over``); returns
    the run's id, root, the iterations run, per-iteration metrics and the keys of damaged
    inputs that were re-made."""
    run, config = open_run(pipeline, config_path, overrides, run_id, storage_root, storage_block)
    for note in config_notes(config):
        stage_logger().warning("run %s: %s", run.run_id, note)
    resolved = {"run_id": run.run_id, "storage_root": run.storage_root}
    with labelled_run(pipeline.name, run, resolved=resolved), hold_lease(run, owner=lease_owner()):
        build_models(pipeline, config)
        iterations, final_step = plan_iterations(pipeline, run, config, steps_per_run, start_over)
        if not iterations:
            close_runtime(run)  # planning opened it; the next flow run may bring a new config
            return nothing_to_do(pipeline, run, final_step)
        total = pipeline.last_iteration(config, final_step)
        done: list[int] = []
        remade: list[str] = []
        # NeMo RL's checkpoint_must_save_by: stop one average iteration before the limit.
        deadline = TimeoutChecker(config.checkpointing.checkpoint_must_save_by, True)
        deadline.start_iterations()
        rollout = partial(run_rollout, pipeline, config, run, final_step)
        training = [i for i in iterations if i < final_step]
        ahead = rollouts_ahead(pipeline, config, rollout, training)
        try:
            with IterationReports(pipeline, run, config, iterations, total) as reports:
                for iteration in iterations:
                    remade += run_iteration(
                        partial(
                            run_pipeline_iteration,
                            pipeline,
                            config,
                            run,
                            iteration,
                            final_step,
                            ahead,
                        ),
                        run,
                        iteration,
                    )
                    done.append(iteration)
                    reports.iteration_done(iteration)
                    deadline.mark_iteration()
                    if deadline.check_save():
                        stage_logger().info(
                            "run %s: checkpointing.checkpoint_must_save_by is near; stopping "
                            "after iteration %d, whose checkpoint is committed",
                            run.run_id,
                            iteration,
                        )
                        break
        finally:
            if ahead is not None:
                ahead.close()
            close_rank_groups(run)
            close_runtime(run)
    return {
        "run_id": run.run_id,
        "storage_root": run.storage_root,
        "iterations": done,
        "metrics": reports.history,
        "remade": remade,
    }


def nothing_to_do(pipeline: Pipeline, run: RunRef, final_step: int) -> Any:
    """A finished run continued (a nightly past its last step): say so in the log, in an
    artifact and in the flow run's final state, instead of completing without a word."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.states import Completed

    section = pipeline.name
    message = (
        f"run {run.run_id} is finished: all {final_step} steps are committed "
        f"({section}.max_num_steps / max_num_epochs), so there is nothing to run. To train "
        f"further, pass the flow parameter max_num_steps (above {final_step}) or the override "
        f"{section}.max_num_steps=<more>"
    )
    stage_logger().warning(message)
    create_markdown_artifact(
        key=f"{run.run_id.lower()}-nothing-to-do"[:64].replace("_", "-").replace(".", "-"),
        markdown=f"### {message}\n",
        description="a continued run that had no step left",
    )
    summary = {
        "run_id": run.run_id,
        "storage_root": run.storage_root,
        "iterations": [],
        "metrics": [],
        "remade": [],
        "message": message,
    }
    return Completed(message=message, data=summary)


def refused(err: RunRefusedError) -> Any:
    """The flow run's end when the run was refused (another run drives it): Failed, with the
    reason as its message and one log line, not a traceback; a caller in this process gets
    ``err`` itself."""
    from prefect.states import Failed

    return Failed(message=str(err), data=err)


def training_flow(pipeline: Pipeline) -> Flow:
    """The Prefect flow of ``pipeline``: named after it, with the parameters every training
    deployment takes."""

    def train(
        config_path: str = pipeline.default_config,
        overrides: list[str] | None = None,
        run_id: str | None = None,
        storage_root: str | None = None,
        steps_per_run: int | None = None,
        storage_block: str | None = None,
        max_num_steps: int | None = None,
        start_over: bool = False,
    ) -> dict:
        if max_num_steps is not None:  # last, so it wins over the config and overrides
            overrides = [*(overrides or []), f"{pipeline.name}.max_num_steps={max_num_steps}"]
        try:
            return run_iterations(
                pipeline,
                config_path,
                overrides,
                run_id,
                storage_root,
                steps_per_run,
                storage_block,
                start_over,
            )
        except RunRefusedError as err:
            return refused(err)

    train.__doc__ = (
        f"Train {pipeline.name.upper()} for ``steps_per_run`` iterations (default: up to "
        f"``{pipeline.name}.max_num_steps``).\n\n``run_id`` continues that run (a new id "
        "otherwise); ``storage_root`` defaults to ``checkpointing.checkpoint_dir``; "
        "``storage_block`` names a prefect-aws ``AwsCredentials`` block for an ``s3://`` root "
        "(else ``AWS_*`` environment variables); ``max_num_steps`` sets "
        f"``{pipeline.name}.max_num_steps``, to continue a finished run past it; "
        "``start_over`` deletes what is stored of run ``run_id`` and trains it from "
        "iteration 0 (a run whose stored progress was lost is refused without it)."
    )
    return flow(name=pipeline.name, log_prints=True)(train)
