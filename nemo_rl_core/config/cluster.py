"""NeMo RL's ``cluster:`` section: how many ranks train, and where stages run.

``num_nodes x gpus_per_node`` is the training stage's world size (NeMo RL's cluster):
``gpus_per_node`` ranks on each of ``num_nodes`` machines, one GPU each where there is
CUDA. On a machine without CUDA a rank is a CPU process: ``gpus_per_node`` then counts
processes per node (0 or 1: one process, the default), at most one per core. Above one
rank the training stage runs SPMD under torchrun, on ranks that stay up for the flow run
(``flows.rank_group``), and so does a stage whose model is sharded like the trained one
(distillation's HF teacher: ``Stage.spans_ranks``), on the same ranks with both models
loaded; every other stage stays one process. Several nodes need the training stage placed
on a pool (``placement: {train: <pool>}``), whose workers each launch one node's ranks.

Keys of ours: ``placement`` puts stages on pools of stage workers (a placed stage runs as a
task run of the iteration flow run, which a long-lived stage worker of the pool runs with its
models kept loaded, ``flows.placement``), ``placement_wait_seconds`` is how long one may go
without a worker running it, ``rendezvous_timeout_seconds`` how long a multi-node
training stage waits for all its nodes to join, and ``rendezvous_endpoint`` a fixed
``HOST:PORT`` for its c10d store (default: node 0 hosts it on a free port and publishes it
on the run's storage). Where a stage runs never changes what it computes, so these keys are
left out of the config digest that decides whether a stored output still holds; the world
size is not (summed over more ranks, the floats add up in another order).
"""

from typing import Annotated

from pydantic import Field, PositiveFloat

from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.utils.key_support import Check, Only, SupportContext, Wired

PLACEMENT_KEYS = frozenset(
    {"placement", "placement_wait_seconds", "rendezvous_timeout_seconds", "rendezvous_endpoint"}
)
"""The keys of ``cluster:`` that say where stages run, not what they compute."""

TRAIN_STAGE = "train"  # every algorithm's committing stage
_RENDEZVOUS = "nemo_rl_core.distributed.node_launch:Rendezvous.for_cluster"

NO_RAY_PORTS = Check(
    lambda value, context: None,
    "rendezvous ports of NeMo RL's Ray workers; ranks here rendezvous through torchrun's "
    "c10d store (cluster.rendezvous_endpoint, or a free port node 0 publishes)",
)


def _ranks_per_node_fit(value: int, context: SupportContext) -> str | None:
    """One GPU per rank where there is CUDA; on a CPU machine at most one process a core."""
    machine = context.machine
    if machine.cuda_devices:
        if value <= machine.cuda_devices:
            return None
        return f"{value} ranks per node need {value} GPUs, this machine has {machine.cuda_devices}"
    if value <= machine.cpu_cores:
        return None
    return (
        f"without CUDA a rank is a CPU process: {value} per node need {value} cores, this "
        f"machine has {machine.cpu_cores}; set cluster.gpus_per_node to at most that"
    )


def _nodes_served(value: int, context: SupportContext) -> str | None:
    """Several nodes: the training stage must be placed on a pool whose workers launch them."""
    if value == 1:
        return None
    placement = context.value("cluster.placement") or {}
    if TRAIN_STAGE in placement:
        return None
    per_node = max(context.value("cluster.gpus_per_node") or 0, 1)
    return (
        f"{value} nodes x {per_node} ranks = {value * per_node} training ranks, but without "
        f"cluster.placement.{TRAIN_STAGE} the training stage runs on this one machine; place "
        "it on a pool with a stage worker on each node"
    )


class ClusterConfig(StrictConfig):
    gpus_per_node: Annotated[
        int, Check(_ranks_per_node_fit, "training ranks per node: a GPU each, or a CPU process")
    ] = Field(default=0, ge=0)
    num_nodes: Annotated[
        int, Check(_nodes_served, "training nodes: several need the train stage on a pool")
    ] = Field(default=1, ge=1)
    master_port_range_low: Annotated[int, NO_RAY_PORTS] = 25000
    master_port_range_high: Annotated[int, NO_RAY_PORTS] = 28000
    segment_size: Annotated[
        int | None,
        Only(None, reason="NVLink-domain alignment needs a multi-node GPU cluster"),
    ] = None
    placement: Annotated[dict[str, str], Wired("flows.placed_stage:run_placed_stage")] = Field(
        default_factory=dict
    )
    placement_wait_seconds: Annotated[PositiveFloat, Wired("flows.placement:PlacedRun.poll")] = (
        600.0
    )
    rendezvous_timeout_seconds: Annotated[PositiveFloat, Wired(_RENDEZVOUS)] = 600.0
    rendezvous_endpoint: Annotated[str | None, Wired(_RENDEZVOUS)] = None
