"""The training stage across processes: 2 "nodes" x 1 rank, each node its own torchrun
(``--nnodes 2``, c10d rendezvous on 127.0.0.1, gloo), against the one-process stage on the
same global batch: Megatron, a rendezvous a node never joins. The plain data-parallel step,
its checkpoint and a killed rank are tested through the flow, each node started by a stage
worker, and DTensor tensor parallel through the flow's two local ranks
(tests/flows/test_placed_nodes_flow.py). CPU-heavy: a launch costs ~30 s of start-up on 2
cores."""

import time
from dataclasses import replace
from pathlib import Path

import pytest
from flow_testing import checkpoint_dir, stages_of
from spmd_testing import batch_stage, launch_nodes, sft_run
from transformers import AutoModelForCausalLM

from nemo_rl_core.distributed.node_launch import Rendezvous, RendezvousIncomplete
from nemo_rl_core.pipeline.runtime import close_runtime
from tasks.stage import launch_stage_node, stage

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]
TWO_NODES = ("cluster.num_nodes=2", "cluster.gpus_per_node=1", "+cluster.placement.train=pool")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spmd")


@pytest.fixture(scope="module")
def one_process(root: Path, tiny_model_dir: Path) -> str:
    """The SFT train stage's first step in this process (world size 1)."""
    run = sft_run(root, "single", tiny_model_dir)
    stage.fn(run, 0, "train", batch_stage(run, 0))
    close_runtime(run)
    return run.run_id


def train_metrics(root: Path, run_id: str, iteration: int) -> dict:
    return stages_of(root, run_id, iteration)["train"]["metrics"]


def assert_same_step(root: Path, expected_run: str, run_id: str, iteration: int) -> None:
    """Loss and grad norm within 1e-5 of the one-process stage's."""
    expected = train_metrics(root, expected_run, iteration)
    got = train_metrics(root, run_id, iteration)
    assert got["loss"] == pytest.approx(expected["loss"], abs=1e-5)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], abs=1e-5)
    assert got["global_valid_toks"] == expected["global_valid_toks"]


@pytest.mark.megatron
def test_megatron_over_two_nodes(root: Path, tiny_model_dir: Path, one_process: str) -> None:
    """Megatron's ranks joined by the same launcher (--nnodes 2): DP over the two nodes.
    Against the one-process DTensor step: one process of either backend takes the same step
    (fp32, constant LR; their grad norms differ by ~2e-6 here)."""
    megatron = ("policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false")
    run = sft_run(root, "megatron-two", tiny_model_dir, *megatron, *TWO_NODES)
    assert launch_nodes(run, 0, batch_stage(run, 0), 2) == [None, None]
    assert_same_step(root, one_process, run.run_id, 0)
    AutoModelForCausalLM.from_pretrained(checkpoint_dir(root, run.run_id, 1))
    optimizer_files = sorted(
        p.name for p in (checkpoint_dir(root, run.run_id, 1) / "optimizer").iterdir()
    )
    assert optimizer_files == ["optim_tp0_dp0.pt", "optim_tp0_dp1.pt"]  # both ranks', by rank 0


def test_a_node_that_never_joins_fails_the_rendezvous_naming_it(
    root: Path, tiny_model_dir: Path
) -> None:
    run = sft_run(root, "alone", tiny_model_dir, *TWO_NODES)
    upstream = batch_stage(run, 0)
    plan = Rendezvous("alone-attempt", 2, 1, join_timeout_s=3, host="127.0.0.1")
    started = time.monotonic()
    with pytest.raises(RendezvousIncomplete, match=r"node\(s\) \[1\] never joined \(1 of world"):
        launch_stage_node(run, 0, "train", upstream, 0, plan)
    assert time.monotonic() - started < 3 + 30
    # a node whose node 0 never comes waits as long, then names node 0
    with pytest.raises(RendezvousIncomplete, match=r"node\(s\) \[0\] never joined"):
        launch_stage_node(run, 0, "train", upstream, 1, replace(plan, attempt="alone-late"))
