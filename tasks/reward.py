"""Stage ``reward``: the environments score each rollout."""

from nemo_rl_core.algorithms import grpo
from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, digest_of, read_output_batch, run_stage, stage_task


@stage_task("reward")
def reward(run: RunRef, iteration: int, rollouts: StageOutputs) -> StageOutputs:
    runtime = runtime_for(run)
    inputs = {"config": runtime.config_digest, "rollouts": digest_of(rollouts)}

    def compute():
        batch = read_output_batch(run, rollouts)
        scored, metrics = grpo.score_rollouts(batch, runtime.task_to_env, runtime.config)
        return {"batch": scored}, metrics

    return run_stage(run, iteration, "reward", inputs, compute)
