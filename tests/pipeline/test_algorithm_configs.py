"""One entry point, derived from the declarations: ``python -m flows <algorithm>`` knows
every declared algorithm by the torch-free table of their config classes, which must agree
with the declarations (prefect.yaml's side: ``tests/flows/test_deployments.py``)."""

from pathlib import Path

import pytest
from python_forks import PythonForks

from nemo_rl_core.pipeline.algorithm_configs import ALGORITHM_CONFIGS
from nemo_rl_core.pipeline.registry import pipeline_named
from nemo_rl_core.pipeline.spec import registered_pipelines

REPO = Path(__file__).resolve().parents[2]
FLOWS_COMMAND = "import runpy\nrunpy.run_module('flows', run_name='__main__', alter_sys=True)"


def test_every_declared_algorithm_has_its_config_side() -> None:
    pipeline_named("grpo")  # the registry is loaded
    assert sorted(ALGORITHM_CONFIGS) == sorted(registered_pipelines())
    for name, declared in ALGORITHM_CONFIGS.items():
        pipeline = pipeline_named(name)
        assert declared.config_class is pipeline.config_class, name
        assert declared.data_setup is pipeline.data_setup, name


@pytest.mark.parametrize("args", [[], ["--config", "x.yaml"], ["nope"]])
def test_the_entry_point_names_the_algorithms_when_none_is_given(
    args: list[str], python_forks: PythonForks
) -> None:
    """``python -m flows``, in a process of its own (tests/python_forks.py)."""
    done = python_forks.run(FLOWS_COMMAND, args, cwd=REPO)
    assert done.returncode == 2
    assert ", ".join(sorted(ALGORITHM_CONFIGS)) in done.stderr.splitlines()[-1]
