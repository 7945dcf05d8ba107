"""The GRPO flow: each iteration is the diagram of DESIGN.md, one Prefect task per stage.

    prompts -> generate -> reward -> logprob -> advantage -> train -> checkpoint

Run locally without a server:
    python -m flows.grpo --config examples/configs/grpo_math_tiny.yaml grpo.max_num_steps=3
Stages whose manifest entry is complete for the same inputs are skipped, so running the
same run_id again continues where a failed run stopped.
"""

from prefect import flow

from flows.cli import run_flow_from_cli
from flows.loop import run_iterations
from tasks.advantage import advantage
from tasks.checkpoint import checkpoint
from tasks.generate import generate
from tasks.logprob import logprob
from tasks.prompts import prompts
from tasks.reward import reward
from tasks.stage import RunRef
from tasks.train import train

GRPO_STAGES = ("prompts", "generate", "reward", "logprob", "advantage", "train", "checkpoint")


def grpo_iteration(run: RunRef, iteration: int) -> None:
    batch = prompts(run, iteration)
    rollouts = generate(run, iteration, batch)
    scored = reward(run, iteration, rollouts)
    logprobs = logprob(run, iteration, scored)
    advantages = advantage(run, iteration, logprobs)
    trained = train(run, iteration, advantages, batch)
    checkpoint(run, iteration, trained)


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
    return run_iterations(
        "grpo",
        grpo_iteration,
        config_path,
        overrides,
        run_id,
        storage_root,
        steps_per_run,
        storage_block,
    )


if __name__ == "__main__":
    run_flow_from_cli(grpo, "grpo")
