"""Flow tests run on Prefect's ephemeral API in a throwaway home, like the README's run."""

from pathlib import Path

import pytest
from prefect.testing.utilities import prefect_test_harness

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_math_tiny.yaml"


@pytest.fixture(scope="session", autouse=True)
def prefect_harness():
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def tiny_config() -> Path:
    return CONFIG
