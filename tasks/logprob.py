"""Stage ``logprob``: the policy's and the reference policy's logprobs of the rollouts."""

from prefect import task

from nemo_rl_core.algorithms import grpo
from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, digest_of, is_transient, read_output_batch, run_stage


@task(name="logprob", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=is_transient)
def logprob(run: RunRef, iteration: int, scored: StageOutputs) -> StageOutputs:
    runtime = runtime_for(run)
    weights = runtime.weights(iteration)
    inputs = {
        "config": runtime.config_digest,
        "scored": digest_of(scored),
        "weights": weights.digest,
    }

    def compute():
        batch = read_output_batch(run, scored)
        train_data = grpo.compute_logprobs(
            runtime.policy(iteration), batch, runtime.tokenizer, runtime.config
        )
        return {"batch": train_data}, {}

    return run_stage(run, iteration, "logprob", inputs, compute)
