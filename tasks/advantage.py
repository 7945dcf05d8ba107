"""Stage ``advantage``: per-prompt baselines (GRPO) or GAE from the values (PPO), per token."""

from nemo_rl_core.algorithms import grpo, ppo
from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, digest_of, read_output_batch, run_stage, stage_task


@stage_task("advantage")
def advantage(run: RunRef, iteration: int, logprobs: StageOutputs) -> StageOutputs:
    """``logprobs``: the outputs of the stage before this one (``logprob``; PPO: ``value``)."""
    runtime = runtime_for(run)
    inputs = {"config": runtime.config_digest, "logprobs": digest_of(logprobs)}
    is_ppo = isinstance(runtime.config, ppo.PPOMasterConfig)
    estimate = ppo.compute_advantages if is_ppo else grpo.compute_advantages

    def compute():
        batch = read_output_batch(run, logprobs)
        with_advantages, metrics = estimate(batch, runtime.config)
        return {"batch": with_advantages}, metrics

    return run_stage(run, iteration, "advantage", inputs, compute)
