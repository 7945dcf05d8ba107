"""A stage run across processes: every rank runs the same stage program (SPMD).

``python -m tasks.spmd_stage`` is the rank program torchrun starts: it joins the world
(gloo on CPU, nccl on GPU), reads the stage's inputs from the run's storage and computes
(the policy shards itself over the ranks: FSDP2/TP for the HF backend, TP/DP for Megatron;
each data-parallel rank trains on its slice of the global batch); rank 0 writes the
checkpoint, the outputs and the manifest entry exactly as the one-process stage task does
(``run_stage``: an entry already complete for the same inputs is skipped by every rank).

``launch_stage_node`` starts one node's ranks of it and waits (torchrun through
``nemo_rl_core.distributed.node_launch``): what a worker of the training stage's pool calls,
once per node, with the same ``Rendezvous`` on every node of an attempt. ``spmd_stage`` is
the task that runs a stage on this machine's ranks (``cluster.num_nodes: 1``).
"""

import argparse
import json
import os
import signal
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from prefect import task
from torch.distributed.elastic.multiprocessing.errors import record

from nemo_rl_core.distributed.node_launch import Rendezvous, RendezvousNotes, launch_node
from nemo_rl_core.distributed.world import from_writer, init_rank, is_writer
from nemo_rl_core.pipeline.context import StageContext, StageRef
from nemo_rl_core.pipeline.runtime import close_runtime, runtime_for
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.utils.config import ConfigError
from tasks.stage import STAGE_TASK_OPTIONS, injected_faults, run_stage, stage_inputs

COLLECTIVE_TIMEOUT_S = 1800.0
"""How long a rank waits in one collective for its peers before the stage fails."""
FAULT_NOTES = "injected-faults"  # the notes of faults that fired (once per run)


def launch_stage_node(
    run: RunRef,
    iteration: int,
    stage: str,
    upstream: Mapping[str, StageRef],
    node_rank: int,
    rendezvous: Rendezvous,
    log_path: Path | None = None,
) -> None:
    """Node ``node_rank``'s ranks of stage ``stage`` of ``iteration``, from ``upstream``'s
    stored outputs; returns once they finished (rank 0 committed the stage), raises
    ``RanksLost``/``RanksFailed``/``RendezvousIncomplete`` naming the ranks otherwise."""
    with tempfile.TemporaryDirectory(prefix="spmd-stage-") as scratch:
        upstream_file = Path(scratch) / "upstream.json"
        upstream_file.write_text(
            json.dumps({name: ref.to_dict() for name, ref in upstream.items()})
        )
        program = [
            "-m",
            "tasks.spmd_stage",
            f"--run-id={run.run_id}",
            f"--storage-root={run.storage_root}",
            f"--iteration={iteration}",
            f"--stage={stage}",
            f"--upstream={upstream_file}",
        ]
        notes = RendezvousNotes(open_storage(run), iteration, stage, rendezvous.attempt)
        launch_node(program, node_rank, rendezvous, notes, log_path=log_path)


@task(name="stage", task_run_name="{name}-it{iteration}", **STAGE_TASK_OPTIONS)
def spmd_stage(run: RunRef, iteration: int, name: str, upstream: dict[str, StageRef]) -> StageRef:
    """Stage ``name`` on this machine's ``cluster.gpus_per_node`` ranks (torchrun
    ``--standalone``). A lost rank fails the attempt; Prefect's retry starts a new one,
    which restarts every rank."""
    runtime = runtime_for(run)
    inputs = stage_inputs(runtime, runtime.pipeline.stage(name), iteration, upstream)
    storage = open_storage(run)
    if (entry := storage.completed_stage(iteration, name, inputs)) is None:
        attempt = f"{run.run_id}-it{iteration}-{name}-{uuid.uuid4().hex[:12]}"
        rendezvous = Rendezvous.for_cluster(runtime.config, attempt)
        if rendezvous.nnodes > 1:
            raise ConfigError(
                f"cluster.num_nodes={rendezvous.nnodes}: stage {name!r} spans "
                f"{rendezvous.nnodes} machines; each worker of its pool "
                f"(cluster.placement.{name}) launches one node (launch_stage_node), which "
                "this flow does not submit yet"
            )
        launch_stage_node(run, iteration, name, upstream, 0, rendezvous)
        entry = storage.read_manifest(iteration)["stages"].get(name)
        if entry is None or entry.get("status") != "complete":
            raise RuntimeError(f"stage {name!r}: its ranks ended without committing it")
    return StageRef.from_dict(entry["outputs"])


# ---- the rank program ---------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="one rank of a stage run across processes")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--storage-root", required=True)
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--upstream", required=True, help="JSON file: the upstream StageRefs")
    return parser


def _kill_mid_step_if_asked(run: RunRef, stage: str, iteration: int) -> None:
    """``NEMO_RL_CORE_FAULT=<stage>@<iteration>:kill-rank<r>``: rank r SIGKILLs itself in
    its first backward pass, while its peers wait for it in the step's collectives; once
    per run (a note on storage says it fired), so that the retry runs undisturbed."""
    fault = f"kill-rank{dist.get_rank()}"
    if fault not in injected_faults(stage, iteration):
        return
    storage = open_storage(run)
    if storage.read_rendezvous_note(iteration, stage, FAULT_NOTES, fault) is not None:
        return
    storage.write_rendezvous_note(iteration, stage, FAULT_NOTES, fault, {"pid": os.getpid()})

    def die(*_: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    torch.nn.modules.module.register_module_full_backward_hook(die)


@record
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    init_rank(COLLECTIVE_TIMEOUT_S)
    run = RunRef(args.storage_root, args.run_id)
    upstream = {
        name: StageRef.from_dict(outputs)
        for name, outputs in json.loads(Path(args.upstream).read_text()).items()
    }
    runtime = runtime_for(run)
    spec = runtime.pipeline.stage(args.stage)
    inputs = stage_inputs(runtime, spec, args.iteration, upstream)
    _kill_mid_step_if_asked(run, args.stage, args.iteration)
    storage = open_storage(run)
    done = from_writer(storage.completed_stage(args.iteration, args.stage, inputs) is not None)
    if not done:
        context = StageContext(runtime, args.iteration, upstream, args.stage)
        if is_writer():
            run_stage(run, args.iteration, args.stage, inputs, lambda: spec.compute(context))
        else:
            spec.compute(context)
    dist.barrier()  # rank 0 committed: the stage is done on every rank
    close_runtime(run)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
