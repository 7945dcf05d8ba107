"""NeMo RL's ``nemo_rl.distributed.virtual_cluster`` path of the ``cluster:`` section, which
lives in the config package (:mod:`nemo_rl_core.config.cluster`), and the training world
it sizes."""

from typing import Any

from nemo_rl_core.config.cluster import ClusterConfig


def training_world(config: Any) -> tuple[int, int]:
    """``(nodes, ranks per node)`` of the training stage: NeMo RL's ``cluster`` when it asks
    for more than one rank, else Megatron's own ``tensor x data parallel`` ranks (a policy
    without a training backend, as a pipeline declared by the tests has, trains on one)."""
    cluster = config.cluster
    nodes, per_node = cluster.num_nodes, max(cluster.gpus_per_node, 1)
    if nodes * per_node == 1 and getattr(config.policy, "training_backend", None) == "megatron":
        megatron = config.policy.megatron_cfg
        if megatron is not None:
            per_node = megatron.tensor_model_parallel_size * megatron.data_parallel_size
    return nodes, per_node


def runs_across_ranks(config: Any, stage_spans_ranks: bool) -> bool:
    """Whether a stage runs SPMD: one that spans the training ranks (``Stage.spans_ranks``:
    the training stage, the teacher) in a world above one rank."""
    if not stage_spans_ranks:
        return False
    nodes, per_node = training_world(config)
    return nodes * per_node > 1


__all__ = ["ClusterConfig", "runs_across_ranks", "training_world"]
