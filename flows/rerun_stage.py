"""Rerun exactly one stage of one iteration from its stored inputs.

The stage and every later stage of that iteration are marked stale first; the stage is
recomputed now, the later ones when the training flow continues the run.
    python -m flows.rerun_stage --run-id RUN --iteration 1 --stage reward --storage-root results
"""

import argparse
import json

from prefect import flow

from flows.grpo import GRPO_STAGES
from flows.lease import hold_lease
from flows.ppo import PPO_STAGES
from flows.run_setup import lease_owner, load_storage_block
from nemo_rl_core.algorithms.ppo import PPOMasterConfig
from tasks.advantage import advantage
from tasks.checkpoint import checkpoint
from tasks.generate import generate
from tasks.logprob import logprob
from tasks.prompts import prompts
from tasks.reward import reward
from tasks.runtime import close_runtime, runtime_for
from tasks.stage import RunRef, StageOutputs, open_storage
from tasks.train import train
from tasks.value import value

# Each stage task and the stages whose outputs it takes, in its argument order.
STAGE_CALLS = {
    "prompts": (prompts, ()),
    "generate": (generate, ("prompts",)),
    "reward": (reward, ("generate",)),
    "logprob": (logprob, ("reward",)),
    "advantage": (advantage, ("logprob",)),
    "train": (train, ("advantage", "prompts")),
    "checkpoint": (checkpoint, ("train",)),
}
# PPO puts the value stage between logprob and advantage.
PPO_STAGE_CALLS = {
    **STAGE_CALLS,
    "value": (value, ("logprob",)),
    "advantage": (advantage, ("value",)),
}


@flow(name="rerun-stage", log_prints=True)
def rerun_stage(
    run_id: str,
    iteration: int,
    stage: str,
    storage_root: str = "results",
    storage_block: str | None = None,
) -> StageOutputs:
    run = RunRef(storage_root, run_id)
    load_storage_block(storage_root, storage_block)
    storage = open_storage(run)
    if isinstance(runtime_for(run).config, PPOMasterConfig):
        order, calls = PPO_STAGES, PPO_STAGE_CALLS
    else:
        order, calls = GRPO_STAGES, STAGE_CALLS
    if stage not in calls:
        raise ValueError(f"stage {stage!r} is not one of {list(order)} (run {run_id!r})")
    entries = storage.read_manifest(iteration).get("stages", {})
    task_fn, upstream = calls[stage]
    missing = [name for name in upstream if name not in entries]
    if missing:
        raise ValueError(
            f"run {run_id!r} iteration {iteration}: stage {stage!r} needs the outputs of "
            f"{missing}, which were never recorded; continue the run instead"
        )
    later = list(order[order.index(stage) :])
    with hold_lease(run, owner=f"{lease_owner()} rerun-stage {stage}@{iteration}"):
        storage.mark_stale(iteration, later)
        try:
            return task_fn(run, iteration, *(entries[name]["outputs"] for name in upstream))
        finally:
            close_runtime(run)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m flows.rerun_stage", description=__doc__)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--stage", required=True, choices=list(PPO_STAGES))
    parser.add_argument("--storage-root", default="results")
    args = parser.parse_args()
    print(json.dumps(rerun_stage(args.run_id, args.iteration, args.stage, args.storage_root)))
