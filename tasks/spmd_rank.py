"""One rank of a stage run across processes: every rank runs this same program (SPMD).

``python -m tasks.spmd_rank`` is what torchrun starts on every rank of one stage attempt on
this machine (through ``tasks.stage.launch_stage_node``; a warm rank group across nodes runs
``run_rank_stage`` once per order instead: ``flows.rank_group``): it joins the world (gloo on CPU, nccl on GPU), reads the
stage's inputs from the run's storage and computes (the policy shards itself over the ranks:
FSDP2/TP for the HF backend, TP/DP for Megatron; each data-parallel rank trains on its
slice of the global batch); rank 0 writes the checkpoint, the outputs and the manifest
entry exactly as the one-process stage task does (``run_stage``: an entry already complete
for the same inputs is skipped by every rank).
"""

import argparse
import json
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from nemo_rl_core.distributed.world import from_writer, init_rank, is_writer
from nemo_rl_core.pipeline.context import StageContext, StageRef
from nemo_rl_core.pipeline.runtime import close_runtime, runtime_for
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.faults import StageFaults
from tasks.stage import run_stage, stage_inputs

COLLECTIVE_TIMEOUT_S = 1800.0
"""How long a rank waits in one collective for its peers before the stage fails."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="one rank of a stage run across processes")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--storage-root", required=True)
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--upstream", required=True, help="JSON file: the upstream StageRefs")
    return parser


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


@record
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    init_rank(COLLECTIVE_TIMEOUT_S)
    run = RunRef(args.storage_root, args.run_id)
    upstream = {
        name: StageRef.from_dict(outputs)
        for name, outputs in json.loads(Path(args.upstream).read_text()).items()
    }
    run_rank_stage(run, args.iteration, args.stage, upstream)
    close_runtime(run)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
