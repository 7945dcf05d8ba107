"""Stage ``generate``: responses (and, for multi-turn tasks, the whole episode) from the
warm generation engine holding this iteration's weights."""

from nemo_rl_core.algorithms import grpo
from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, digest_of, read_output_batch, run_stage, stage_task


@stage_task("generate")
def generate(run: RunRef, iteration: int, prompts: StageOutputs) -> StageOutputs:
    runtime = runtime_for(run)
    weights = runtime.weights(iteration)
    inputs = {
        "config": runtime.config_digest,
        "prompts": digest_of(prompts),
        "weights": weights.digest,
    }

    def compute():
        batch = read_output_batch(run, prompts)
        engine = runtime.generation(iteration)
        rollouts, metrics = grpo.generate_rollouts(
            engine, batch, runtime.tokenizer, runtime.task_to_env, runtime.config, iteration
        )
        return {"batch": rollouts}, metrics

    return run_stage(run, iteration, "generate", inputs, compute)
