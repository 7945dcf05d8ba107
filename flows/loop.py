"""The part every training flow shares around its iteration: open the run, hold its lease,
plan the iterations, run each one (re-making a damaged input on the way), then report its
metrics and progress; warm objects are closed when the flow run ends, finished or failed."""

from collections.abc import Callable

from flows.lease import hold_lease
from flows.report import IterationReports
from flows.run_setup import lease_owner, open_run, plan_iterations
from nemo_rl_core.utils.logger import Logger
from tasks.runtime import close_runtime
from tasks.stage import DamagedInputError, RunRef, open_storage, stage_logger


def run_iteration(
    one_iteration: Callable[[RunRef, int], None], run: RunRef, iteration: int
) -> list[str]:
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
            one_iteration(run, iteration)
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
            open_storage(run).mark_stale(iteration, [err.stage])
            remade.append(err.key)


def run_iterations(
    algorithm: str,
    one_iteration: Callable[[RunRef, int], None],
    config_path: str,
    overrides: list[str] | None,
    run_id: str | None,
    storage_root: str | None,
    steps_per_run: int | None,
    storage_block: str | None,
) -> dict:
    """Call ``one_iteration(run, iteration)`` (the flow's stage calls) for each planned
    iteration; returns the run's id, root, iterations, per-iteration metrics and the keys
    of damaged inputs that were re-made."""
    run, config = open_run(config_path, overrides, run_id, storage_root, algorithm, storage_block)
    with hold_lease(run, owner=lease_owner()):
        iterations = plan_iterations(run, config, steps_per_run)
        history = []
        remade: list[str] = []
        metrics_log = Logger(config.logger, run_name=run.run_id)
        try:
            with IterationReports(run, iterations) as reports:
                for iteration in iterations:
                    remade += run_iteration(one_iteration, run, iteration)
                    history.append(reports.iteration_done(iteration))
                    metrics_log.log_metrics(history[-1], step=iteration)
        finally:
            close_runtime(run)
            metrics_log.close()
    return {
        "run_id": run.run_id,
        "storage_root": run.storage_root,
        "iterations": iterations,
        "metrics": history,
        "remade": remade,
    }
