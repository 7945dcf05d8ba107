"""Stage ``train``: one policy update (and, for PPO, one value update) on the iteration's
batch, then the committed checkpoint that the next iteration's stages read weights from."""

import time

from nemo_rl_core.algorithms import grpo, ppo
from tasks.runtime import runtime_for
from tasks.stage import (
    RunRef,
    StageOutputs,
    digest_of,
    read_output_batch,
    read_output_json,
    run_stage,
    stage_task,
)


@stage_task("train")
def train(
    run: RunRef, iteration: int, advantages: StageOutputs, prompts: StageOutputs
) -> StageOutputs:
    runtime = runtime_for(run)
    weights = runtime.weights(iteration)
    inputs = {
        "config": runtime.config_digest,
        "advantages": digest_of(advantages),
        "weights": weights.digest,
        "dataloader_state": digest_of(prompts, "dataloader_state"),
    }
    is_ppo = isinstance(runtime.config, ppo.PPOMasterConfig)
    if is_ppo:
        inputs["value_weights"] = runtime.value_weights(iteration).digest

    def compute():
        batch = read_output_batch(run, advantages)
        dataloader_state = read_output_json(run, prompts, "dataloader_state")
        policy = runtime.policy_for_update(iteration)
        start = time.perf_counter()
        metrics = grpo.train_policy(policy, batch, runtime.loss_fn(), runtime.config, iteration)
        # The stage's own seconds also hold the checkpoint commit: keep the two apart.
        metrics["policy_update_seconds"] = time.perf_counter() - start
        if is_ppo:
            value_model = runtime.value_for_update(iteration)
            metrics |= ppo.train_value(value_model, batch, runtime.config, iteration)
        checkpoint_url = runtime.save_checkpoint(iteration + 1, dataloader_state, metrics)
        return {"metrics": {**metrics, "checkpoint": checkpoint_url}}, metrics

    return run_stage(run, iteration, "train", inputs, compute)
