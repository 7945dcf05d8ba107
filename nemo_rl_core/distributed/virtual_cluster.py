"""NeMo RL's ``cluster:`` section. One process per stage here; accepted so configs port."""

from pydantic import BaseModel, ConfigDict, Field


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus_per_node: int = Field(default=0, ge=0)
    num_nodes: int = Field(default=1, ge=1)
