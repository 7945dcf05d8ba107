"""Stage ``generate``: responses (and, for multi-turn tasks, the whole episode) from the
warm generation engine holding this iteration's weights."""

from prefect import task

from nemo_rl_core.algorithms import grpo
from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, digest_of, is_transient, read_output_batch, run_stage


@task(name="generate", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=is_transient)
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
