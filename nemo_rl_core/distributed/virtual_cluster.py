"""NeMo RL's ``cluster:`` section. Each stage runs as one process on this machine's devices
(Megatron's ranks under ``torchrun --standalone``); a cluster that asks for more GPUs or
nodes than the machine has is refused before any work.

Two keys of ours place stages on pools of stage workers instead (``placement``, and how long
a placed stage may wait for a worker, ``placement_wait_seconds``): a placed stage runs as a
task run of the iteration flow run that a long-lived stage worker of its pool runs, on
whatever machine serves that pool (``flows.placement``). Where a stage runs never changes
what it computes, so these keys are left out of the config digest that decides whether a
stored output still holds.
"""

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import Check, Only, Wired, needs_gpus

if TYPE_CHECKING:
    from nemo_rl_core.pipeline.spec import Pipeline

PLACEMENT_KEYS = frozenset({"placement", "placement_wait_seconds"})
"""The keys of ``cluster:`` that say where stages run, not what they compute."""

NO_RAY_PORTS = Check(
    lambda value, context: None,
    "rendezvous ports of NeMo RL's Ray workers; ranks here rendezvous through torchrun's "
    "--standalone store and take no port from this range",
)


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus_per_node: Annotated[int, needs_gpus(lambda value: value, "cluster.gpus_per_node")] = Field(
        default=0, ge=0
    )
    num_nodes: Annotated[
        int, Only(1, reason="stages run on one machine; multi-node clusters are not built")
    ] = Field(default=1, ge=1)
    master_port_range_low: Annotated[int, NO_RAY_PORTS] = 25000
    master_port_range_high: Annotated[int, NO_RAY_PORTS] = 28000
    segment_size: Annotated[
        int | None,
        Only(None, reason="NVLink-domain alignment needs a multi-node GPU cluster"),
    ] = None
    placement: Annotated[dict[str, str], Wired("flows.placement:run_placed_stage")] = Field(
        default_factory=dict
    )
    placement_wait_seconds: Annotated[PositiveFloat, Wired("flows.placement:PlacedRun.poll")] = (
        600.0
    )


def check_placed_stages(config: Any, pipeline: "Pipeline") -> None:
    """Refuse a placement of a stage the algorithm does not declare, or on an empty pool
    name, by its dotted key (whether the pool exists is the orchestrator's to say)."""
    names = list(pipeline.stage_names)
    for stage, pool in config.cluster.placement.items():
        if stage not in names:
            raise ConfigError(
                f"cluster.placement.{stage}: {pipeline.name} has no stage {stage!r}; its "
                f"stages are {names}"
            )
        if not pool.strip():
            raise ConfigError(
                f"cluster.placement.{stage}: name a pool of stage workers, not {pool!r}"
            )
