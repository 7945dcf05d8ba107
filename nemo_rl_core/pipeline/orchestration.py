"""``orchestration:``, the one config section of ours, not NeMo RL's (it has no
orchestrator): how Prefect runs a run's stages.

It changes when a stage gives up, never what a stage computes, so it is left out of the
config digest that decides whether a stored stage output still holds
(``RunRuntime.config_digest``): a continued run with a new timeout keeps its stages.
"""

from typing import Annotated, Any

from pydantic import Field, PositiveFloat

from nemo_rl_core.algorithms.config import StrictConfig
from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import Wired

SECTION = "orchestration"


class OrchestrationConfig(StrictConfig):
    """``stage_timeout_seconds``: a stage's Prefect ``timeout_seconds`` by stage name (none
    by default). A stage past it fails like any failed stage: the flow run fails, and the
    run continues at that stage when it is run again."""

    stage_timeout_seconds: Annotated[
        dict[str, PositiveFloat], Wired("tasks.stage:stage_task_for")
    ] = Field(default_factory=dict)


def check_stage_names(config: Any, algorithm: str, stage_names: tuple[str, ...]) -> None:
    """Refuse a timeout for a stage the algorithm does not declare, by its dotted key."""
    for name in config.orchestration.stage_timeout_seconds:
        if name not in stage_names:
            raise ConfigError(
                f"{SECTION}.stage_timeout_seconds.{name}: {algorithm} has no stage {name!r}; "
                f"its stages are {list(stage_names)}"
            )
