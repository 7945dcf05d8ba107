"""The code environment shared by the code-sandbox test modules (one pool per module)."""

import pytest

from nemo_rl_core.environments.utils import create_env


@pytest.fixture(scope="module")
def code_env():
    environment = create_env(
        "code",
        {
            "num_workers": 2,
            "wall_time_limit_s": 4,
            "cpu_time_limit_s": 2,
            "memory_limit_mb": 256,
            "output_limit_bytes": 4096,
        },
    )
    yield environment
    environment.shutdown()
