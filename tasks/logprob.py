"""Stage ``logprob``: the policy's and the reference policy's logprobs of the rollouts."""

from nemo_rl_core.algorithms import grpo
from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, digest_of, read_output_batch, run_stage, stage_task


@stage_task("logprob")
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
