"""Stage ``value`` (PPO): the value model's estimates V_t of every rollout token."""

from nemo_rl_core.algorithms import ppo
from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, digest_of, read_output_batch, run_stage, stage_task


@stage_task("value")
def value(run: RunRef, iteration: int, logprobs: StageOutputs) -> StageOutputs:
    runtime = runtime_for(run)
    inputs = {
        "config": runtime.config_digest,
        "logprobs": digest_of(logprobs),
        "value_weights": runtime.value_weights(iteration).digest,
    }

    def compute():
        batch = read_output_batch(run, logprobs)
        with_values = ppo.compute_values(runtime.value(iteration), batch)
        return {"batch": with_values}, {}

    return run_stage(run, iteration, "value", inputs, compute)
