"""The GRPO flow: each iteration is the diagram of DESIGN.md, one Prefect task per stage.

    prompts -> generate -> reward -> logprob -> advantage -> train -> checkpoint

Run locally without a server:
    python -m flows.grpo --config examples/configs/grpo_math_tiny.yaml grpo.max_num_steps=3
Stages whose manifest entry is complete for the same inputs are skipped, so running the
same run_id again continues where a failed run stopped.
"""

from prefect import flow

from flows.cli import run_flow_from_cli
from flows.lease import hold_lease
from flows.report import IterationProgress, publish_iteration_report
from flows.run_setup import lease_owner, open_run, plan_iterations
from nemo_rl_core.utils.logger import Logger
from tasks.advantage import advantage
from tasks.checkpoint import checkpoint
from tasks.generate import generate
from tasks.logprob import logprob
from tasks.prompts import prompts
from tasks.reward import reward
from tasks.runtime import close_runtime
from tasks.train import train

GRPO_STAGES = ("prompts", "generate", "reward", "logprob", "advantage", "train", "checkpoint")


@flow(name="grpo", log_prints=True)
def grpo(
    config_path: str = "examples/configs/grpo_math_tiny.yaml",
    overrides: list[str] | None = None,
    run_id: str | None = None,
    storage_root: str | None = None,
    steps_per_run: int | None = None,
    storage_block: str | None = None,
) -> dict:
    """Train GRPO for ``steps_per_run`` iterations (default: up to ``grpo.max_num_steps``).

    ``run_id`` continues that run (a new id otherwise); ``storage_root`` defaults to
    ``checkpointing.checkpoint_dir``; ``storage_block`` names a prefect-aws
    ``AwsCredentials`` block for an ``s3://`` root (else ``AWS_*`` environment variables).
    """
    run, config = open_run(config_path, overrides, run_id, storage_root, "grpo", storage_block)
    with hold_lease(run, owner=lease_owner()):
        iterations = plan_iterations(run, config, steps_per_run)
        history = []
        progress = IterationProgress(run, iterations)
        metrics_log = Logger(config.logger, run_name=run.run_id)
        try:
            for iteration in iterations:
                batch = prompts(run, iteration)
                rollouts = generate(run, iteration, batch)
                scored = reward(run, iteration, rollouts)
                logprobs = logprob(run, iteration, scored)
                advantages = advantage(run, iteration, logprobs)
                trained = train(run, iteration, advantages, batch)
                checkpoint(run, iteration, trained)
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


if __name__ == "__main__":
    run_flow_from_cli(grpo, "grpo")
