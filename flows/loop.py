"""The part every training flow shares around its iteration: open the run, hold its lease,
plan the iterations, then after each one report metrics and progress; warm objects are
closed when the flow run ends, whether it finished or failed."""

from collections.abc import Callable

from flows.lease import hold_lease
from flows.report import IterationProgress, publish_iteration_report
from flows.run_setup import lease_owner, open_run, plan_iterations
from nemo_rl_core.utils.logger import Logger
from tasks.runtime import close_runtime
from tasks.stage import RunRef


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
    iteration; returns the run's id, root, iterations and per-iteration metrics."""
    run, config = open_run(config_path, overrides, run_id, storage_root, algorithm, storage_block)
    with hold_lease(run, owner=lease_owner()):
        iterations = plan_iterations(run, config, steps_per_run)
        history = []
        progress = IterationProgress(run, iterations)
        metrics_log = Logger(config.logger, run_name=run.run_id)
        try:
            for iteration in iterations:
                one_iteration(run, iteration)
                history.append(publish_iteration_report(run, iteration))
                metrics_log.log_metrics(history[-1], step=iteration)
                progress.iteration_done(iteration)
        finally:
            close_runtime(run)
            metrics_log.close()
    return {
        "run_id": run.run_id,
        "storage_root": run.storage_root,
        "iterations": iterations,
        "metrics": history,
    }
