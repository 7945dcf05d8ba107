"""NeMo RL's ``nemo_rl.distributed.virtual_cluster`` path of the ``cluster:`` section, which
lives in the config package (:mod:`nemo_rl_core.config.cluster`), and the training world
it sizes."""

from typing import Any

from nemo_rl_core.config.cluster import ClusterConfig


def training_world(config: Any) -> tuple[int, int]:
    """``(nodes, ranks per node)`` of the training stage: NeMo RL's ``cluster`` when it asks
    for more than one rank, else Megatron's own ``tensor x data parallel`` ranks."""
    cluster = config.cluster
    nodes, per_node = cluster.num_nodes, max(cluster.gpus_per_node, 1)
    if nodes * per_node == 1:
        megatron = config.policy.megatron_cfg
        if config.policy.training_backend == "megatron" and megatron is not None:
            per_node = megatron.tensor_model_parallel_size * megatron.data_parallel_size
    return nodes, per_node


def runs_across_ranks(config: Any, stage_commits: bool) -> bool:
    """Whether a stage runs SPMD: the training (committing) stage of a world above one rank."""
    if not stage_commits:
        return False
    nodes, per_node = training_world(config)
    return nodes * per_node > 1


__all__ = ["ClusterConfig", "runs_across_ranks", "training_world"]
