"""Stage ``advantage``: per-prompt baselines and advantages (GRPO) from the rewards."""

from prefect import task

from nemo_rl_core.algorithms import grpo
from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, digest_of, is_transient, read_output_batch, run_stage


@task(name="advantage", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=is_transient)
def advantage(run: RunRef, iteration: int, logprobs: StageOutputs) -> StageOutputs:
    runtime = runtime_for(run)
    inputs = {"config": runtime.config_digest, "logprobs": digest_of(logprobs)}

    def compute():
        batch = read_output_batch(run, logprobs)
        with_advantages, metrics = grpo.compute_advantages(batch, runtime.config)
        return {"batch": with_advantages}, metrics

    return run_stage(run, iteration, "advantage", inputs, compute)
