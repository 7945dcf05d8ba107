"""The declared algorithms by name, and the one a stored run's config belongs to.

Importing this module imports the declarations (:mod:`~nemo_rl_core.pipeline.algorithms`
registers them), so that a lookup sees them all; the spec itself knows none.
"""

from typing import Any

from nemo_rl_core.pipeline import algorithms  # noqa: F401 - registers the declarations
from nemo_rl_core.pipeline.spec import Pipeline, registered_pipelines


def pipeline_named(name: str) -> Pipeline:
    pipelines = registered_pipelines()
    if name not in pipelines:
        raise KeyError(f"no algorithm {name!r}; known: {sorted(pipelines)}")
    return pipelines[name]


def pipeline_for_config(config: dict[str, Any]) -> Pipeline:
    """The algorithm a (stored) config belongs to: the one whose section it holds."""
    pipelines = registered_pipelines()
    found = [p for name, p in pipelines.items() if name in config]
    if len(found) != 1:
        sections = sorted(pipelines)
        raise ValueError(
            f"a run config must hold exactly one algorithm section of {sections}; "
            f"found {[p.name for p in found]}"
        )
    return found[0]
