"""Config keys that name a pipeline's stages (``orchestration.stage_timeout_seconds``,
``orchestration.fan_out``, ``cluster.placement``): refused by their dotted key unless the
algorithm declares the stage. The sections themselves (``nemo_rl_core.config``) know no
pipeline; these checks run where the run's pipeline is known.
"""

from typing import Any

from nemo_rl_core.config.orchestration import SECTION
from nemo_rl_core.pipeline.spec import Pipeline
from nemo_rl_core.utils.config import ConfigError


def check_stage_names(config: Any, pipeline: Pipeline) -> None:
    """Refuse a timeout for a stage the algorithm does not declare, and a fan-out of a stage
    whose work does not split, by its dotted key."""
    names = list(pipeline.stage_names)
    for name in config.orchestration.stage_timeout_seconds:
        if name not in names:
            raise ConfigError(
                f"{SECTION}.stage_timeout_seconds.{name}: {pipeline.name} has no stage "
                f"{name!r}; its stages are {names}"
            )
    splittable = [stage.name for stage in pipeline.stages if stage.fan_out is not None]
    for name in config.orchestration.fan_out:
        if name not in splittable:
            raise ConfigError(
                f"{SECTION}.fan_out.{name}: {pipeline.name}'s stage {name!r} does not split "
                f"into shards; stages that do: {splittable}"
            )


def check_placed_stages(config: Any, pipeline: Pipeline) -> None:
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
            raise ConfigError(f"cluster.placement.{stage}: name a Prefect work pool, not {pool!r}")
