"""Stage ``prompts``: the dataloader's slice for one iteration, repeated per generation."""

from nemo_rl_core.algorithms import grpo
from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, run_stage, stage_task


@stage_task("prompts")
def prompts(run: RunRef, iteration: int) -> StageOutputs:
    runtime = runtime_for(run)
    start = runtime.dataloader_state(iteration)
    inputs = {"config": runtime.config_digest, "dataloader_state": grpo.digest_json(start)}

    def compute():
        batch, state = grpo.take_prompts(runtime.dataloader, runtime.config, start)
        return {"batch": batch, "dataloader_state": state}, {"num_samples": batch.size}

    return run_stage(run, iteration, "prompts", inputs, compute)
