"""``orchestration:``, the one config section of ours, not NeMo RL's (it has no
orchestrator): how Prefect runs a run's stages.

It changes when a stage gives up, never what a stage computes, so it is left out of the
config digest that decides whether a stored stage output still holds
(``RunRuntime.config_digest``): a continued run with a new timeout keeps its stages.
"""

from typing import Annotated

from pydantic import Field, PositiveFloat, PositiveInt

from nemo_rl_core.config.base import StrictConfig
from nemo_rl_core.utils.key_support import Wired

SECTION = "orchestration"


class OrchestrationConfig(StrictConfig):
    """``stage_timeout_seconds``: a stage's Prefect ``timeout_seconds`` by stage name (none
    by default). A stage past it fails like any failed stage: the flow run fails, and the
    run continues at that stage when it is run again.

    ``fan_out``: into how many shards a stage whose work splits by sample (``reward``) is
    cut, each its own concurrent task run; merged, the output is the unsplit one bit for
    bit, and a failed shard is computed alone when the run continues (default: unsplit)."""

    stage_timeout_seconds: Annotated[
        dict[str, PositiveFloat], Wired("tasks.stage:stage_task_for")
    ] = Field(default_factory=dict)
    fan_out: Annotated[dict[str, PositiveInt], Wired("tasks.stage:run_stage_tasks")] = Field(
        default_factory=dict
    )
