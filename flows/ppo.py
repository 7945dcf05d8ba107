"""The PPO flow: GRPO's stages plus the value model, one Prefect task per stage.

    prompts -> generate -> reward -> logprob -> value -> advantage (GAE) -> train -> checkpoint

``train`` updates the policy and the value model and commits both in one checkpoint
(the value model under ``value/``), from which the next iteration loads them.
Run locally without a server:
    python -m flows.ppo --config examples/configs/ppo_tiny.yaml ppo.max_num_steps=3
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
from tasks.value import value

PPO_STAGES = (
    "prompts",
    "generate",
    "reward",
    "logprob",
    "value",
    "advantage",
    "train",
    "checkpoint",
)


def ppo_iteration(run: RunRef, iteration: int) -> None:
    batch = prompts(run, iteration)
    rollouts = generate(run, iteration, batch)
    scored = reward(run, iteration, rollouts)
    logprobs = logprob(run, iteration, scored)
    values = value(run, iteration, logprobs)
    advantages = advantage(run, iteration, values)
    trained = train(run, iteration, advantages, batch)
    checkpoint(run, iteration, trained)


@flow(name="ppo", log_prints=True)
def ppo(
    config_path: str = "examples/configs/ppo_tiny.yaml",
    overrides: list[str] | None = None,
    run_id: str | None = None,
    storage_root: str | None = None,
    steps_per_run: int | None = None,
    storage_block: str | None = None,
) -> dict:
    """Train PPO for ``steps_per_run`` iterations (default: up to ``ppo.max_num_steps``).

    ``run_id`` continues that run (a new id otherwise); ``storage_root`` defaults to
    ``checkpointing.checkpoint_dir``; ``storage_block`` names a prefect-aws
    ``AwsCredentials`` block for an ``s3://`` root (else ``AWS_*`` environment variables).
    """
    return run_iterations(
        "ppo",
        ppo_iteration,
        config_path,
        overrides,
        run_id,
        storage_root,
        steps_per_run,
        storage_block,
    )


if __name__ == "__main__":
    run_flow_from_cli(ppo, "ppo")
