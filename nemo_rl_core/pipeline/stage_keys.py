"""Config keys that name a pipeline's stages (``orchestration.stage_timeout_seconds``,
``orchestration.fan_out``, ``cluster.placement``): refused by their dotted key unless the
algorithm declares the stage. The sections themselves (``nemo_rl_core.config``) know no
pipeline; these checks run where the run's pipeline is known.
"""

import math
from typing import Any

from nemo_rl_core.config.orchestration import SECTION
from nemo_rl_core.distributed.virtual_cluster import runs_across_ranks, training_world
from nemo_rl_core.pipeline.spec import Pipeline
from nemo_rl_core.utils.config import ConfigError


def check_stage_names(config: Any, pipeline: Pipeline) -> None:
    """Refuse a timeout for a stage the algorithm does not declare, a fan-out of a stage
    whose work does not split or wider than its batch, and a placement of a stage that runs
    on the training stage's ranks, by its dotted key."""
    names = list(pipeline.stage_names)
    for name in config.orchestration.stage_timeout_seconds:
        if name not in names:
            raise ConfigError(
                f"{SECTION}.stage_timeout_seconds.{name}: {pipeline.name} has no stage "
                f"{name!r}; its stages are {names}"
            )
    splittable = {stage.name: stage.fan_out for stage in pipeline.stages if stage.fan_out}
    for name, count in config.orchestration.fan_out.items():
        if name not in splittable:
            raise ConfigError(
                f"{SECTION}.fan_out.{name}: {pipeline.name}'s stage {name!r} does not split "
                f"into shards; stages that do: {sorted(splittable)}"
            )
        widest, why = splittable[name].widest(config)
        if count > widest:
            raise ConfigError(
                f"{SECTION}.fan_out.{name}={count}: wider than the stage's batch, which "
                f"splits into at most {widest} shard(s): {why}"
            )
    _check_stages_on_training_ranks(config, pipeline)


def _check_stages_on_training_ranks(config: Any, pipeline: Pipeline) -> None:
    """A stage that runs on the training ranks beside the training stage (a teacher sharded
    like the student) runs on the training stage's rank group, where
    ``cluster.placement.train`` puts it: a placement of its own is refused."""
    for stage in pipeline.stages:
        beside = not stage.commits and runs_across_ranks(config, stage.spans_ranks(config))
        if beside and stage.name in config.cluster.placement:
            raise ConfigError(
                f"cluster.placement.{stage.name}: stage {stage.name!r} runs on the training "
                f"stage's ranks (cluster.num_nodes x cluster.gpus_per_node = "
                f"{math.prod(training_world(config))}), where cluster.placement.train puts "
                "them; leave it out"
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
            raise ConfigError(
                f"cluster.placement.{stage}: name a pool of stage workers, not {pool!r}"
            )
