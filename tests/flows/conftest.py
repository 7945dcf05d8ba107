"""Flow tests run on Prefect's ephemeral API in a throwaway home, like the README's run."""

from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_math_tiny.yaml"


@pytest.fixture(scope="session", autouse=True)
def prefect_harness(prefect_api: None) -> None:
    """Every flow test runs on the session's API (tests/conftest.py)."""


@pytest.fixture(scope="session")
def tiny_config() -> Path:
    return CONFIG
