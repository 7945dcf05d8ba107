"""One rank's part of a stage run across processes: every rank runs this same code (SPMD).

The ranks of a warm rank group (``flows.rank_group``: what torchrun starts on every rank)
call ``run_rank_stage`` once per order: each rank reads the stage's inputs from the run's
storage and computes (the policy shards itself over the ranks: FSDP2/TP for the HF backend,
TP/DP for Megatron; each data-parallel rank trains on its slice of the global batch); rank 0
writes the checkpoint, the outputs and the manifest entry exactly as the one-process stage
task does (``run_stage``: an entry already complete for the same inputs is skipped by every
rank).
"""

import torch.distributed as dist

from nemo_rl_core.distributed.world import from_writer, is_writer
from nemo_rl_core.pipeline.context import StageContext, StageRef
from nemo_rl_core.pipeline.runtime import runtime_for
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.faults import StageFaults
from tasks.stage import run_stage, stage_inputs

COLLECTIVE_TIMEOUT_S = 1800.0
"""How long a rank waits in one collective for its peers before the stage fails."""


def run_rank_stage(run: RunRef, iteration: int, stage: str, upstream: dict[str, StageRef]) -> None:
    """This rank's part of stage ``stage`` of ``iteration`` (every rank calls it, in step):
    rank 0 commits it, unless the manifest holds it complete for the same inputs; returns
    once every rank is done."""
    runtime = runtime_for(run)
    spec = runtime.pipeline.stage(stage)
    inputs = stage_inputs(runtime, spec, iteration, upstream)
    storage = open_storage(run)
    StageFaults.asked(stage, iteration).in_rank_compute(storage, dist.get_rank())
    done = from_writer(storage.completed_stage(iteration, stage, inputs) is not None)
    if not done:
        context = StageContext(runtime, iteration, upstream, stage)
        if is_writer():
            run_stage(run, iteration, stage, inputs, lambda: spec.compute(context))
        else:
            spec.compute(context)
    dist.barrier()  # rank 0 committed: the stage is done on every rank
