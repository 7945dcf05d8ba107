"""NeMo RL's ``cluster.num_nodes x cluster.gpus_per_node`` sizes the training stage's world
(CPU processes where there is no CUDA); what cannot be served is refused before any work."""

import re

import pytest
from policy_testing import CONFIGS, support_refusals

from nemo_rl_core.algorithms.distillation_config import DistillationMasterConfig
from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.distributed.node_launch import Rendezvous
from nemo_rl_core.distributed.virtual_cluster import runs_across_ranks, training_world
from nemo_rl_core.pipeline.algorithms import DISTILLATION
from nemo_rl_core.pipeline.stage_keys import check_stage_names
from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import Machine, UnsupportedConfigError, check_support

TWO_CORES, ONE_GPU = Machine(cuda_devices=0, cpu_cores=2), Machine(cuda_devices=1, cpu_cores=8)
PLACED = "+cluster.placement.train=train-pool"


def world(*overrides: str) -> tuple[int, int]:
    return training_world(load_master_config(str(CONFIGS / "grpo_math_tiny.yaml"), list(overrides)))


def test_world_size_from_the_cluster_section() -> None:
    assert world() == (1, 1)  # gpus_per_node: 0 on CPU is one process
    assert world("cluster.gpus_per_node=2") == (1, 2)
    assert world("cluster.num_nodes=2", PLACED) == (2, 1)
    assert world("cluster.num_nodes=2", "cluster.gpus_per_node=4", PLACED) == (2, 4)
    # without a cluster of several ranks, Megatron's own TP x DP ranks
    megatron = ["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false"]
    assert world(*megatron, "policy.megatron_cfg.tensor_model_parallel_size=2") == (1, 2)


def test_only_the_training_stage_runs_across_ranks() -> None:
    config = load_master_config(str(CONFIGS / "grpo_math_tiny.yaml"), ["cluster.gpus_per_node=2"])
    assert runs_across_ranks(config, stage_spans_ranks=True)
    assert not runs_across_ranks(config, stage_spans_ranks=False)
    default = load_master_config(str(CONFIGS / "grpo_math_tiny.yaml"), [])
    assert not runs_across_ranks(default, stage_spans_ranks=True)


@pytest.mark.parametrize(
    ("overrides", "machine", "refused"),
    [
        (
            ["cluster.num_nodes=2"],
            TWO_CORES,
            "cluster.num_nodes=2: 2 nodes x 1 ranks = 2 training ranks, but without "
            "cluster.placement.train the training stage runs on this one machine",
        ),
        (
            ["cluster.gpus_per_node=3"],
            TWO_CORES,
            "cluster.gpus_per_node=3: without CUDA a rank is a CPU process: 3 per node need "
            "3 cores, this machine has 2",
        ),
        (
            ["cluster.gpus_per_node=2"],
            ONE_GPU,
            "cluster.gpus_per_node=2: 2 ranks per node need 2 GPUs, this machine has 1",
        ),
        (
            ["cluster.num_nodes=3", PLACED, "policy.dtensor_cfg.tensor_parallel_size=2"],
            TWO_CORES,
            "policy.dtensor_cfg.tensor_parallel_size=2: tensor parallelism over 2 ranks needs "
            "a training world that is a multiple of 2; cluster.num_nodes x "
            "cluster.gpus_per_node (processes per node on CPU) = 3",
        ),
        (
            [
                "cluster.gpus_per_node=2",
                "policy.dtensor_cfg.tensor_parallel_size=2",
                "policy.dtensor_cfg.sequence_parallel=true",
                "policy.dtensor_cfg.custom_parallel_plan=my_plans.PLAN",
            ],
            TWO_CORES,
            "policy.dtensor_cfg.sequence_parallel=True: dtensor_cfg.custom_parallel_plan lays "
            "out the activations with its own styles",
        ),
        (
            ["cluster.gpus_per_node=2", "+policy.dtensor_cfg.dp_replicate_size=4"],
            TWO_CORES,
            "policy.dtensor_cfg.dp_replicate_size=4: HSDP splits the data-parallel ranks into "
            "4 replicas, and there are 2",
        ),
        (
            [
                "cluster.gpus_per_node=2",
                "+policy.dtensor_cfg.dp_replicate_size=2",
                "policy.dtensor_cfg._v2=false",
            ],
            TWO_CORES,
            "HSDP needs NeMo RL's v2 DTensor worker, as there: set dtensor_cfg._v2: true",
        ),
    ],
)
def test_a_world_that_cannot_be_served_is_refused(
    overrides: list[str], machine: Machine, refused: str
) -> None:
    assert refused in support_refusals("grpo_math_tiny.yaml", overrides, machine)


@pytest.mark.parametrize(
    "overrides",
    [
        ["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2"],
        ["cluster.num_nodes=2", PLACED],
        ["cluster.num_nodes=2", PLACED, "policy.dtensor_cfg.tensor_parallel_size=2"],
        ["policy.dtensor_cfg.sequence_parallel=true"],  # inert without TP, as in NeMo RL
    ],
)
def test_a_world_that_fits_is_accepted(overrides: list[str]) -> None:
    assert support_refusals("grpo_math_tiny.yaml", overrides, TWO_CORES) == ""


def test_the_rendezvous_follows_the_cluster_section() -> None:
    config = load_master_config(
        str(CONFIGS / "grpo_math_tiny.yaml"),
        [
            "cluster.num_nodes=2",
            "cluster.gpus_per_node=2",
            PLACED,
            "+cluster.rendezvous_timeout_seconds=45",
            "+cluster.rendezvous_endpoint=trainer-0:29400",
        ],
    )
    plan = Rendezvous.for_cluster(config, "attempt-1")
    assert (plan.nnodes, plan.nproc_per_node, plan.world_size) == (2, 2, 4)
    assert (plan.join_timeout_s, plan.endpoint) == (45, "trainer-0:29400")


DISTILLATION_CONFIG = str(CONFIGS / "distillation_tiny.yaml")


def distillation_config(*overrides: str) -> DistillationMasterConfig:
    config = load_master_config(DISTILLATION_CONFIG, list(overrides), DistillationMasterConfig)
    assert isinstance(config, DistillationMasterConfig)
    return config


def test_the_hf_teacher_runs_on_the_training_ranks() -> None:
    """NeMo RL's DTensor teacher is sharded over the training world, so its stage runs there;
    a Megatron teacher spreads over its own TP x DP ranks from the stage's process."""
    teacher = DISTILLATION.stage("teacher")
    config = distillation_config("cluster.gpus_per_node=2")
    assert runs_across_ranks(config, teacher.spans_ranks(config))
    assert not runs_across_ranks(distillation_config(), teacher.spans_ranks(config))
    megatron = distillation_config(
        "cluster.gpus_per_node=2",
        "teacher.megatron_cfg.enabled=true",
        "teacher.dtensor_cfg.enabled=false",
    )
    assert not teacher.spans_ranks(megatron)
    assert not DISTILLATION.stage("reward").spans_ranks(config)


def test_the_teacher_tensor_parallel_size_divides_the_training_world() -> None:
    tp2 = "teacher.dtensor_cfg.tensor_parallel_size=2"
    config = distillation_config("cluster.gpus_per_node=2", tp2)
    check_support(config, TWO_CORES, source="distillation_tiny.yaml")
    with pytest.raises(UnsupportedConfigError, match=re.escape(f"{tp2}: tensor parallelism over")):
        check_support(distillation_config(tp2), TWO_CORES, source="distillation_tiny.yaml")


def test_the_teacher_rides_on_the_training_stages_placement() -> None:
    """Across nodes the teacher's stage runs on the training stage's rank group, where
    cluster.placement.train puts it; a placement of its own is refused by key."""
    nodes = ("cluster.num_nodes=2", "cluster.gpus_per_node=1", PLACED)
    check_stage_names(distillation_config(*nodes), DISTILLATION)
    with pytest.raises(ConfigError, match=r"cluster.placement.teacher: stage 'teacher' runs on"):
        placed = distillation_config(*nodes, "+cluster.placement.teacher=train-pool")
        check_stage_names(placed, DISTILLATION)
    # in one process the teacher is a stage like any other, placed where the user says
    check_stage_names(distillation_config("+cluster.placement.teacher=pool"), DISTILLATION)


def test_hsdp_and_sequence_parallelism_that_fit_the_world_run() -> None:
    hsdp = ["cluster.gpus_per_node=2", "+policy.dtensor_cfg.dp_replicate_size=2"]
    assert support_refusals("grpo_math_tiny.yaml", hsdp, TWO_CORES) == ""
    tp = ["cluster.gpus_per_node=2", "policy.dtensor_cfg.tensor_parallel_size=2"]
    sp = [*tp, "policy.dtensor_cfg.sequence_parallel=true"]
    assert support_refusals("grpo_math_tiny.yaml", sp, TWO_CORES) == ""
