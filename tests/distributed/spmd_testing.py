"""Builders for the multi-process training tests: a stored SFT run on a tiny model, its
``batch`` stage computed in this process, and the ``train`` stage launched as nodes."""

import threading
import uuid
from pathlib import Path
from typing import Any

from flows.config_check import check_run_config
from nemo_rl_core.distributed.node_launch import Rendezvous
from nemo_rl_core.pipeline.algorithms import SFT
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.pipeline.runtime import close_runtime
from nemo_rl_core.pipeline.spec import declared
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.stage import launch_stage_node, stage

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "sft_tiny.yaml"


def sft_run(root: Path, run_id: str, model_dir: Path, *overrides: str) -> RunRef:
    """A stored SFT run on ``model_dir``: global batch 8, microbatch 4 (two ranks: one
    microbatch each, the same microbatches one process makes)."""
    config = check_run_config(
        SFT.config_class,
        str(CONFIG),
        [
            f"policy.model_name={model_dir}",
            "policy.train_global_batch_size=8",
            "policy.train_micro_batch_size=4",
            "sft.max_num_steps=2",
            *overrides,
        ],
        declared(SFT, "data_setup"),
    )
    run = RunRef(str(root), run_id)
    open_storage(run).write_run_config(config.model_dump(mode="json"))
    return run


def batch_stage(run: RunRef, iteration: int) -> dict[str, StageRef]:
    """The ``batch`` stage of ``iteration``, computed here: the train stage's upstream."""
    ref = stage.fn(run, iteration, "batch", {})
    close_runtime(run)
    return {"batch": ref}


def launch_nodes(
    run: RunRef, iteration: int, upstream: dict[str, StageRef], nnodes: int, **rendezvous: Any
) -> list[BaseException | None]:
    """``nnodes`` launches of the train stage, one per thread (each its own torchrun), as
    the workers of a pool would start them; what each raised (None: it finished)."""
    attempt = f"{run.run_id}-{uuid.uuid4().hex[:8]}"
    plan = Rendezvous(attempt, nnodes, 1, host="127.0.0.1", **rendezvous)
    outcomes: list[BaseException | None] = [None] * nnodes

    def node(rank: int) -> None:
        try:
            launch_stage_node(run, iteration, "train", upstream, rank, plan)
        except BaseException as err:  # noqa: BLE001 - the test reads what each node raised
            outcomes[rank] = err

    threads = [threading.Thread(target=node, args=(rank,)) for rank in range(nnodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes
